/// \file
/// Model checkpoints: model.safetensors holds the parameters and, in __metadata__, everything
/// needed to rebuild the model (SPEC 11: H_q, H_kv, d_h, layer count, layout), the task and
/// the vocabulary. Loading validates the metadata and every shape against the configuration.
#pragma once

#include <memory>
#include <string>

#include <xgrad/io/safetensors.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/train/model_schema.hpp>
#include <xgrad/train/tasks.hpp>

/// The training program behind `xgrad train/generate/convert`: built-in tasks, the training
/// loop, checkpoints, generation, weight conversion and plots.
namespace xg::train {

/// What a checkpoint's metadata says about its model: enough to rebuild it and its task.
struct ModelInfo {
  ModelKind kind = ModelKind::gpt;  ///< The model family (metadata "model": "gpt" or "encoder_decoder").
  std::string task;  ///< "sort", "reverse", "charlm".
  nn::TransformerConfig config;  ///< The model's configuration (resolved when read by model_info).
  text::Vocabulary vocab;  ///< The task's vocabulary: token ids of the model's inputs and outputs.
  /// The task's and importer's data (train/model_schema.hpp's carried rows): the sort task's sizes,
  /// the reverse lengths, the tokenizer (kind, digest, file), llama2.c's format and RoPE tables.
  io::safetensors::Metadata task_params;
  /// `task` as an enum: imported for a word that is no task of xgrad train.
  TaskKind task_kind() const { return train::task_kind(task); }
};

/// Number of parameters of the model `kind` with this resolved configuration, computed without
/// building it (saturates at UINT64_MAX).
std::uint64_t parameter_count(ModelKind kind, const nn::TransformerConfig& resolved);

/// The safetensors metadata that describes `info`: the task's parameters plus the format,
/// model kind, task, vocabulary, weight layout, the resolved configuration (sizes, heads,
/// dtype) and, when they are not the defaults, the window and position scheme.
io::safetensors::Metadata model_metadata(const ModelInfo& info);
/// The ModelInfo that checkpoint metadata `meta` describes, checked: a missing key, a value
/// that is not a number or exceeds a sane bound, or a configuration that does not hold
/// together is a FormatError naming `path` and the key.
ModelInfo model_info(const io::safetensors::Metadata& meta, const std::string& path);

/// A model rebuilt from a checkpoint: exactly one of gpt and encdec is set, as info.kind says.
struct LoadedModel {
  ModelInfo info;  ///< What the checkpoint's metadata says.
  std::unique_ptr<nn::GPT> gpt;  ///< The model when info.kind is ModelKind::gpt, else null.
  std::unique_ptr<nn::EncoderDecoder> encdec;  ///< The model when info.kind is ModelKind::encoder_decoder, else null.
  /// Whichever model is loaded, as a Module (its parameters, train/eval mode).
  nn::Module& module() { return gpt ? static_cast<nn::Module&>(*gpt) : static_cast<nn::Module&>(*encdec); }
};

/// Builds the model the metadata describes and loads the parameters into it. Before anything is
/// allocated, the configuration must be within sane bounds and describe exactly as many
/// parameters as the file holds; every parameter must be finite. The model is returned in
/// eval mode. FormatError (naming the file) when the checkpoint is not such a model.
LoadedModel load_model(const std::string& path);

}  // namespace xg::train
