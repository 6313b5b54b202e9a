// llama2.c model files in and out (io/llama2c.hpp; docs/llama.md has the formats).
#include <xgrad/io/llama2c.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>

#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/bytes.hpp>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/llama2c.cpp reads and writes little-endian files with the host's byte order"
#endif

namespace xg::io::llama2c {

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

Dims dims_of(const Sizes& s) {
  const std::uint64_t hs = s.head_size();
  return {s.dim, s.hidden_dim, s.n_layers, s.vocab_size, s.seq_len, s.n_heads * hs, s.n_kv_heads * hs, hs,
          s.shared_classifier};
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

// The header's values from the file's first bytes (`head`: up to 256 of them), and the header's
// length.
Header read_header(const unsigned char* head, std::uint64_t file_size, const std::string& path,
                   std::uint64_t& header_bytes) {
  Header h;
  header_bytes = kLegacyHeader;
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
  return h;
}

// The sizes a header gives, checked.
Sizes sizes_of(Header& h, const std::string& path) {
  std::int64_t vocab = h.vocab_size;
  if (h.format == Format::legacy) {
    h.shared_classifier = vocab > 0;
    vocab = vocab < 0 ? -vocab : vocab;  // in int64: no overflow for INT32_MIN
  } else if (vocab < 0) {
    throw FormatError(where(path) + "header field vocab_size = " + std::to_string(vocab) + " must be positive in a " +
                      format_name(h.format) + " file (shared_classifier says whether the classifier is shared)");
  }
  Sizes s;
  s.dim = field(path, "dim", h.dim, kMaxDim);
  s.hidden_dim = field(path, "hidden_dim", h.hidden_dim, kMaxHidden);
  s.n_layers = field(path, "n_layers", h.n_layers, kMaxLayers);
  s.n_heads = field(path, "n_heads", h.n_heads, kMaxDim);
  s.n_kv_heads = field(path, "n_kv_heads", h.n_kv_heads, kMaxDim);
  s.vocab_size = field(path, "vocab_size", vocab, kMaxVocab);
  s.seq_len = field(path, "seq_len", h.seq_len, kMaxSeq);
  s.shared_classifier = h.shared_classifier;
  const std::uint64_t H = s.n_heads, Hkv = s.n_kv_heads;
  if (s.dim % H != 0)
    throw FormatError(where(path) + "header field n_heads = " + std::to_string(H) + " does not divide dim = " +
                      std::to_string(s.dim));
  if (Hkv > H || H % Hkv != 0)
    throw FormatError(where(path) + "header field n_kv_heads = " + std::to_string(Hkv) + " does not divide n_heads = " +
                      std::to_string(H));
  if (s.head_size() % 2 != 0)
    throw FormatError(where(path) + "header fields dim = " + std::to_string(s.dim) + " and n_heads = " +
                      std::to_string(H) + " give an odd head size " + std::to_string(s.head_size()) +
                      " (RoPE rotates pairs)");
  return s;
}

// The whole file's size from the header, before anything is allocated (every factor is bounded
// above, so none of this overflows 64 bits); the group size of a version 2 file (0 otherwise).
std::uint64_t check_file_size(const Header& h, const Sizes& s, const std::vector<Segment>& segs,
                              std::uint64_t header_bytes, std::uint64_t file_size, const std::string& path) {
  std::uint64_t gs = 0;
  if (h.format == Format::version2) {
    gs = field(path, "group_size", h.group_size, kMaxHidden);
    for (const Segment& x : segs)
      if (x.quantized && x.size() % gs != 0)
        throw FormatError(where(path) + "header field group_size = " + std::to_string(gs) + " does not divide the " +
                          std::to_string(x.size()) + " values of " + x.name);
  }
  std::uint64_t bytes = 0;
  for (const Segment& x : segs) bytes += x.quantized ? x.size() + 4 * (x.size() / gs) : 4 * x.size();
  const std::uint64_t expected = header_bytes + bytes;
  if (expected != file_size)
    throw FormatError(where(path) + "file size " + std::to_string(file_size) + " bytes, but the " +
                      format_name(h.format) + " header (dim " + std::to_string(s.dim) + ", hidden_dim " +
                      std::to_string(s.hidden_dim) + ", n_layers " + std::to_string(s.n_layers) + ", n_heads " +
                      std::to_string(s.n_heads) + ", n_kv_heads " + std::to_string(s.n_kv_heads) + ", vocab_size " +
                      std::to_string(h.vocab_size) + ", seq_len " + std::to_string(s.seq_len) + ") implies " +
                      std::to_string(expected) + (expected > file_size ? " (truncated)" : " (trailing bytes)"));
  return gs;
}

// The tensors: the file's bytes after the header, in order, into xgrad's arrays (and the RoPE
// tables of a legacy file, as stored).
void read_tensors(std::FILE* f, const std::vector<Segment>& segs, std::uint64_t gs, const std::string& path,
                  File& m) {
  std::map<std::string, std::size_t> index;
  for (const auto& [name, shape] : parameter_shapes(dims_of(m.sizes))) {
    index[name] = m.tensors.size();
    m.tensors.emplace_back(name, Array::empty(shape, DType::float32));
  }
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

File read(const std::string& path) {
  // A regular file only: opening a FIFO could wait forever for a writer; a folder has no bytes.
  detail::require_regular_file(path, where(path));
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw FormatError(where(path) + "cannot open the file: " + std::strerror(errno));
  std::FILE* f = file.get();
  if (std::fseek(f, 0, SEEK_END) != 0) throw FormatError(where(path) + "cannot seek: " + std::strerror(errno));
  const long long end = ftello(f);
  if (end < 0 || std::fseek(f, 0, SEEK_SET) != 0)
    throw FormatError(where(path) + "cannot find its size (not a regular file?)");
  const auto file_size = static_cast<std::uint64_t>(end);
  unsigned char head[kVersionedHeader] = {};
  const auto head_size = static_cast<std::size_t>(std::min<std::uint64_t>(file_size, kVersionedHeader));
  if (std::fread(head, 1, head_size, f) < head_size) throw FormatError(where(path) + "reading the header failed");

  File m;
  std::uint64_t header_bytes = 0;
  m.header = read_header(head, file_size, path, header_bytes);
  m.sizes = sizes_of(m.header, path);
  const std::vector<Segment> segs = layout(m.header.format, dims_of(m.sizes));
  const std::uint64_t gs = check_file_size(m.header, m.sizes, segs, header_bytes, file_size, path);
  if (std::fseek(f, static_cast<long>(header_bytes), SEEK_SET) != 0)
    throw FormatError(where(path) + "cannot seek past the header");
  read_tensors(f, segs, gs, path, m);
  return m;
}

std::string legacy_bytes(const Sizes& sizes, const safetensors::NamedArrays& params, const std::vector<float>& tables) {
  const Dims d = dims_of(sizes);
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
                                  static_cast<std::int32_t>(d.L),        static_cast<std::int32_t>(sizes.n_heads),
                                  static_cast<std::int32_t>(sizes.n_kv_heads),     static_cast<std::int32_t>(d.tied ? V : -V),
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

}  // namespace xg::io::llama2c
