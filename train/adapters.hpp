/// \file
/// LoRA adapters and frozen weights in training runs (`xgrad train --lora-rank R --lora-alpha A
/// --lora-targets T --freeze REGEX`, `xgrad merge`). The layer itself is nn::LoRA
/// (nn/lora.hpp); this file connects it to the run's options and to checkpoints: an adapted
/// model.safetensors holds the base weights, the adapters' `*.lora_A` / `*.lora_B` tensors and
/// the metadata keys lora.rank, lora.alpha, lora.targets, from which load_model re-adds the
/// adapters before it loads the tensors.
#pragma once

#include <cstdint>
#include <set>
#include <string>

#include <xgrad/core/random.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/nn/module.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/train/options.hpp>

namespace xg::train {

/// A new run's LoRA and --freeze options against the flags `given` on the command line:
/// --lora-rank 0 given, or --lora-alpha / --lora-targets given or set (e.g. by --config)
/// without a rank, is a UsageError; so is a --lora-targets
/// list that names no layer of the run's architecture, a --freeze that is not a regular
/// expression, or an --init-from model that has adapters (merge it first).
void check_adapter_options(const TrainOptions& o, const std::set<std::string>& given);

/// What apply_adapters() did.
struct AdapterSummary {
  std::size_t adapters = 0;       ///< LoRA adapters attached.
  std::size_t frozen = 0;         ///< Parameter tensors frozen.
  std::size_t trainable_scalars = 0;  ///< Scalars (parameter elements) that train.
  std::size_t total_scalars = 0;      ///< Scalars in all.
};

/// After the run's model is built (and loaded from --init-from): attaches the LoRA adapters of
/// `o` (A drawn from `gen`; every base weight frozen) and freezes the parameters --freeze
/// matches. UsageError (nothing changed then) for a rank that does not fit a projection, a
/// model that cannot hold adapters (the encoder-decoder), a --freeze that matches no
/// parameter, or one that leaves nothing to train.
AdapterSummary apply_adapters(nn::Module& model, const TrainOptions& o, Generator& gen);

/// "LoRA rank 8 (alpha 16) on q,k,v,o,gate,up,down: 42 adapters; 262656 of 6.6M parameters
/// trainable (4.0%)": the line the trainer prints; "" when nothing is adapted or frozen.
std::string describe_adapters(const AdapterSummary& s, const TrainOptions& o);

/// The checkpoint metadata of `model`'s adapters and frozen weights: lora.rank, lora.alpha,
/// lora.targets when it has adapters, `frozen` (the count of frozen scalars) when some are
/// frozen; empty for a plain model.
io::safetensors::Metadata adapter_metadata(const nn::Module& model);

/// Whether checkpoint metadata `meta` describes adapters (has lora.rank).
bool has_adapters(const io::safetensors::Metadata& meta);

/// The parameters the adapters described by `meta` add to a model of configuration `c`
/// (resolved), computed without building it; 0 without adapters. FormatError naming `path`
/// and the key for a value that is not a rank, an alpha or a target list of the model.
std::uint64_t adapter_parameter_count(const io::safetensors::Metadata& meta, const nn::TransformerConfig& c,
                                      const std::string& path);

/// Re-adds the adapters `meta` describes to `model` (its base parameters left trainable), so
/// that the checkpoint's tensors can be loaded into it. Nothing without adapters.
void add_saved_adapters(const io::safetensors::Metadata& meta, nn::GPT& model, const std::string& path);

/// --resume of a run with frozen parameters: train_state.safetensors holds only the trainable
/// ones, so rank 0 reads the frozen ones from the run's model.safetensors (`model_path`).
/// FormatError naming the file and tensor for one that is missing, of another shape or not
/// finite.
void load_frozen_parameters(nn::Module& model, const std::string& model_path);

/// The frozen scalars checkpoint metadata `meta` records (key `frozen`; 0 without it), checked
/// against the model's `total`: FormatError naming `path` for a value that is not a count in
/// [0, total].
std::uint64_t frozen_parameter_count(const io::safetensors::Metadata& meta, std::uint64_t total,
                                     const std::string& path);

/// Metadata `meta` without the keys adapter_metadata() writes: what a merged model saves.
io::safetensors::Metadata without_adapter_metadata(io::safetensors::Metadata meta);

}  // namespace xg::train
