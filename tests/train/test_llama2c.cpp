// llama2.c model files (train/llama2c.hpp): import then export gives the same bytes, the tensor
// map, and every kind of bad file refused with one line naming the file and the field, before
// anything the header asks for is allocated.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <sys/stat.h>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/llama2c.hpp>
#include <xgrad/xgrad.hpp>

using namespace xg;
namespace l2c = xg::train::llama2c;
namespace l2c_file = xg::io::llama2c;
namespace fs = std::filesystem;

namespace {

struct Spec {
  std::int32_t dim = 16, hidden = 24, layers = 2, heads = 4, kv_heads = 2, vocab = 11, seq_len = 6;
  bool shared = true;
  bool version1 = false;
};

std::string ints(const std::vector<std::int32_t>& v) {
  std::string s(4 * v.size(), '\0');
  if (!s.empty()) std::memcpy(&s[0], v.data(), s.size());  // no null source for an empty vector
  return s;
}

std::string floats(std::size_t n, Generator& g, double lo = -1, double hi = 1) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(lo + (hi - lo) * g.uniform());
  std::string s(4 * n, '\0');
  if (!s.empty()) std::memcpy(&s[0], v.data(), s.size());  // no null source for an empty vector
  return s;
}

std::size_t weight_floats(const Spec& s) {
  const std::size_t d = s.dim, f = s.hidden, L = s.layers, hs = d / s.heads, kv = s.kv_heads * hs, V = s.vocab;
  return V * d + L * (2 * d + d * d + 2 * kv * d + d * d + 3 * d * f) + d + (s.shared ? 0 : V * d);
}

// A llama2.c file with random weights: legacy (RoPE tables as rope_tables() computes them,
// with `table_bits` written over some entries) or version 1.
std::string model_bytes(const Spec& s, std::uint64_t seed, const std::vector<std::pair<std::size_t, std::uint32_t>>& table_bits = {}) {
  Generator g(seed);
  const std::size_t hs = static_cast<std::size_t>(s.dim / s.heads);
  std::string out;
  const std::vector<std::int32_t> head{s.dim, s.hidden, s.layers, s.heads, s.kv_heads,
                                       s.version1 || s.shared ? s.vocab : -s.vocab, s.seq_len};
  if (s.version1) {
    out = ints({0x616b3432, 1}) + ints(head) + std::string(1, s.shared ? '\1' : '\0');
    out.resize(256, '\0');
    return out + floats(weight_floats(s), g);
  }
  out = ints(head);
  // Everything up to the final norm, the tables, then the classifier.
  const std::size_t cls = s.shared ? 0 : static_cast<std::size_t>(s.vocab * s.dim);
  out += floats(weight_floats(s) - cls, g);
  std::vector<float> t = l2c_file::rope_tables(hs, static_cast<std::size_t>(s.seq_len));
  for (const auto& [i, bits] : table_bits) {
    REQUIRE(i < t.size());
    std::memcpy(&t[i], &bits, 4);
  }
  out.append(reinterpret_cast<const char*>(t.data()), 4 * t.size());
  return out + floats(cls, g);
}

std::string write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
  return p.string();
}

// `fn` throws E whose message is one line naming `path` and containing every one of `words`.
template <class E, class Fn>
void refuses(Fn fn, const std::string& path, const std::vector<std::string>& words) {
  try {
    fn();
    FAIL("no error for " << path);
  } catch (const E& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.find(path) != std::string::npos);
    for (const std::string& w : words) CHECK(m.find(w) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("llama2c import then export gives a legacy file back byte for byte (tied and untied)", "[llama2c]") {
  const fs::path dir = xgt::temp_dir("llama2c_roundtrip");
  for (bool shared : {true, false}) {
    Spec s;
    s.shared = shared;
    // Some table entries as torch's float32 cos and sin would differ from xgrad's, one a NaN
    // pattern and one -0 for sin(0) = +0: kept exactly.
    const std::string bin = write(dir / "m.bin", model_bytes(s, shared ? 1 : 2, {{0, 0x3f7fffff}, {7, 0x7fc00123}, {12, 0x80000000}}));
    const std::string ckpt = (dir / "m.safetensors").string(), back = (dir / "back.bin").string();
    l2c::import_file(bin, ckpt);
    const auto meta = io::safetensors::load_header(ckpt).metadata;
    CHECK(meta.at("llama2c_format") == "legacy");
    CHECK(meta.at("llama2c_tables") == "0:3f7fffff,7:7fc00123,12:80000000");
    CHECK(meta.at("tie_embeddings") == (shared ? "true" : "false"));
    l2c::export_file(ckpt, back);
    CHECK(xgt::read_file(back) == xgt::read_file(bin));
  }
}

TEST_CASE("llama2c tables equal to xgrad's own are not recorded", "[llama2c]") {
  const fs::path dir = xgt::temp_dir("llama2c_tables");
  const std::string bin = write(dir / "m.bin", model_bytes(Spec{}, 3));
  const std::string ckpt = (dir / "m.safetensors").string();
  l2c::import_file(bin, ckpt);
  CHECK(io::safetensors::load_header(ckpt).metadata.count("llama2c_tables") == 0);
}

TEST_CASE("llama2c version 1 and legacy files of the same weights import to the same model", "[llama2c]") {
  // The same random weights written in both orders: read() must place each tensor at the same
  // xgrad name and position whichever order the file has.
  Generator g(5);
  const std::size_t d = 16, f = 24, L = 2, hs = 4, kv = 8, V = 11, T = 6;
  auto block = [&](std::size_t n) { return floats(n, g); };
  const std::string tok = block(V * d), norm = block(d), cls = block(V * d);
  std::vector<std::string> an, fn, wq, wk, wv, wo, w1, w2, w3;
  for (std::size_t l = 0; l < L; ++l) {
    an.push_back(block(d));
    fn.push_back(block(d));
    wq.push_back(block(d * d));
    wk.push_back(block(kv * d));
    wv.push_back(block(kv * d));
    wo.push_back(block(d * d));
    w1.push_back(block(f * d));
    w2.push_back(block(d * f));
    w3.push_back(block(f * d));
  }
  auto cat = [](const std::vector<std::string>& v) {
    std::string r;
    for (const auto& x : v) r += x;
    return r;
  };
  const std::vector<float> t = l2c_file::rope_tables(hs, T);
  const std::string tables(reinterpret_cast<const char*>(t.data()), 4 * t.size());
  const std::string legacy = ints({16, 24, 2, 4, 2, -11, 6}) + tok + cat(an) + cat(wq) + cat(wk) + cat(wv) + cat(wo) +
                             cat(fn) + cat(w1) + cat(w2) + cat(w3) + norm + tables + cls;
  std::string v1 = ints({0x616b3432, 1, 16, 24, 2, 4, 2, 11, 6}) + std::string(1, '\0');
  v1.resize(256, '\0');
  v1 += cat(an) + cat(fn) + norm + tok + cat(wq) + cat(wk) + cat(wv) + cat(wo) + cat(w1) + cat(w2) + cat(w3) + cls;
  const fs::path dir = xgt::temp_dir("llama2c_orders");
  const l2c::Model a = l2c::read(write(dir / "legacy.bin", legacy));
  const l2c::Model b = l2c::read(write(dir / "v1.bin", v1));
  CHECK(a.header.format == l2c_file::Format::legacy);
  CHECK(b.header.format == l2c_file::Format::version1);
  CHECK_FALSE(b.header.shared_classifier);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    INFO(a.tensors[i].first);
    CHECK(a.tensors[i].first == b.tensors[i].first);
    CHECK(a.tensors[i].second.to_vector() == b.tensors[i].second.to_vector());
  }
  // The map itself: W_QKV[i][o] = wq[o][i] for the Q columns, wk after them, wv last; gate is w1^T.
  auto value = [](const std::string& bytes, std::size_t k) {
    float x;
    std::memcpy(&x, bytes.data() + 4 * k, 4);
    return static_cast<double>(x);
  };
  const l2c::Model& m = a;
  auto param = [&](const std::string& n) -> const Array& {
    for (const auto& kv2 : m.tensors)
      if (kv2.first == n) return kv2.second;
    FAIL("no parameter " << n);
    return m.tensors[0].second;
  };
  const Array& qkv = param("blocks.1.attn.W_QKV");
  REQUIRE(qkv.shape() == Shape{16, 32});
  CHECK(qkv.at({3, 5}) == value(wq[1], 5 * d + 3));
  CHECK(qkv.at({2, 16 + 7}) == value(wk[1], 7 * d + 2));
  CHECK(qkv.at({9, 24 + 1}) == value(wv[1], 1 * d + 9));
  CHECK(param("blocks.0.attn.W_O").at({4, 6}) == value(wo[0], 6 * d + 4));
  CHECK(param("blocks.0.ffn.gate.W").at({2, 20}) == value(w1[0], 20 * d + 2));
  CHECK(param("blocks.0.ffn.up.W").at({2, 20}) == value(w3[0], 20 * d + 2));
  CHECK(param("blocks.1.ffn.down.W").at({20, 2}) == value(w2[1], 2 * f + 20));
  CHECK(param("classifier.weight").at({10, 15}) == value(cls, 10 * d + 15));
  CHECK(param("tok.weight").at({10, 15}) == value(tok, 10 * d + 15));
  CHECK(m.config.d_ff == 24);
  CHECK(m.config.H_kv == 2);
  CHECK(m.config.context == 6);
  CHECK_FALSE(m.config.tie_embeddings);
}

namespace {

// A version-2 (Q8_0) file of the Spec{} shape (tied), group size `gs`: the norms in float32,
// then every other tensor as int8 values and one float32 scale per group; and the version-1
// file of the values those dequantize to (q * scale in float32), for comparison.
std::pair<std::string, std::string> q80_and_v1(std::int32_t gs) {
  const std::size_t d = 16, f = 24, L = 2, kv = 8, V = 11;
  std::string head = ints({0x616b3432, 2, 16, 24, 2, 4, 2, 11, 6}) + std::string(1, '\1') + ints({gs});
  head.resize(256, '\0');
  std::string v1 = ints({0x616b3432, 1, 16, 24, 2, 4, 2, 11, 6}) + std::string(1, '\1');
  v1.resize(256, '\0');
  Generator g(21);
  const std::string norms = floats(2 * L * d + d, g, 0.5, 1.5);
  std::string q2 = head + norms;
  v1 += norms;
  const std::vector<std::size_t> sizes{V * d, d * d, d * d, kv * d, kv * d, kv * d, kv * d, d * d, d * d,
                                       f * d, f * d, d * f, d * f, f * d, f * d};
  for (std::size_t n : sizes) {
    std::vector<std::int8_t> q(n);
    std::vector<float> scale(n / static_cast<std::size_t>(gs)), value(n);
    for (auto& x : q) x = static_cast<std::int8_t>(static_cast<int>(g.below(255)) - 127);
    for (auto& x : scale) x = static_cast<float>(0.001 + 0.01 * g.uniform());
    for (std::size_t i = 0; i < n; ++i) value[i] = static_cast<float>(q[i]) * scale[i / static_cast<std::size_t>(gs)];
    q2.append(reinterpret_cast<const char*>(q.data()), n);
    q2.append(reinterpret_cast<const char*>(scale.data()), 4 * scale.size());
    v1.append(reinterpret_cast<const char*>(value.data()), 4 * n);
  }
  return {q2, v1};
}

}  // namespace

TEST_CASE("llama2c version 2 files are dequantized as runq.c does", "[llama2c]") {
  const fs::path dir = xgt::temp_dir("llama2c_q80");
  // Not a structured binding: the lambda below captures q2 (C++17 does not allow that).
  const std::pair<std::string, std::string> files = q80_and_v1(8);
  const std::string& q2 = files.first;
  const std::string& v1 = files.second;
  const l2c::Model a = l2c::read(write(dir / "q.bin", q2));
  const l2c::Model b = l2c::read(write(dir / "v1.bin", v1));
  CHECK(a.header.format == l2c_file::Format::version2);
  CHECK(a.header.group_size == 8);
  CHECK(a.config.tie_embeddings);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    INFO(a.tensors[i].first);
    CHECK(a.tensors[i].second.to_vector() == b.tensors[i].second.to_vector());
  }
  // Import, then export: a legacy file of the dequantized weights.
  const std::string ckpt = (dir / "q.safetensors").string(), back = (dir / "back.bin").string();
  l2c::import_file(dir / "q.bin", ckpt);
  CHECK(io::safetensors::load_header(ckpt).metadata.at("llama2c_format") == "version 2");
  l2c::export_file(ckpt, back);
  const l2c::Model c = l2c::read(back);
  for (std::size_t i = 0; i < a.tensors.size(); ++i) CHECK(c.tensors[i].second.to_vector() == a.tensors[i].second.to_vector());

  auto with_gs = [&](std::int32_t gs) {
    std::string b2 = q2;
    std::memcpy(&b2[37], &gs, 4);
    return b2;
  };
  for (const auto& [gs, words] : std::vector<std::pair<std::int32_t, std::vector<std::string>>>{
           {0, {"group_size = 0", "positive"}},
           {-8, {"group_size = -8", "positive"}},
           {7, {"group_size = 7", "does not divide", "tok_embeddings.weight"}},
           {16, {"version 2 header", "implies", "trailing bytes"}},
           {1 << 30, {"group_size = 1073741824", "limit"}}}) {
    const std::string p = write(dir / ("gs" + std::to_string(gs) + ".bin"), with_gs(gs));
    refuses<FormatError>([&] { l2c::read(p); }, p, words);
  }
  const std::string cut = write(dir / "cut.bin", q2.substr(0, q2.size() - 3));
  refuses<FormatError>([&] { l2c::read(cut); }, cut, {"version 2 header", "truncated"});
}

TEST_CASE("llama2c bad files are one-line FormatErrors naming the file and the field", "[llama2c]") {
  const fs::path dir = xgt::temp_dir("llama2c_bad");
  auto bad = [&](const std::string& name, const std::string& bytes, const std::vector<std::string>& words) {
    const std::string p = write(dir / name, bytes);
    INFO(name);
    refuses<FormatError>([&] { l2c::read(p); }, p, words);
    // The command's path too.
    refuses<FormatError>([&] { l2c::import_file(p, (dir / "out.safetensors").string()); }, p, words);
    CHECK_FALSE(fs::exists(dir / "out.safetensors"));
  };
  const std::string good = model_bytes(Spec{}, 9);
  auto with_int = [&](std::size_t field, std::int32_t v) {
    std::string b = good;
    std::memcpy(&b[4 * field], &v, 4);
    return b;
  };
  bad("empty.bin", "", {"truncated", "0 bytes"});
  bad("short.bin", good.substr(0, 10), {"truncated", "10 bytes"});
  bad("dim_negative.bin", with_int(0, -16), {"dim = -16", "positive"});
  bad("dim_zero.bin", with_int(0, 0), {"dim = 0", "positive"});
  bad("hidden_zero.bin", with_int(1, 0), {"hidden_dim = 0"});
  bad("layers_negative.bin", with_int(2, -1), {"n_layers = -1"});
  bad("heads_zero.bin", with_int(3, 0), {"n_heads = 0"});
  bad("kv_heads_negative.bin", with_int(4, -2), {"n_kv_heads = -2"});
  bad("vocab_zero.bin", with_int(5, 0), {"vocab_size = 0"});
  bad("vocab_int_min.bin", with_int(5, INT32_MIN), {"vocab_size = 2147483648", "limit"});
  bad("seq_zero.bin", with_int(6, 0), {"seq_len = 0"});
  bad("dim_absurd.bin", with_int(0, 1 << 30), {"dim = 1073741824", "exceeds xgrad's limit"});
  bad("layers_absurd.bin", with_int(2, 1 << 20), {"n_layers", "exceeds"});
  bad("heads_indivisible.bin", with_int(3, 3), {"n_heads = 3", "does not divide dim = 16"});
  bad("kv_indivisible.bin", with_int(4, 3), {"n_kv_heads = 3", "does not divide n_heads = 4"});
  bad("kv_too_many.bin", with_int(4, 8), {"n_kv_heads = 8"});
  bad("odd_head.bin", with_int(3, 16), {"odd head size 1"});
  // Sizes at xgrad's limits: the header asks for 2^20 x 2^14 floats (64 GiB) and more; the
  // file's 28 bytes are refused before any of it is allocated.
  bad("huge.bin", ints({1 << 14, 1 << 18, 1024, 1 << 13, 1 << 13, 1 << 20, 1 << 16}), {"implies", "truncated", "file size 28"});
  bad("truncated_weights.bin", good.substr(0, good.size() - 4), {"implies", "truncated", "vocab_size 11"});
  bad("trailing.bin", good + "xxxx", {"implies", "trailing bytes"});
  bad("garbage.bin", "This is not a model file, only some text.", {"header field"});
  std::string nan_weight = good;
  const std::uint32_t nan_bits = 0x7fc00000;
  std::memcpy(&nan_weight[28 + 4 * 5], &nan_bits, 4);
  bad("nan.bin", nan_weight, {"tok_embeddings.weight", "non-finite", "index 5"});

  // The versioned header.
  Spec v1s;
  v1s.version1 = true;
  const std::string v1 = model_bytes(v1s, 10);
  auto v1_with = [&](std::size_t at, std::int32_t v) {
    std::string b = v1;
    std::memcpy(&b[at], &v, 4);
    return b;
  };
  bad("v1_short.bin", v1.substr(0, 100), {"truncated", "100 bytes", "256"});
  bad("v2_no_group.bin", v1_with(4, 2), {"group_size = 0", "positive"});
  bad("v7.bin", v1_with(4, 7), {"version = 7", "unknown"});
  bad("v1_vocab_negative.bin", v1_with(8 + 20, -11), {"vocab_size = -11", "version 1"});
  bad("v1_dim_zero.bin", v1_with(8, 0), {"dim = 0"});
  std::string shared7 = v1;
  shared7[36] = 7;
  bad("v1_shared.bin", shared7, {"shared_classifier = 7"});
  bad("v1_truncated.bin", v1.substr(0, v1.size() - 1), {"version 1 header", "truncated"});

  refuses<FormatError>([&] { l2c::read((dir / "missing.bin").string()); }, (dir / "missing.bin").string(), {"cannot open"});
  // A folder, and a FIFO that nobody writes to (opening it would wait forever).
  refuses<FormatError>([&] { l2c::read(dir.string()); }, dir.string(), {"not a regular file"});
  const std::string fifo = (dir / "fifo.bin").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  refuses<FormatError>([&] { l2c::read(fifo); }, fifo, {"not a regular file"});
  // A good file reads.
  CHECK(l2c::read(write(dir / "good.bin", good)).config.V_vocab == 11);
  CHECK(l2c::read(write(dir / "good_v1.bin", v1)).header.format == l2c_file::Format::version1);
}

TEST_CASE("llama2c export refuses models run.c cannot compute and unwritable paths", "[llama2c]") {
  const fs::path dir = xgt::temp_dir("llama2c_export");
  const std::string bin = write(dir / "m.bin", model_bytes(Spec{}, 4));
  const std::string ckpt = (dir / "m.safetensors").string();
  l2c::import_file(bin, ckpt);

  for (const std::string& out : {(dir / "no_such_folder" / "x.bin").string(), dir.string()})
    refuses<FormatError>([&] { l2c::export_file(ckpt, out); }, out, {"[llama2c]"});

  // A checkpoint of a model llama2.c has no place for.
  auto save_model = [&](const std::string& name, const nn::TransformerConfig& c) {
    Generator g(1);
    nn::GPT m(c, g);
    train::ModelInfo info;
    info.kind = train::ModelKind::gpt;
    info.task = "sort";
    info.config = c.resolved();
    for (std::size_t i = 0; i < c.V_vocab; ++i) info.vocab.tokens.push_back(std::to_string(i));
    const std::string p = (dir / name).string();
    nn::safetensors::save_module(p, m, train::model_metadata(info));
    return p;
  };
  nn::TransformerConfig c;
  c.V_vocab = 10;
  c.context = 8;
  c.d_model = 16;
  c.H_q = 4;
  c.layers = 1;
  c.dtype = DType::float32;
  const std::string gpt = save_model("gpt.safetensors", c);
  refuses<ValueError>([&] { l2c::export_file(gpt, (dir / "o.bin").string()); }, gpt, {"arch is gpt"});
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.rope.layout = ops::RopeLayout::half_split;
  const std::string half = save_model("half.safetensors", c);
  refuses<ValueError>([&] { l2c::export_file(half, (dir / "o.bin").string()); }, half, {"rope_layout is half-split"});
  c.rope.layout = ops::RopeLayout::interleaved;
  c.window = 3;
  const std::string win = save_model("window.safetensors", c);
  refuses<ValueError>([&] { l2c::export_file(win, (dir / "o.bin").string()); }, win, {"sliding window of 3"});
  c.window = 0;
  c.rope.base = 500;
  const std::string base = save_model("base.safetensors", c);
  refuses<ValueError>([&] { l2c::export_file(base, (dir / "o.bin").string()); }, base, {"rope_base"});
  c.rope.base = 10000;
  c.norm_eps = 1e-6;
  const std::string eps = save_model("eps.safetensors", c);
  refuses<ValueError>([&] { l2c::export_file(eps, (dir / "o.bin").string()); }, eps, {"norm_eps"});
  CHECK_FALSE(fs::exists(dir / "o.bin"));
  // A Llama model trained by xgrad in float64 exports (rounded to float32) and reads back.
  c.norm_eps = 1e-5;
  c.dtype = DType::float64;
  const std::string f64 = save_model("f64.safetensors", c);
  l2c::export_file(f64, (dir / "f64.bin").string());
  const l2c::Model back = l2c::read((dir / "f64.bin").string());
  CHECK(back.config.d_ff == train::load_model(f64).info.config.d_ff);
  CHECK(back.rope_tables == l2c_file::rope_tables(4, 8));

  // Recorded table entries that are not index:8-hex-digits are a FormatError naming the key.
  auto meta = io::safetensors::load(ckpt);
  meta.metadata["llama2c_tables"] = "3:zz";
  const std::string broken = (dir / "broken.safetensors").string();
  io::safetensors::save(broken, meta.tensors, meta.metadata);
  refuses<FormatError>([&] { l2c::export_file(broken, (dir / "o.bin").string()); }, broken, {"llama2c_tables", "3:zz"});
  meta.metadata["llama2c_tables"] = "100000:00000000";
  io::safetensors::save(broken, meta.tensors, meta.metadata);
  refuses<FormatError>([&] { l2c::export_file(broken, (dir / "o.bin").string()); }, broken, {"index 100000"});
}
