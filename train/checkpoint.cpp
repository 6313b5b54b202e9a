#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/model_schema.hpp>
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

// The tokens a task's vocabulary must hold, in id order, when the task fixes them.
std::vector<std::string> fixed_tokens(const ModelInfo& info, const io::safetensors::Metadata& m,
                                      const std::string& path) {
  std::vector<std::string> want;
  const TaskKind task = info.task_kind();
  if (task == TaskKind::sort && m.count("n_values")) {  // every sort model xgrad train writes says n_values
    const std::string nv = m.at("n_values");
    const std::uint64_t n = io::parse_uint(nv, "[checkpoint] " + path + ": metadata 'n_values'");
    if (n > 1000) throw FormatError("[checkpoint] " + path + ": metadata 'n_values' = " + shown_value(nv) + " exceeds 1000");
    for (std::uint64_t v = 0; v < n; ++v) want.push_back(std::to_string(v));
    want.push_back("|");
  } else if (task == TaskKind::reverse) {
    for (int v = 0; v < 10; ++v) want.push_back(std::to_string(v));
    want.insert(want.end(), {"_", "<", ">"});
  } else if (info.task == "llama2c") {  // xgrad import llama2c's placeholders
    for (std::size_t i = 0; i < info.vocab.size(); ++i) want.push_back(text::placeholder_token(i));
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
    // The tokenizer may have fewer ids than the model: the rest are placeholders, never sampled.
    if (tok->vocab_size() > have.size())
      throw FormatError("[checkpoint] " + path + ": the model's vocabulary has " + std::to_string(have.size()) +
                        " tokens, its tokenizer (" + tok->description() + ") has " +
                        std::to_string(tok->vocab_size()) + " ids: more than the model's");
    for (std::size_t id = 0; id < have.size(); ++id)
      want.push_back(id < tok->vocab_size() ? tok->decode({static_cast<std::int64_t>(id)}) : text::placeholder_token(id));
    source = "its " + kind + " tokenizer (sha256 " + tok->digest().substr(0, 16) + ")";
  } else if (info.task_kind() == TaskKind::charlm) {
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

std::uint64_t parameter_count(ModelKind kind, const nn::TransformerConfig& c) {
  // In long double: exact for every count that fits (< 2^64), saturating above.
  using R = long double;
  const R d = c.d_model, f = c.d_ff, d_h = c.H_q ? R(c.d_model / c.H_q) : 0, q = c.H_q * d_h, kv = c.H_kv * d_h;
  const R b = c.bias ? 1 : 0;  // GPT-2 blocks without biases: W and gamma only
  const R ln = d + b * d, ffn = d * f + b * f + f * d + b * d;
  const R self = d * (q + 2 * kv) + b * (q + 2 * kv) + q * d + b * d;  // W_QKV, b_QKV, W_O, b_O
  const R cross = d * q + q + d * 2 * kv + 2 * kv + q * d + d;  // W_Q, b_Q, W_KV, b_KV, W_O, b_O
  // A GPT without learned position embeddings has no `pos` table.
  const bool pos_table = kind != ModelKind::gpt || c.pos == nn::PositionScheme::learned;
  const R embed = R(c.V_vocab) * d + (pos_table ? R(c.context) * d : R(0));
  R n = 0;
  if (kind == ModelKind::gpt && c.arch == nn::Architecture::llama) {
    // tok, per layer attn_norm, W_QKV, W_O, ffn_norm, gate, up, down (no biases), norm, classifier.
    const R layer = d + d * (q + 2 * kv) + q * d + d + 3 * d * f;
    n = R(c.V_vocab) * d + R(c.layers) * layer + d + (c.tie_embeddings ? R(0) : R(c.V_vocab) * d);
  } else if (kind == ModelKind::gpt)
    n = embed + R(c.layers) * (2 * ln + self + ffn) + ln;
  else
    n = embed + R(c.encoder_layers) * (2 * ln + self + ffn) + ln + R(c.layers) * (3 * ln + self + cross + ffn) + ln;
  return n >= R(std::numeric_limits<std::uint64_t>::max()) ? std::numeric_limits<std::uint64_t>::max()
                                                            : static_cast<std::uint64_t>(n);
}

io::safetensors::Metadata model_metadata(const ModelInfo& info) {
  ModelInfo resolved = info;
  resolved.config = info.config.resolved();
  io::safetensors::Metadata m;
  for (const ModelField& f : model_schema()) {
    if (f.presence == ModelField::Presence::carried) {
      const auto it = info.task_params.find(f.key);
      if (it != info.task_params.end()) m[f.key] = it->second;
    } else if (f.presence == ModelField::Presence::always || f.written(resolved)) {
      m[f.key] = f.get(resolved);
    }
  }
  return m;
}

ModelInfo model_info(const io::safetensors::Metadata& m, const std::string& path) {
  ModelInfo info;
  const std::string at = "[checkpoint] " + path + ": ";
  // Row by row, in the schema's order: a `with` row is required when the rows before it say so
  // (RoPE's keys beside pos rope); an `unless_default` row's absence means its default.
  for (const ModelField& f : model_schema()) {
    const auto it = m.find(f.key);
    if (f.presence == ModelField::Presence::carried) {
      if (it != m.end()) info.task_params[f.key] = it->second;
      continue;
    }
    if (!f.set) continue;  // written, not read (format)
    if (it == m.end()) {
      if (f.presence == ModelField::Presence::always ||
          (f.presence == ModelField::Presence::with && f.written(info)))
        throw FormatError(at + "metadata lacks '" + f.key + "'");
      continue;
    }
    if (f.presence == ModelField::Presence::with && !f.written(info)) continue;  // not read here (as before)
    f.set(info, it->second, at);
  }
  nn::TransformerConfig& c = info.config;
  if (c.V_vocab != info.vocab.size())
    throw FormatError(at + "V_vocab " + std::to_string(c.V_vocab) + " but the vocabulary has " +
                      std::to_string(info.vocab.size()) + " tokens");
  try {
    c = c.resolved();
  } catch (const Error& e) {
    throw FormatError(at + "invalid configuration: " + e.what());
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
  const std::uint64_t adapters = adapter_parameter_count(f.metadata, lm.info.config, path);
  // A registered mlp or norm has parameters only its factory knows: the model is built first
  // (within the sizes model_info bounds) and counted.
  const bool registered = !lm.info.config.mlp.empty() || !lm.info.config.norm.empty();
  const std::uint64_t expected = registered ? in_file : parameter_count(lm.info.kind, lm.info.config) + adapters;
  if (expected != in_file)
    throw FormatError("[checkpoint] " + path + ": the metadata describes a model of " + std::to_string(expected) +
                      " parameters, the file holds " + std::to_string(in_file));
  Generator gen(0);  // initial values are overwritten by the file
  if (lm.info.kind == ModelKind::gpt)
    lm.gpt = std::make_unique<nn::GPT>(lm.info.config, gen);
  if (lm.gpt) add_saved_adapters(f.metadata, *lm.gpt, path);
  else
    lm.encdec = std::make_unique<nn::EncoderDecoder>(lm.info.config, gen);
  nn::safetensors::load_module(path, lm.module());
  lm.module().eval();
  return lm;
}

}  // namespace xg::train
