#include <xgrad/train/checkpoint.hpp>
#include <xgrad/io/number.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include <xgrad/core/error.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/adapters.hpp>
#include <xgrad/text/corpus.hpp>

namespace xg::train {

namespace {

// Sane bounds for a checkpoint's configuration (far above anything this trainer makes);
// checked before anything is allocated.
std::size_t get_size(const io::safetensors::Metadata& m, const std::string& key, const std::string& path,
                     std::size_t max) {
  auto it = m.find(key);
  if (it == m.end()) throw FormatError("[checkpoint] " + path + ": metadata lacks '" + key + "'");
  const std::uint64_t v = io::parse_uint(it->second, "[checkpoint] " + path + ": metadata '" + key + "'");
  if (v > max)
    throw FormatError("[checkpoint] " + path + ": metadata '" + key + "' = " + it->second + " exceeds the limit " +
                      std::to_string(max));
  return static_cast<std::size_t>(v);
}

std::string get(const io::safetensors::Metadata& m, const std::string& key, const std::string& path) {
  auto it = m.find(key);
  if (it == m.end()) throw FormatError("[checkpoint] " + path + ": metadata lacks '" + key + "'");
  return it->second;
}

// The tokens a task's vocabulary must hold, in id order, when the task fixes them.
std::vector<std::string> fixed_tokens(const ModelInfo& info, const io::safetensors::Metadata& m,
                                      const std::string& path) {
  std::vector<std::string> want;
  if (info.task == "sort" && m.count("n_values")) {  // every sort model xgrad train writes says n_values
    const std::string nv = m.at("n_values");
    const std::uint64_t n = io::parse_uint(nv, "[checkpoint] " + path + ": metadata 'n_values'");
    if (n > 1000) throw FormatError("[checkpoint] " + path + ": metadata 'n_values' = " + shown_value(nv) + " exceeds 1000");
    for (std::uint64_t v = 0; v < n; ++v) want.push_back(std::to_string(v));
    want.push_back("|");
  } else if (info.task == "reverse") {
    for (int v = 0; v < 10; ++v) want.push_back(std::to_string(v));
    want.insert(want.end(), {"_", "<", ">"});
  } else if (info.task == "llama2c") {
    for (std::size_t i = 0; i < info.vocab.size(); ++i) want.push_back("<" + std::to_string(i) + ">");
  }
  return want;
}

std::string token_text(const std::string& t) { return "'" + shown_value(t, 24) + "' (" + std::to_string(t.size()) + " bytes)"; }

// The stored vocabulary against what made it: a task's fixed tokens, a tokenizer's pieces
// (bytes: the 256 bytes in order; sentencepiece, llama2c: each id's decoded text of the
// embedded model, whose digest text::tokenizer_of_metadata checks), charlm's sorted distinct bytes.
// A swapped or edited entry would make every later step read and write other text.
void check_vocabulary(const ModelInfo& info, const io::safetensors::Metadata& m, const std::string& path) {
  const std::vector<std::string>& have = info.vocab.tokens;
  std::vector<std::string> want;
  std::string source;
  if (m.count("tokenizer")) {
    const std::string kind = m.at("tokenizer");
    if (kind == "sentencepiece" && !text::sentencepiece_available()) return;  // cannot be rebuilt here; generate says so
    const std::unique_ptr<text::Tokenizer> tok = text::tokenizer_of_metadata(m, path);
    if (tok->vocab_size() != have.size())
      throw FormatError("[checkpoint] " + path + ": the model's vocabulary has " + std::to_string(have.size()) +
                        " tokens, its tokenizer (" + tok->description() + ") has " +
                        std::to_string(tok->vocab_size()) + " ids: they must be the same size");
    for (std::size_t id = 0; id < have.size(); ++id) want.push_back(tok->decode({static_cast<std::int64_t>(id)}));
    source = "its " + kind + " tokenizer (sha256 " + tok->digest().substr(0, 16) + ")";
  } else if (info.task == "charlm") {
    for (std::size_t i = 0; i < have.size(); ++i)
      if (have[i].size() != 1 || (i > 0 && static_cast<unsigned char>(have[i - 1][0]) >= static_cast<unsigned char>(have[i][0])))
        throw FormatError("[checkpoint] " + path + ": vocabulary entry " + std::to_string(i) + " is " +
                          token_text(have[i]) + "; a charlm vocabulary is distinct single bytes in increasing order");
    return;
  } else {
    want = fixed_tokens(info, m, path);
    if (want.empty()) return;  // a task this version does not know is refused by whoever runs it
    source = "the " + info.task + " task";
  }
  if (want.size() != have.size())
    throw FormatError("[checkpoint] " + path + ": the vocabulary has " + std::to_string(have.size()) + " tokens, " +
                      source + " has " + std::to_string(want.size()));
  for (std::size_t i = 0; i < have.size(); ++i)
    if (have[i] != want[i])
      throw FormatError("[checkpoint] " + path + ": vocabulary entry " + std::to_string(i) + " is " + token_text(have[i]) +
                        ", " + source + " has " + token_text(want[i]) + " there (a damaged or edited vocabulary)");
}

}  // namespace

std::uint64_t parameter_count(const std::string& kind, const nn::TransformerConfig& c) {
  // In long double: exact for every count that fits (< 2^64), saturating above.
  using R = long double;
  const R d = c.d_model, f = c.d_ff, d_h = c.H_q ? R(c.d_model / c.H_q) : 0, q = c.H_q * d_h, kv = c.H_kv * d_h;
  const R ln = 2 * d, ffn = d * f + f + f * d + d;
  const R self = d * (q + 2 * kv) + (q + 2 * kv) + q * d + d;   // W_QKV, b_QKV, W_O, b_O
  const R cross = d * q + q + d * 2 * kv + 2 * kv + q * d + d;  // W_Q, b_Q, W_KV, b_KV, W_O, b_O
  // A GPT without learned position embeddings has no `pos` table.
  const bool pos_table = kind != "gpt" || c.pos == nn::PositionScheme::learned;
  const R embed = R(c.V_vocab) * d + (pos_table ? R(c.context) * d : R(0));
  R n = 0;
  if (kind == "gpt" && c.arch == nn::Architecture::llama) {
    // tok, per layer attn_norm, W_QKV, W_O, ffn_norm, gate, up, down (no biases), norm, classifier.
    const R layer = d + d * (q + 2 * kv) + q * d + d + 3 * d * f;
    n = R(c.V_vocab) * d + R(c.layers) * layer + d + (c.tie_embeddings ? R(0) : R(c.V_vocab) * d);
  } else if (kind == "gpt")
    n = embed + R(c.layers) * (2 * ln + self + ffn) + ln;
  else
    n = embed + R(c.encoder_layers) * (2 * ln + self + ffn) + ln + R(c.layers) * (3 * ln + self + cross + ffn) + ln;
  return n >= R(std::numeric_limits<std::uint64_t>::max()) ? std::numeric_limits<std::uint64_t>::max()
                                                            : static_cast<std::uint64_t>(n);
}

io::safetensors::Metadata model_metadata(const ModelInfo& info) {
  const nn::TransformerConfig c = info.config.resolved();
  io::safetensors::Metadata m = info.task_params;
  // GPT-2 blocks are the default and write no key (those checkpoints keep their bytes); a
  // Llama model names its architecture and the sizes only it has.
  if (c.arch == nn::Architecture::llama) {
    m["arch"] = nn::architecture_name(c.arch);
    m["multiple_of"] = std::to_string(c.multiple_of);
    m["norm_eps"] = io::exact_text(c.norm_eps);
    m["tie_embeddings"] = c.tie_embeddings ? "true" : "false";
  }
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
  if (c.window > 0) m["window"] = std::to_string(c.window);  // absent: no sliding window
  // Learned positions are the default and write no key: those checkpoints stay byte for byte
  // what they were before the key existed.
  if (c.pos != nn::PositionScheme::learned) m["pos"] = nn::position_scheme_name(c.pos);
  if (c.pos == nn::PositionScheme::rope) {
    m["rope_base"] = io::exact_text(c.rope.base);
    m["rope_fraction"] = io::exact_text(c.rope.fraction);
    m["rope_layout"] = ops::rope_layout_name(c.rope.layout);
  }
  return m;
}

ModelInfo model_info(const io::safetensors::Metadata& m, const std::string& path) {
  ModelInfo info;
  info.kind = get(m, "model", path);
  if (info.kind != "gpt" && info.kind != "encoder_decoder")
    throw FormatError("[checkpoint] " + path + ": unknown model kind '" + info.kind + "'");
  if (get(m, "layout", path) != "in_x_out")
    throw FormatError("[checkpoint] " + path + ": unsupported weight layout '" + get(m, "layout", path) + "'");
  info.task = get(m, "task", path);
  info.vocab = text::Vocabulary::from_json(get(m, "vocabulary", path));
  nn::TransformerConfig& c = info.config;
  c.V_vocab = get_size(m, "V_vocab", path, 1u << 20);
  c.context = get_size(m, "context", path, 1u << 16);
  c.d_model = get_size(m, "d_model", path, 1u << 14);
  c.H_q = get_size(m, "H_q", path, 1u << 14);
  c.H_kv = get_size(m, "H_kv", path, 1u << 14);
  c.layers = get_size(m, "layers", path, 1024);
  c.encoder_layers = get_size(m, "encoder_layers", path, 1024);
  c.d_ff = get_size(m, "d_ff", path, 1u << 18);
  c.window = m.count("window") ? get_size(m, "window", path, 1u << 16) : 0;  // absent: no window
  if (m.count("window") && c.window == 0)
    throw FormatError("[checkpoint] " + path + ": metadata 'window' = 0; leave the key out for no window");
  const std::string dt = get(m, "dtype", path);
  if (dt != "float32" && dt != "float64") throw FormatError("[checkpoint] " + path + ": unknown dtype '" + dt + "'");
  c.dtype = dt == "float32" ? DType::float32 : DType::float64;
  if (c.V_vocab != info.vocab.size())
    throw FormatError("[checkpoint] " + path + ": V_vocab " + std::to_string(c.V_vocab) + " but the vocabulary has " +
                      std::to_string(info.vocab.size()) + " tokens");
  if (c.H_q == 0 || get_size(m, "d_h", path, 1u << 14) * c.H_q != c.d_model)
    throw FormatError("[checkpoint] " + path + ": d_h * H_q must equal d_model");
  // Architecture; checkpoints written before it existed are GPT-2 models.
  if (m.count("arch")) {
    const std::string a = m.at("arch");
    try {
      c.arch = nn::architecture_from_name(a);
    } catch (const ValueError&) {
      throw FormatError("[checkpoint] " + path + ": metadata 'arch' = '" + a + "' is not gpt or llama");
    }
    if (info.kind != "gpt") throw FormatError("[checkpoint] " + path + ": metadata 'arch' is for GPT models only");
    c.multiple_of = get_size(m, "multiple_of", path, 1u << 16);
    c.norm_eps = io::parse_double(get(m, "norm_eps", path), "[checkpoint] " + path + ": metadata 'norm_eps'");
    const std::string tie = get(m, "tie_embeddings", path);
    if (tie != "true" && tie != "false")
      throw FormatError("[checkpoint] " + path + ": metadata 'tie_embeddings' = '" + tie + "' is not true or false");
    c.tie_embeddings = tie == "true";
  }
  // Position scheme; checkpoints written before it existed have learned embeddings.
  if (m.count("pos")) {
    const std::string p = m.at("pos");
    try {
      c.pos = nn::position_scheme_from_name(p);
    } catch (const ValueError&) {
      throw FormatError("[checkpoint] " + path + ": metadata 'pos' = '" + p + "' is not learned, rope, alibi or none");
    }
  }
  if (c.pos != nn::PositionScheme::learned && info.kind != "gpt")
    throw FormatError("[checkpoint] " + path + ": metadata 'pos' = '" + nn::position_scheme_name(c.pos) +
                      "' but an encoder_decoder has learned position embeddings only");
  if (c.pos == nn::PositionScheme::rope) {
    c.rope.base = io::parse_double(get(m, "rope_base", path), "[checkpoint] " + path + ": metadata 'rope_base'");
    c.rope.fraction = io::parse_double(get(m, "rope_fraction", path), "[checkpoint] " + path + ": metadata 'rope_fraction'");
    const std::string layout = get(m, "rope_layout", path);
    try {
      c.rope.layout = ops::rope_layout_from_name(layout);
    } catch (const ValueError&) {
      throw FormatError("[checkpoint] " + path + ": metadata 'rope_layout' = '" + layout +
                        "' is not interleaved or half-split");
    }
  }
  for (const char* k : {"n_digits", "n_values", "min_len", "max_len"})
    if (m.count(k)) info.task_params[k] = m.at(k);
  try {
    c = c.resolved();
  } catch (const Error& e) {
    throw FormatError("[checkpoint] " + path + ": invalid configuration: " + e.what());
  }
  check_vocabulary(info, m, path);
  return info;
}

LoadedModel load_model(const std::string& path) {
  const io::safetensors::File f = io::safetensors::load(path);
  LoadedModel lm;
  lm.info = model_info(f.metadata, path);
  // The configuration must describe exactly the parameters in the file before anything is
  // built: a metadata value cannot make the program allocate more than the file holds.
  std::uint64_t in_file = 0;
  for (const auto& named : f.tensors) in_file += named.second.size();
  // Adapters (train/adapters.hpp): their tensors are in the file beside the base weights.
  const std::uint64_t expected = parameter_count(lm.info.kind, lm.info.config) +
                                 adapter_parameter_count(f.metadata, lm.info.config, path);
  if (expected != in_file)
    throw FormatError("[checkpoint] " + path + ": the metadata describes a model of " + std::to_string(expected) +
                      " parameters, the file holds " + std::to_string(in_file));
  Generator gen(0);  // initial values are overwritten by the file
  if (lm.info.kind == "gpt")
    lm.gpt = std::make_unique<nn::GPT>(lm.info.config, gen);
  if (lm.gpt) add_saved_adapters(f.metadata, *lm.gpt, path);
  else
    lm.encdec = std::make_unique<nn::EncoderDecoder>(lm.info.config, gen);
  nn::safetensors::load_module(path, lm.module());
  lm.module().eval();
  return lm;
}

}  // namespace xg::train
