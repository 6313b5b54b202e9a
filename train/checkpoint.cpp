#include "train/checkpoint.hpp"

#include "core/error.hpp"

namespace xg::train {

namespace {

std::size_t get_size(const nn::safetensors::Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw FormatError("[checkpoint] " + path + ": metadata lacks '" + key + "'");
  try {
    std::size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used != it->second.size() || v < 0) throw std::invalid_argument("");
    return static_cast<std::size_t>(v);
  } catch (const std::exception&) {
    throw FormatError("[checkpoint] " + path + ": metadata '" + key + "' = '" + it->second +
                      "' is not a non-negative integer");
  }
}

std::string get(const nn::safetensors::Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw FormatError("[checkpoint] " + path + ": metadata lacks '" + key + "'");
  return it->second;
}

}  // namespace

nn::safetensors::Metadata model_metadata(const ModelInfo& info) {
  const nn::TransformerConfig c = info.config.resolved();
  nn::safetensors::Metadata m = info.task_params;
  m["format"] = "xgrad-1";
  m["model"] = info.kind;
  m["task"] = info.task;
  m["vocabulary"] = info.vocab.to_json();
  m["layout"] = "in_x_out";  // y = x W + b; PyTorch's Linear is out_x_in
  m["V_vocab"] = std::to_string(c.V_vocab);
  m["context"] = std::to_string(c.context);
  m["d_model"] = std::to_string(c.d_model);
  m["H_q"] = std::to_string(c.H_q);
  m["H_kv"] = std::to_string(c.H_kv);
  m["d_h"] = std::to_string(c.d_model / c.H_q);
  m["layers"] = std::to_string(c.layers);
  m["encoder_layers"] = std::to_string(info.kind == "encoder_decoder" ? c.encoder_layers : 0);
  m["d_ff"] = std::to_string(c.d_ff);
  m["dtype"] = dtype_name(c.dtype);
  return m;
}

ModelInfo model_info(const nn::safetensors::Metadata& m, const std::string& path) {
  ModelInfo info;
  info.kind = get(m, "model", path);
  if (info.kind != "gpt" && info.kind != "encoder_decoder")
    throw FormatError("[checkpoint] " + path + ": unknown model kind '" + info.kind + "'");
  if (get(m, "layout", path) != "in_x_out")
    throw FormatError("[checkpoint] " + path + ": unsupported weight layout '" + get(m, "layout", path) + "'");
  info.task = get(m, "task", path);
  info.vocab = Vocabulary::from_json(get(m, "vocabulary", path));
  nn::TransformerConfig& c = info.config;
  c.V_vocab = get_size(m, "V_vocab", path);
  c.context = get_size(m, "context", path);
  c.d_model = get_size(m, "d_model", path);
  c.H_q = get_size(m, "H_q", path);
  c.H_kv = get_size(m, "H_kv", path);
  c.layers = get_size(m, "layers", path);
  c.encoder_layers = get_size(m, "encoder_layers", path);
  c.d_ff = get_size(m, "d_ff", path);
  const std::string dt = get(m, "dtype", path);
  if (dt != "float32" && dt != "float64") throw FormatError("[checkpoint] " + path + ": unknown dtype '" + dt + "'");
  c.dtype = dt == "float32" ? DType::float32 : DType::float64;
  if (c.V_vocab != info.vocab.size())
    throw FormatError("[checkpoint] " + path + ": V_vocab " + std::to_string(c.V_vocab) + " but the vocabulary has " +
                      std::to_string(info.vocab.size()) + " tokens");
  if (c.H_q == 0 || get_size(m, "d_h", path) * c.H_q != c.d_model)
    throw FormatError("[checkpoint] " + path + ": d_h * H_q must equal d_model");
  for (const char* k : {"n_digits", "n_values", "min_len", "max_len"})
    if (m.count(k)) info.task_params[k] = m.at(k);
  try {
    c = c.resolved();
  } catch (const Error& e) {
    throw FormatError("[checkpoint] " + path + ": invalid configuration: " + e.what());
  }
  return info;
}

LoadedModel load_model(const std::string& path) {
  const nn::safetensors::File f = nn::safetensors::load(path);
  LoadedModel lm;
  lm.info = model_info(f.metadata, path);
  Generator gen(0);  // initial values are overwritten by the file
  if (lm.info.kind == "gpt")
    lm.gpt = std::make_unique<nn::GPT>(lm.info.config, gen);
  else
    lm.encdec = std::make_unique<nn::EncoderDecoder>(lm.info.config, gen);
  nn::safetensors::load_module(path, lm.module());
  lm.module().eval();
  return lm;
}

}  // namespace xg::train
