// Model checkpoints: model.safetensors holds the parameters and, in __metadata__, everything
// needed to rebuild the model (SPEC 11: H_q, H_kv, d_h, layer count, layout), the task and
// the vocabulary. Loading validates the metadata and every shape against the configuration.
#pragma once

#include <memory>
#include <string>

#include <xgrad/nn/safetensors.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/train/tasks.hpp>

namespace xg::train {

struct ModelInfo {
  std::string kind;  // "gpt" or "encoder_decoder"
  std::string task;  // "sort", "reverse", "charlm"
  nn::TransformerConfig config;
  Vocabulary vocab;
  nn::safetensors::Metadata task_params;  // e.g. n_digits, min_len, max_len
};

// Checked conversions of text read from files (metadata, log.csv): the whole text must be the
// number, in range; otherwise FormatError "<where>: '<text>' is not ...".
std::int64_t parse_int(const std::string& text, const std::string& where);
std::uint64_t parse_uint(const std::string& text, const std::string& where);
double parse_double(const std::string& text, const std::string& where);  // finite values only

// Number of parameters of the model `kind` ("gpt" / "encoder_decoder") with this resolved
// configuration, computed without building it (saturates at UINT64_MAX).
std::uint64_t parameter_count(const std::string& kind, const nn::TransformerConfig& resolved);

nn::safetensors::Metadata model_metadata(const ModelInfo& info);
ModelInfo model_info(const nn::safetensors::Metadata& meta, const std::string& path);  // FormatError if incomplete

struct LoadedModel {
  ModelInfo info;
  std::unique_ptr<nn::GPT> gpt;
  std::unique_ptr<nn::EncoderDecoder> encdec;
  nn::Module& module() { return gpt ? static_cast<nn::Module&>(*gpt) : static_cast<nn::Module&>(*encdec); }
};

// Builds the model the metadata describes and loads the parameters into it. Before anything is
// allocated, the configuration must be within sane bounds and describe exactly as many
// parameters as the file holds; every parameter must be finite.
LoadedModel load_model(const std::string& path);

}  // namespace xg::train
