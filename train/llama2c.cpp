// llama2.c models in and out of xgrad's Llama model (train/llama2c.hpp): the configuration a
// file's sizes give, and `xgrad import llama2c` / `xgrad export llama2c` (the file format is
// io/llama2c.hpp's).
#include <xgrad/train/llama2c.hpp>

#include <cstdio>
#include <cstring>

#include <xgrad/core/error.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/number.hpp>
#include <xgrad/nn/lora.hpp>
#include <xgrad/train/checkpoint.hpp>

namespace xg::train::llama2c {

namespace {

std::string where(const std::string& path) { return "[llama2c] " + path + ": "; }

std::string hex8(std::uint32_t bits) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", bits);
  return buf;
}

std::uint32_t bits_of(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

}  // namespace

nn::TransformerConfig config_of(const io::llama2c::Sizes& s, const std::string& path) {
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.rope = ops::RopeConfig{};  // base 10000, the whole head, interleaved pairs: run.c's RoPE
  c.norm_eps = 1e-5;           // run.c's rmsnorm
  c.V_vocab = s.vocab_size;
  c.context = s.seq_len;
  c.d_model = s.dim;
  c.H_q = s.n_heads;
  c.H_kv = s.n_kv_heads;
  c.layers = s.n_layers;
  c.d_ff = s.hidden_dim;
  c.tie_embeddings = s.shared_classifier;
  c.dtype = DType::float32;
  try {
    return c.resolved();
  } catch (const Error& e) {
    throw FormatError(where(path) + "not a model xgrad can build: " + e.what());
  }
}

io::llama2c::Sizes sizes_of(const nn::TransformerConfig& config) {
  const nn::TransformerConfig c = config.resolved();
  io::llama2c::Sizes s;
  s.dim = c.d_model;
  s.hidden_dim = c.d_ff;
  s.n_layers = c.layers;
  s.n_heads = c.H_q;
  s.n_kv_heads = c.H_kv;
  s.vocab_size = c.V_vocab;
  s.seq_len = c.context;
  s.shared_classifier = c.tie_embeddings;
  return s;
}

Model read(const std::string& path) {
  Model m;
  static_cast<io::llama2c::File&>(m) = io::llama2c::read(path);
  m.config = config_of(m.sizes, path);
  return m;
}

void check_exportable(const nn::TransformerConfig& c, const std::string& what) {
  auto refuse = [&](const std::string& why) {
    throw ValueError(op_message("export llama2c", what + ": " + why + "; llama2.c's run.c cannot compute it"));
  };
  if (c.arch != nn::Architecture::llama) refuse("arch is " + nn::architecture_name(c.arch) + ", not llama");
  if (c.pos != nn::PositionScheme::rope) refuse("pos is " + nn::position_scheme_name(c.pos) + ", not rope");
  if (c.rope.layout != ops::RopeLayout::interleaved)
    refuse("rope_layout is " + ops::rope_layout_name(c.rope.layout) + ", not interleaved");
  if (c.rope.base != 10000.0) refuse("rope_base is " + number_text(c.rope.base) + ", not 10000");
  if (c.rope.fraction != 1.0) refuse("rope_fraction is " + number_text(c.rope.fraction) + ", not 1");
  if (c.norm_eps != 1e-5) refuse("norm_eps is " + number_text(c.norm_eps) + ", not 1e-5");
  if (c.window > 0) refuse("it has a sliding window of " + std::to_string(c.window));
  if (c.H_q == 0 || (c.d_model / c.H_q) % 2 != 0) refuse("its head size is odd");
  for (const auto& [kind, name] : {std::pair<const char*, const std::string*>{"activation", &c.activation},
                                   {"mlp", &c.mlp}, {"norm", &c.norm}, {"attention", &c.attention}})
    if (!name->empty()) refuse(std::string("its ") + kind + " is the registered layer '" + *name + "'");
}

void import_file(const std::string& bin, const std::string& out) {
  const Model m = read(bin);
  ModelInfo info;
  info.kind = ModelKind::gpt;
  info.task = "llama2c";
  info.config = m.config;
  // llama2.c models carry no vocabulary: placeholder tokens that name their ids.
  for (std::size_t i = 0; i < m.config.V_vocab; ++i) info.vocab.tokens.push_back(text::placeholder_token(i));
  io::safetensors::Metadata meta = model_metadata(info);
  meta["llama2c_format"] = io::llama2c::format_name(m.header.format);
  if (m.header.format == io::llama2c::Format::legacy) {
    const std::vector<float> mine = io::llama2c::rope_tables(m.config.d_model / m.config.H_q, m.config.context);
    std::string exceptions;
    for (std::size_t i = 0; i < mine.size(); ++i)
      if (bits_of(mine[i]) != bits_of(m.rope_tables[i]))
        exceptions += (exceptions.empty() ? "" : ",") + std::to_string(i) + ":" + hex8(bits_of(m.rope_tables[i]));
    if (!exceptions.empty()) meta["llama2c_tables"] = exceptions;
  }
  io::safetensors::save(out, m.tensors, meta);
}

void export_file(const std::string& in, const std::string& bin) {
  LoadedModel lm = load_model(in);
  if (!lm.gpt) throw ValueError(op_message("export llama2c", in + ": an encoder-decoder; llama2.c holds decoder-only Llama models"));
  if (nn::count_adapters(*lm.gpt) > 0) nn::merge_lora(*lm.gpt);  // LoRA adapters are folded in on the way out
  const nn::TransformerConfig& c = lm.info.config;
  check_exportable(c, in);
  const io::safetensors::Metadata meta = io::safetensors::load_header(in).metadata;
  std::vector<float> tables = io::llama2c::rope_tables(c.d_model / c.H_q, c.context);
  const auto it = meta.find("llama2c_tables");
  if (it != meta.end()) {
    const std::string& text = it->second;
    const std::string bad = where(in) + "metadata 'llama2c_tables' is not a list of index:8-hex-digit entries";
    std::size_t at = 0;
    while (at < text.size()) {
      std::size_t comma = text.find(',', at);
      if (comma == std::string::npos) comma = text.size();
      const std::string entry = text.substr(at, comma - at);
      const std::size_t colon = entry.find(':');
      if (colon == std::string::npos || entry.size() - colon - 1 != 8 ||
          entry.find_first_not_of("0123456789abcdef", colon + 1) != std::string::npos)
        throw FormatError(bad + " (entry '" + entry + "')");
      const std::uint64_t index = io::parse_uint(entry.substr(0, colon), bad);
      if (index >= tables.size())
        throw FormatError(where(in) + "metadata 'llama2c_tables': index " + std::to_string(index) +
                          " is past the RoPE tables' " + std::to_string(tables.size()) + " entries");
      const auto bits = static_cast<std::uint32_t>(std::stoul(entry.substr(colon + 1), nullptr, 16));
      std::memcpy(&tables[index], &bits, 4);
      at = comma + 1;
    }
  }
  io::safetensors::NamedArrays params;
  for (const auto& [name, t] : lm.gpt->named_parameters()) params.emplace_back(name, t.value());
  std::string bytes;
  try {
    check_exportable(c, "the model");
    bytes = io::llama2c::legacy_bytes(sizes_of(c), params, tables);
  } catch (const ShapeError&) {
    throw;
  } catch (const ValueError& e) {  // a weight llama2.c cannot hold: name the checkpoint it is in
    const std::string tag = "[export llama2c] ", m = e.what();
    throw ValueError(op_message("export llama2c", in + ": " + (m.rfind(tag, 0) == 0 ? m.substr(tag.size()) : m)));
  }
  io::write_atomically(bin, bytes, where(bin));
}

}  // namespace xg::train::llama2c
