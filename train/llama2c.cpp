// llama2.c model files in and out (train/llama2c.hpp; docs/llama.md has the formats).
#include <xgrad/train/llama2c.hpp>
#include <xgrad/io/number.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>

#include <xgrad/io/atomic_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/train/checkpoint.hpp>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "train/llama2c.cpp reads and writes little-endian files with the host's byte order"
#endif

namespace xg::train::llama2c {

namespace {

constexpr std::uint32_t kMagic = 0x616b3432;  // "ak42" as llama2.c's export.py writes it
constexpr std::uint64_t kLegacyHeader = 7 * 4;
constexpr std::uint64_t kVersionedHeader = 256;

// xgrad's checkpoint limits (train/checkpoint.cpp's model_info): a model beyond them could be
// imported but never loaded.
constexpr std::int64_t kMaxDim = 1 << 14, kMaxHidden = 1 << 18, kMaxLayers = 1024, kMaxVocab = 1 << 20,
                       kMaxSeq = 1 << 16;

std::string where(const std::string& path) { return "[llama2c] " + path + ": "; }

// One tensor of a file, in file order: llama2.c's name and shape (out x in for a matrix), and
// where it goes in xgrad: `dst` (empty for the RoPE tables), transposed into `dst_cols`
// columns starting at `col` for a matrix, or copied as it is.
struct Segment {
  std::string name, dst;
  std::uint64_t rows = 0, cols = 0;
  bool transpose = false;
  std::uint64_t dst_cols = 0, col = 0;
  bool quantized = false;  // version 2: int8 values, then one float32 scale per group
  std::uint64_t size() const { return rows * cols; }
};

struct Dims {
  std::uint64_t d, f, L, V, T, q, kv, hs;
  bool tied;
};

Dims dims_of(const nn::TransformerConfig& c) {
  const std::uint64_t hs = c.d_model / c.H_q;
  return {c.d_model, c.d_ff, c.layers, c.V_vocab, c.context, c.H_q * hs, c.H_kv * hs, hs, c.tie_embeddings};
}

// The tensors of a file of format `f`, in file order.
std::vector<Segment> layout(Format f, const Dims& m) {
  std::vector<Segment> s;
  const std::uint64_t qkv = m.q + 2 * m.kv;
  auto per_layer = [&](const std::string& l2c, const std::string& xg, std::uint64_t rows, std::uint64_t cols,
                       bool transpose, std::uint64_t dst_cols, std::uint64_t col) {
    for (std::uint64_t l = 0; l < m.L; ++l)
      s.push_back({"layers." + std::to_string(l) + "." + l2c, "blocks." + std::to_string(l) + "." + xg, rows, cols,
                   transpose, dst_cols, col});
  };
  auto norms = [&](const char* l2c, const char* xg) { per_layer(l2c, xg, 1, m.d, false, 0, 0); };
  auto tok = [&] { s.push_back({"tok_embeddings.weight", "tok.weight", m.V, m.d, false, 0, 0}); };
  auto matrices = [&] {
    per_layer("attention.wq.weight", "attn.W_QKV", m.q, m.d, true, qkv, 0);
    per_layer("attention.wk.weight", "attn.W_QKV", m.kv, m.d, true, qkv, m.q);
    per_layer("attention.wv.weight", "attn.W_QKV", m.kv, m.d, true, qkv, m.q + m.kv);
    per_layer("attention.wo.weight", "attn.W_O", m.d, m.q, true, m.d, 0);
  };
  auto ffn = [&] {
    per_layer("feed_forward.w1.weight", "ffn.gate.W", m.f, m.d, true, m.f, 0);
    per_layer("feed_forward.w2.weight", "ffn.down.W", m.d, m.f, true, m.d, 0);
    per_layer("feed_forward.w3.weight", "ffn.up.W", m.f, m.d, true, m.f, 0);
  };
  if (f == Format::legacy) {
    tok();
    norms("attention_norm.weight", "attn_norm.weight");
    matrices();
    norms("ffn_norm.weight", "ffn_norm.weight");
    ffn();
    s.push_back({"norm.weight", "norm.weight", 1, m.d, false, 0, 0});
    s.push_back({"freq_cis_real", "", m.T, m.hs / 2, false, 0, 0});
    s.push_back({"freq_cis_imag", "", m.T, m.hs / 2, false, 0, 0});
  } else {  // version 1 and 2: the same order
    norms("attention_norm.weight", "attn_norm.weight");
    norms("ffn_norm.weight", "ffn_norm.weight");
    s.push_back({"norm.weight", "norm.weight", 1, m.d, false, 0, 0});
    tok();
    matrices();
    ffn();
  }
  if (!m.tied) s.push_back({"output.weight", "classifier.weight", m.V, m.d, false, 0, 0});
  // Version 2 keeps the norms in float32 and quantizes everything else.
  if (f == Format::version2)
    for (Segment& x : s) x.quantized = x.rows > 1;
  return s;
}

// xgrad's parameters of a Llama model: names and shapes.
std::vector<std::pair<std::string, Shape>> parameter_shapes(const Dims& m) {
  std::vector<std::pair<std::string, Shape>> p{{"tok.weight", {m.V, m.d}}};
  for (std::uint64_t l = 0; l < m.L; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    p.push_back({b + "attn_norm.weight", {m.d}});
    p.push_back({b + "attn.W_QKV", {m.d, m.q + 2 * m.kv}});
    p.push_back({b + "attn.W_O", {m.q, m.d}});
    p.push_back({b + "ffn_norm.weight", {m.d}});
    p.push_back({b + "ffn.gate.W", {m.d, m.f}});
    p.push_back({b + "ffn.up.W", {m.d, m.f}});
    p.push_back({b + "ffn.down.W", {m.f, m.d}});
  }
  p.push_back({"norm.weight", {m.d}});
  if (!m.tied) p.push_back({"classifier.weight", {m.V, m.d}});
  return p;
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

std::int32_t int_at(const unsigned char* b) {
  std::int32_t v;
  std::memcpy(&v, b, 4);
  return v;
}

// A header value: positive and at most `max` (xgrad's limit), else a FormatError naming it.
std::uint64_t field(const std::string& path, const char* name, std::int64_t v, std::int64_t max) {
  if (v <= 0)
    throw FormatError(where(path) + "header field " + name + " = " + std::to_string(v) + " must be positive");
  if (v > max)
    throw FormatError(where(path) + "header field " + name + " = " + std::to_string(v) + " exceeds xgrad's limit " +
                      std::to_string(max));
  return static_cast<std::uint64_t>(v);
}

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

std::string format_name(Format f) {
  return f == Format::legacy ? "legacy" : f == Format::version1 ? "version 1" : "version 2";
}

std::vector<float> rope_tables(std::size_t head_size, std::size_t seq_len) {
  const std::size_t half = head_size / 2;
  std::vector<float> t(2 * seq_len * half);
  for (std::size_t i = 0; i < half; ++i) {
    // export.py: 1.0 / (10000.0 ** (arange(0, dim, 2).float() / dim)), all in float32.
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_size);
    const float p = static_cast<float>(std::pow(10000.0, static_cast<double>(e)));
    const float theta = 1.0f / p;
    for (std::size_t pos = 0; pos < seq_len; ++pos) {
      const float angle = static_cast<float>(pos) * theta;
      t[pos * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      t[seq_len * half + pos * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  return t;
}

Model read(const std::string& path) {
  // Not a FIFO or a device: opening one could wait forever for a writer.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
    throw FormatError(where(path) + "not a regular file");
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw FormatError(where(path) + "cannot open: " + std::strerror(errno));
  std::FILE* f = file.get();
  if (std::fseek(f, 0, SEEK_END) != 0) throw FormatError(where(path) + "cannot seek: " + std::strerror(errno));
  const long long end = ftello(f);
  if (end < 0 || std::fseek(f, 0, SEEK_SET) != 0)
    throw FormatError(where(path) + "cannot find its size (not a regular file?)");
  const auto file_size = static_cast<std::uint64_t>(end);

  unsigned char head[kVersionedHeader] = {};
  const std::size_t got = std::fread(head, 1, static_cast<std::size_t>(std::min<std::uint64_t>(file_size, kVersionedHeader)), f);
  if (got < std::min<std::uint64_t>(file_size, kVersionedHeader)) throw FormatError(where(path) + "reading the header failed");
  Model m;
  Header& h = m.header;
  std::uint64_t header_bytes = kLegacyHeader;
  const unsigned char* ints = head;
  std::uint32_t magic = 0;
  if (file_size >= 4) std::memcpy(&magic, head, 4);
  if (magic == kMagic) {
    if (file_size < kVersionedHeader)
      throw FormatError(where(path) + "truncated: " + std::to_string(file_size) +
                        " bytes, a versioned llama2.c header needs 256");
    const std::int32_t version = int_at(head + 4);
    if (version != 1 && version != 2)
      throw FormatError(where(path) + "header field version = " + std::to_string(version) +
                        " is unknown (xgrad reads llama2.c's legacy, version 1 and version 2 files)");
    h.format = version == 1 ? Format::version1 : Format::version2;
    if (version == 2) h.group_size = int_at(head + 8 + 7 * 4 + 1);  // after the shared_classifier byte
    header_bytes = kVersionedHeader;
    ints = head + 8;
    const unsigned char shared = head[8 + 7 * 4];
    if (shared > 1)
      throw FormatError(where(path) + "header field shared_classifier = " + std::to_string(shared) +
                        " is not 0 or 1");
    h.shared_classifier = shared == 1;
  } else if (file_size < kLegacyHeader) {
    throw FormatError(where(path) + "truncated: " + std::to_string(file_size) +
                      " bytes, a llama2.c header needs 28 (seven int32)");
  }
  h.dim = int_at(ints);
  h.hidden_dim = int_at(ints + 4);
  h.n_layers = int_at(ints + 8);
  h.n_heads = int_at(ints + 12);
  h.n_kv_heads = int_at(ints + 16);
  h.vocab_size = int_at(ints + 20);
  h.seq_len = int_at(ints + 24);

  std::int64_t vocab = h.vocab_size;
  if (h.format == Format::legacy) {
    h.shared_classifier = vocab > 0;
    vocab = vocab < 0 ? -vocab : vocab;  // in int64: no overflow for INT32_MIN
  } else if (vocab < 0) {
    throw FormatError(where(path) + "header field vocab_size = " + std::to_string(vocab) + " must be positive in a " +
                      format_name(h.format) + " file (shared_classifier says whether the classifier is shared)");
  }
  Dims d{};
  d.d = field(path, "dim", h.dim, kMaxDim);
  d.f = field(path, "hidden_dim", h.hidden_dim, kMaxHidden);
  d.L = field(path, "n_layers", h.n_layers, kMaxLayers);
  const std::uint64_t H = field(path, "n_heads", h.n_heads, kMaxDim);
  const std::uint64_t Hkv = field(path, "n_kv_heads", h.n_kv_heads, kMaxDim);
  d.V = field(path, "vocab_size", vocab, kMaxVocab);
  d.T = field(path, "seq_len", h.seq_len, kMaxSeq);
  d.tied = h.shared_classifier;
  if (d.d % H != 0)
    throw FormatError(where(path) + "header field n_heads = " + std::to_string(H) + " does not divide dim = " +
                      std::to_string(d.d));
  if (Hkv > H || H % Hkv != 0)
    throw FormatError(where(path) + "header field n_kv_heads = " + std::to_string(Hkv) + " does not divide n_heads = " +
                      std::to_string(H));
  d.hs = d.d / H;
  if (d.hs % 2 != 0)
    throw FormatError(where(path) + "header fields dim = " + std::to_string(d.d) + " and n_heads = " +
                      std::to_string(H) + " give an odd head size " + std::to_string(d.hs) +
                      " (RoPE rotates pairs)");
  d.q = d.d;
  d.kv = Hkv * d.hs;

  // The whole file's size from the header, before anything is allocated (every factor is
  // bounded above, so none of this overflows 64 bits).
  const std::vector<Segment> segs = layout(h.format, d);
  std::uint64_t gs = 0;
  if (h.format == Format::version2) {
    gs = field(path, "group_size", h.group_size, kMaxHidden);
    for (const Segment& s : segs)
      if (s.quantized && s.size() % gs != 0)
        throw FormatError(where(path) + "header field group_size = " + std::to_string(gs) + " does not divide the " +
                          std::to_string(s.size()) + " values of " + s.name);
  }
  std::uint64_t bytes = 0;
  for (const Segment& s : segs) bytes += s.quantized ? s.size() + 4 * (s.size() / gs) : 4 * s.size();
  const std::uint64_t expected = header_bytes + bytes;
  if (expected != file_size)
    throw FormatError(where(path) + "file size " + std::to_string(file_size) + " bytes, but the " +
                      format_name(h.format) + " header (dim " + std::to_string(d.d) + ", hidden_dim " +
                      std::to_string(d.f) + ", n_layers " + std::to_string(d.L) + ", n_heads " + std::to_string(H) +
                      ", n_kv_heads " + std::to_string(Hkv) + ", vocab_size " + std::to_string(h.vocab_size) +
                      ", seq_len " + std::to_string(d.T) + ") implies " + std::to_string(expected) +
                      (expected > file_size ? " (truncated)" : " (trailing bytes)"));

  nn::TransformerConfig& c = m.config;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.rope = ops::RopeConfig{};  // base 10000, the whole head, interleaved pairs: run.c's RoPE
  c.norm_eps = 1e-5;           // run.c's rmsnorm
  c.V_vocab = d.V;
  c.context = d.T;
  c.d_model = d.d;
  c.H_q = H;
  c.H_kv = Hkv;
  c.layers = d.L;
  c.d_ff = d.f;
  c.tie_embeddings = d.tied;
  c.dtype = DType::float32;
  try {
    c = c.resolved();
  } catch (const Error& e) {
    throw FormatError(where(path) + "not a model xgrad can build: " + e.what());
  }

  // The tensors: the file's bytes, in order, into xgrad's arrays.
  std::map<std::string, std::size_t> index;
  for (const auto& [name, shape] : parameter_shapes(d)) {
    index[name] = m.tensors.size();
    m.tensors.emplace_back(name, Array::empty(shape, DType::float32));
  }
  if (std::fseek(f, static_cast<long>(header_bytes), SEEK_SET) != 0)
    throw FormatError(where(path) + "cannot seek past the header");
  std::vector<float> buf, scales;
  std::vector<std::int8_t> q;
  for (const Segment& s : segs) {
    buf.resize(s.size());
    if (s.quantized) {  // runq.c's dequantize: q[i] * scale[i / group_size], in float32
      q.resize(s.size());
      scales.resize(s.size() / gs);
      if (std::fread(q.data(), 1, q.size(), f) != q.size() ||
          std::fread(scales.data(), 4, scales.size(), f) != scales.size())
        throw FormatError(where(path) + "reading " + s.name + " failed (the file shrank?)");
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(q[i]) * scales[i / gs];
    } else if (std::fread(buf.data(), 4, buf.size(), f) != buf.size()) {
      throw FormatError(where(path) + "reading " + s.name + " failed (the file shrank?)");
    }
    if (s.dst.empty()) {  // a RoPE table: kept as stored, whatever it holds
      m.rope_tables.insert(m.rope_tables.end(), buf.begin(), buf.end());
      continue;
    }
    for (std::size_t i = 0; i < buf.size(); ++i)
      if (!std::isfinite(buf[i]))
        throw FormatError(where(path) + "tensor " + s.name + " holds a non-finite value (" + std::to_string(buf[i]) +
                          ") at index " + std::to_string(i));
    float* dst = m.tensors[index.at(s.dst)].second.data<float>();
    if (!s.transpose) {
      std::memcpy(dst, buf.data(), 4 * buf.size());
      continue;
    }
    // llama2.c's [out, in] row-major into xgrad's [in, dst_cols] at column `col`.
    for (std::uint64_t o = 0; o < s.rows; ++o)
      for (std::uint64_t i = 0; i < s.cols; ++i) dst[i * s.dst_cols + s.col + o] = buf[o * s.cols + i];
  }
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
}

std::string legacy_bytes(const nn::TransformerConfig& config, const io::safetensors::NamedArrays& params,
                         const std::vector<float>& tables) {
  const nn::TransformerConfig c = config.resolved();
  check_exportable(c, "the model");
  const Dims d = dims_of(c);
  if (tables.size() != d.T * d.hs)
    throw ValueError(op_message("export llama2c", "RoPE tables of " + std::to_string(tables.size()) +
                                                      " floats, expected 2 x seq_len x head_size / 2 = " +
                                                      std::to_string(d.T * d.hs)));
  std::map<std::string, const Array*> by_name;
  for (const auto& [name, a] : params) by_name[name] = &a;
  for (const auto& [name, shape] : parameter_shapes(d)) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw ValueError(op_message("export llama2c", "the model lacks parameter " + name));
    if (it->second->shape() != shape)
      throw ShapeError(op_message("export llama2c", name + " has shape " + shape_str(it->second->shape()) +
                                                        ", expected " + shape_str(shape)));
  }
  std::string out(kLegacyHeader, '\0');
  const std::int64_t V = static_cast<std::int64_t>(d.V);
  const std::int32_t header[7] = {static_cast<std::int32_t>(d.d),        static_cast<std::int32_t>(d.f),
                                  static_cast<std::int32_t>(d.L),        static_cast<std::int32_t>(c.H_q),
                                  static_cast<std::int32_t>(c.H_kv),     static_cast<std::int32_t>(d.tied ? V : -V),
                                  static_cast<std::int32_t>(d.T)};
  std::memcpy(&out[0], header, sizeof header);
  std::size_t table_at = 0;
  std::vector<float> buf;
  for (const Segment& s : layout(Format::legacy, d)) {
    buf.resize(s.size());
    if (s.dst.empty()) {
      std::memcpy(buf.data(), tables.data() + table_at, 4 * buf.size());
      table_at += buf.size();
    } else {
      const Array& a = *by_name.at(s.dst);
      const bool f32 = a.dtype() == DType::float32;
      auto at = [&](std::uint64_t i) {
        return f32 ? a.data<float>()[i] : static_cast<float>(a.flat(static_cast<std::size_t>(i)));
      };
      for (std::uint64_t o = 0; o < s.rows; ++o)
        for (std::uint64_t i = 0; i < s.cols; ++i)
          buf[o * s.cols + i] = s.transpose ? at(i * s.dst_cols + s.col + o) : at(o * s.cols + i);
      for (std::size_t i = 0; i < buf.size(); ++i)
        if (!std::isfinite(buf[i]))
          throw ValueError(op_message("export llama2c", s.dst + " (llama2.c's " + s.name +
                                                            ") is not finite in float32 at index " + std::to_string(i)));
    }
    out.append(reinterpret_cast<const char*>(buf.data()), 4 * buf.size());
  }
  return out;
}

void import_file(const std::string& bin, const std::string& out) {
  Model m = read(bin);
  ModelInfo info;
  info.kind = "gpt";
  info.task = "llama2c";
  info.config = m.config;
  // llama2.c models carry no vocabulary: placeholder tokens that name their ids.
  for (std::size_t i = 0; i < m.config.V_vocab; ++i) info.vocab.tokens.push_back("<" + std::to_string(i) + ">");
  io::safetensors::Metadata meta = model_metadata(info);
  meta["llama2c_format"] = format_name(m.header.format);
  if (m.header.format == Format::legacy) {
    const std::vector<float> mine = rope_tables(m.config.d_model / m.config.H_q, m.config.context);
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
  const nn::TransformerConfig& c = lm.info.config;
  check_exportable(c, in);
  const io::safetensors::Metadata meta = io::safetensors::load_header(in).metadata;
  std::vector<float> tables = rope_tables(c.d_model / c.H_q, c.context);
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
    bytes = legacy_bytes(c, params, tables);
  } catch (const ShapeError&) {
    throw;
  } catch (const ValueError& e) {  // a weight llama2.c cannot hold: name the checkpoint it is in
    const std::string tag = "[export llama2c] ", m = e.what();
    throw ValueError(op_message("export llama2c", in + ": " + (m.rfind(tag, 0) == 0 ? m.substr(tag.size()) : m)));
  }
  io::write_atomically(bin, bytes, where(bin));
}

}  // namespace xg::train::llama2c
