// Model checkpoints: model.safetensors holds the parameters and, in __metadata__, everything
// needed to rebuild the model (SPEC 11: H_q, H_kv, d_h, layer count, layout), the task and
// the vocabulary. Loading validates the metadata and every shape against the configuration.
#pragma once

#include <memory>
#include <string>

#include "nn/safetensors.hpp"
#include "nn/transformer.hpp"
#include "train/tasks.hpp"

namespace xg::train {

struct ModelInfo {
  std::string kind;  // "gpt" or "encoder_decoder"
  std::string task;  // "sort", "reverse", "charlm"
  nn::TransformerConfig config;
  Vocabulary vocab;
  nn::safetensors::Metadata task_params;  // e.g. n_digits, min_len, max_len
};

nn::safetensors::Metadata model_metadata(const ModelInfo& info);
ModelInfo model_info(const nn::safetensors::Metadata& meta, const std::string& path);  // FormatError if incomplete

struct LoadedModel {
  ModelInfo info;
  std::unique_ptr<nn::GPT> gpt;
  std::unique_ptr<nn::EncoderDecoder> encdec;
  nn::Module& module() { return gpt ? static_cast<nn::Module&>(*gpt) : static_cast<nn::Module&>(*encdec); }
};

// Builds the model the metadata describes and loads the parameters into it.
LoadedModel load_model(const std::string& path);

}  // namespace xg::train
