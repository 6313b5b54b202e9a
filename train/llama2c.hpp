/// \file
/// llama2.c models in and out of xgrad's Llama model: the configuration a file's sizes give,
/// the checks that a model is one run.c computes, and `xgrad import llama2c` / `xgrad export
/// llama2c`. The file format (legacy, version 1 and 2; docs/llama.md) is io/llama2c.hpp's.
#pragma once

#include <string>

#include <xgrad/io/llama2c.hpp>
#include <xgrad/nn/transformer.hpp>

/// llama2.c models: import, export and the configuration of a file.
namespace xg::train::llama2c {

/// A llama2.c file in xgrad's terms: its contents and the model configuration they give.
struct Model : io::llama2c::File {
  nn::TransformerConfig config;  ///< arch llama, rope interleaved base 10000, eps 1e-5, float32; resolved.
};

/// The configuration of a Llama model of these sizes, as run.c computes it: RoPE interleaved
/// over the whole head with base 10000, RMSNorm eps 1e-5, float32; resolved (FormatError naming
/// `path` when xgrad cannot build it).
nn::TransformerConfig config_of(const io::llama2c::Sizes& sizes, const std::string& path);
/// The sizes of a Llama model's configuration, for writing a file.
io::llama2c::Sizes sizes_of(const nn::TransformerConfig& config);

/// io::llama2c::read and the configuration of the file's sizes.
Model read(const std::string& path);

/// ValueError naming the setting when `config` is not a model llama2.c's run.c computes
/// exactly: arch llama, RoPE interleaved over the whole head with base 10000, norm eps 1e-5,
/// no sliding window, an even head size, no registered layer (nn/layer_registry.hpp). `what`
/// names the model in the message.
void check_exportable(const nn::TransformerConfig& config, const std::string& what);

/// `xgrad import llama2c`: reads `bin` and writes an xgrad checkpoint to `out` (atomically):
/// the model, task "llama2c", a vocabulary of V_vocab placeholder tokens "<id>" and no
/// tokenizer, and the metadata keys "llama2c_format" and, for a legacy file whose RoPE
/// tables differ from io::llama2c::rope_tables(), "llama2c_tables" ("index:hex,...": the
/// float32 bits at those indices of the tables).
void import_file(const std::string& bin, const std::string& out);

/// `xgrad export llama2c`: writes the legacy file of the checkpoint `in` to `bin` (atomically).
/// The RoPE tables are io::llama2c::rope_tables() with the checkpoint's recorded exceptions, so
/// a legacy file imported and exported comes back byte for byte. ValueError for a checkpoint
/// that is not a Llama model llama2.c can run; FormatError when writing fails.
void export_file(const std::string& in, const std::string& bin);

}  // namespace xg::train::llama2c
