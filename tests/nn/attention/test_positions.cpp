// Position-aware attention: RoPE (ops/rope.hpp; the op itself: tests/ops/test_rope.cpp) and
// ALiBi (Visibility::alibi), inside MultiHeadAttention and GPT, with the KV cache, and saved in
// checkpoint metadata.
// Expected values are written out from the published definitions (Su et al. 2021 for RoPE,
// Press et al. 2022 for ALiBi), never computed by the code under test.
#include <cmath>
#include <limits>

#include "tests/support/helpers.hpp"
#include <xgrad/train/checkpoint.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xgt;
using ops::RopeConfig;
using ops::RopeLayout;

namespace {

std::vector<std::int64_t> iota(std::size_t n, std::int64_t start = 0) {
  std::vector<std::int64_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<std::int64_t>(i);
  return v;
}

RopeConfig rope_cfg(RopeLayout layout, double fraction = 1.0, double base = 10000.0) {
  RopeConfig c;
  c.layout = layout;
  c.fraction = fraction;
  c.base = base;
  return c;
}

}  // namespace

TEST_CASE("alibi: standard slopes for powers of two and not", "[nn][alibi]") {
  // H = 8: 2^-1 .. 2^-8 (the paper's example).
  const std::vector<double> s8 = alibi_slopes(8);
  REQUIRE(s8.size() == 8);
  for (std::size_t h = 0; h < 8; ++h) CHECK(s8[h] == std::ldexp(1.0, -int(h) - 1));
  // H = 4: 2^-2, 2^-4, 2^-6, 2^-8.
  CHECK(alibi_slopes(4) == std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625});
  // H = 6: the 4 slopes of 4 heads, then slopes 0 and 2 of 8 heads (2^-1, 2^-3).
  CHECK(alibi_slopes(6) == std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125});
  // H = 12: the 8 slopes of 8 heads, then slopes 0, 2, 4, 6 of 16 heads: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
  const std::vector<double> s12 = alibi_slopes(12);
  REQUIRE(s12.size() == 12);
  for (std::size_t h = 0; h < 8; ++h) CHECK(s12[h] == s8[h]);
  const double tail[] = {0.7071067811865476, 0.3535533905932738, 0.1767766952966369, 0.08838834764831845};
  for (std::size_t k = 0; k < 4; ++k) CHECK(std::abs(s12[8 + k] - tail[k]) < 1e-15);
  CHECK(alibi_slopes(1) == std::vector<double>{1.0 / 256.0});
  CHECK_THROWS_AS(alibi_slopes(0), ValueError);
}

TEST_CASE("alibi: the bias rows composed with causal/documents/key padding", "[nn][alibi][visibility]") {
  const std::vector<Position> p = iota(4);
  // 4 heads, query 3 over keys 0..3: -m_h * (3 - j).
  const Array B = (Visibility::alibi(alibi_slopes(4), p, p) & Visibility::causal(4, 4)).bias(DType::float64);
  REQUIRE(B.shape() == Shape{1, 4, 4, 4});
  const double m[] = {0.25, 0.0625, 0.015625, 0.00390625};
  for (std::size_t h = 0; h < 4; ++h)
    for (std::size_t j = 0; j < 4; ++j) CHECK(B.at({0, h, 3, j}) == -m[h] * double(3 - j));
  CHECK(B.at({0, 0, 1, 0}) == -0.25);
  CHECK(B.at({0, 0, 1, 2}) == -std::numeric_limits<double>::infinity());  // causal hides the future
  // Alone (bidirectional): symmetric distance, nothing hidden.
  const Array Bb = Visibility::alibi({0.5}, p, p).bias(DType::float64);
  CHECK(Bb.at({0, 0, 1, 3}) == -1.0);
  CHECK(Bb.at({0, 0, 3, 1}) == -1.0);
  // Hard sets intersect, soft biases add: with an additive bias the two add up.
  Array extra = Array::zeros({4, 4}, DType::float64);
  extra.set_flat(3 * 4 + 1, 0.125);
  const Array Bs = (Visibility::alibi({0.5}, p, p) & Visibility::additive(extra) & Visibility::key_lengths({3}, 4))
                       .bias(DType::float64);
  CHECK(Bs.at({0, 0, 3, 1}) == -1.0 + 0.125);
  CHECK(Bs.at({0, 0, 3, 3}) == -std::numeric_limits<double>::infinity());
  // Cached decoding layout: one query at position 5 over keys 0..5.
  const Array Bc = Visibility::alibi({0.5}, {5}, iota(6)).bias(DType::float64);
  CHECK(Bc.at({0, 0, 0, 0}) == -2.5);
  // Errors.
  CHECK_THROWS_WITH(Visibility::alibi({}, p, p), Catch::Contains("alibi: needs one slope per head"));
  CHECK_THROWS_WITH(Visibility::alibi({0.5, -1.0}, p, p), Catch::Contains("slope of head 1 is -1"));
  CHECK_THROWS_AS(Visibility::alibi({std::nan("")}, p, p), ValueError);
  CHECK_THROWS_WITH(Visibility::alibi({0.5}, {-1}, p), Catch::Contains("q_pos has the position -1"));
  CHECK_THROWS_AS(Visibility::alibi({0.5, 0.25}, p, p) & Visibility::alibi({0.5, 0.25, 0.125}, p, p), ShapeError);
}

TEST_CASE("alibi: the fused and composed attention paths agree on outputs and gradients", "[nn][alibi][fused]") {
  Generator g(13);
  const std::size_t B = 2, H_q = 6, H_kv = 3, T = 70, S = 70, d = 5;
  IndexArray docs({T}, std::vector<std::int64_t>(T, 0));
  for (std::size_t i = 30; i < T; ++i) docs.data[i] = 1;
  const std::vector<Position> p = iota(T);
  const Visibility A = Visibility::alibi(alibi_slopes(H_q), p, p);
  for (const Visibility& vis : {A & Visibility::causal(T, S), A & Visibility::documents(docs), A,
                                A & Visibility::key_lengths({70, 40}, S)}) {
    const Array q = rnd({B, H_q, T, d}, g, -2, 2), k = rnd({B, H_kv, S, d}, g, -2, 2), v = rnd({B, H_kv, S, d}, g);
    const Array G = rnd({B, H_q, T, d}, g);
    std::vector<Array> out[2];
    for (int c = 0; c < 2; ++c) {
      Tensor Q(q, true), K(k, true), V(v, true);
      SdpaOptions o;
      o.impl = c == 0 ? SdpaImpl::composed : SdpaImpl::fused;
      const Tensor O = scaled_dot_product_attention(Q, K, V, vis, o).output;
      out[c] = grad(O, {Q, K, V}, G);
      out[c].push_back(O.value());
    }
    for (std::size_t i = 0; i < 4; ++i) CHECK(max_abs_diff(out[0][i], out[1][i]) < 1e-12);
  }
}

namespace {

AttentionConfig mha_config(std::size_t d, std::size_t H_q, std::size_t H_kv) {
  AttentionConfig c;
  c.d_model = d;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.dtype = DType::float64;
  return c;
}

// Biases drawn at random too (they start at zero), so every term of the projection shows.
void randomise(MultiHeadAttention& m, Generator& g) {
  Tensor b = m.b_QKV;
  b.set_value(rnd(b.shape(), g));
}

// Chunked cached decoding of X [B, T, d] concatenated along T.
Array cached_run(MultiHeadAttention& m, const Array& X, const std::vector<std::size_t>& chunks) {
  KVCache cache = m.make_cache(X.shape()[0], X.shape()[1]);
  std::vector<Tensor> outs;
  std::size_t at = 0;
  for (std::size_t n : chunks) {
    outs.push_back(m.forward_cached(ops::slice(Tensor(X), 1, long(at), long(at + n)), cache).Y);
    at += n;
  }
  return ops::concat(outs, 1).value();
}

}  // namespace

TEST_CASE("attention with RoPE or ALiBi: the KV cache (prefill/chunked/one token) equals the full pass",
          "[nn][rope][alibi][kv_cache]") {
  Generator g(14);
  const std::size_t T = 7;
  for (int kind = 0; kind < 4; ++kind)
    for (std::size_t H_kv : {4, 2}) {
      AttentionConfig c = mha_config(16, 4, H_kv);
      if (kind == 0) c.rope = rope_cfg(RopeLayout::interleaved);
      if (kind == 1) c.rope = rope_cfg(RopeLayout::half_split, 0.5, 500.0);
      if (kind == 2) c.alibi = true;
      if (kind == 3) {
        c.alibi = true;
        c.rope = rope_cfg(RopeLayout::interleaved);
      }
      INFO("kind " << kind << " H_kv " << H_kv);
      MultiHeadAttention m(c, g);
      randomise(m, g);
      const Array X = rnd({2, T, 16}, g);
      std::vector<std::pair<std::string, Array>> weights;
      for (const auto& np : m.named_parameters()) weights.emplace_back(np.first, np.second.value());
      for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
        AttentionConfig ci = c;
        ci.impl = impl;
        MultiHeadAttention mi(ci, weights);
        AttentionCall causal;
        causal.visibility = Visibility::causal(T, T);
        const AttentionOutput whole = mi.forward(Tensor(X), causal);
        CHECK(whole.path == impl);
        const Array full = whole.Y.value();
        CHECK(max_abs_diff(full, m(Tensor(X), Visibility::causal(T, T)).value()) < 1e-12);
        CHECK(max_abs_diff(cached_run(mi, X, {T}), full) < 1e-12);
        CHECK(max_abs_diff(cached_run(mi, X, {3, 2, 2}), full) < 1e-12);
        CHECK(max_abs_diff(cached_run(mi, X, {1, 1, 1, 1, 1, 1, 1}), full) < 1e-12);
      }
      // The cached keys are stored rotated: the cache holds RoPE(K) at their positions.
      if (c.rope) {
        KVCache cache = m.make_cache(2, T);
        m.forward_cached(Tensor(X), cache);
        const auto parts = ops::split(ops::matmul(Tensor(X), m.W_QKV) + m.b_QKV, {16, 4 * H_kv, 4 * H_kv}, -1);
        const Array K = ops::rope(split_heads(parts[1], H_kv), iota(T), *c.rope).value();
        CHECK(max_abs_diff(cache.keys(), K) < 1e-14);
      }
    }
}

TEST_CASE("attention with RoPE: the layer's gradients pass gradcheck (both paths)", "[nn][rope][gradcheck]") {
  Generator g(15);
  for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
    AttentionConfig c = mha_config(8, 2, 1);
    c.rope = rope_cfg(RopeLayout::half_split);
    c.alibi = impl == SdpaImpl::fused;
    c.impl = impl;
    MultiHeadAttention m(c, g);
    require_gradcheck([&](const std::vector<Tensor>& in) { return m(in[0], Visibility::causal(4, 4)); },
                      {rnd({1, 4, 8}, g)}, {"X"});
    AttentionCall causal;
    causal.visibility = Visibility::causal(4, 4);
    CHECK(m.forward(Tensor(rnd({1, 4, 8}, g)), causal).path == impl);  // the path checked is the one named
  }
}

namespace {

GPT make_gpt(PositionScheme pos, Generator& g, std::size_t layers = 2) {
  TransformerConfig c;
  c.V_vocab = 11;
  c.context = 16;
  c.d_model = 16;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = layers;
  c.dtype = DType::float64;
  c.pos = pos;
  c.rope.layout = RopeLayout::half_split;
  return GPT(c, g);
}

}  // namespace

TEST_CASE("GPT with rope/alibi/none: cached decoding equals the full forward and prefixes are isolated",
          "[nn][rope][alibi][gpt][kv_cache]") {
  for (const PositionScheme pos : {PositionScheme::rope, PositionScheme::alibi, PositionScheme::none}) {
    INFO(position_scheme_name(pos));
    Generator g(16);
    GPT gpt = make_gpt(pos, g);
    gpt.eval();
    // No learned position table is a parameter.
    for (const auto& np : gpt.named_parameters()) CHECK(np.first.rfind("pos", 0) != 0);
    CHECK(gpt.parameter_count() == train::parameter_count(train::ModelKind::gpt, gpt.config()));
    const std::size_t T = 9;
    IndexArray tokens({2, T}, std::vector<std::int64_t>(2 * T));
    for (std::size_t i = 0; i < tokens.data.size(); ++i) tokens.data[i] = static_cast<std::int64_t>((i * 7 + 3) % 11);
    const Array full = gpt.logits(tokens).value();
    for (const std::vector<std::size_t>& chunks :
         {std::vector<std::size_t>{T}, {4, 3, 2}, std::vector<std::size_t>(T, 1)}) {
      auto caches = gpt.make_caches(2, T);
      std::vector<Tensor> outs;
      std::size_t at = 0;
      for (std::size_t n : chunks) {
        std::vector<std::int64_t> ids;
        for (std::size_t b = 0; b < 2; ++b)
          for (std::size_t i = 0; i < n; ++i) ids.push_back(tokens.data[b * T + at + i]);
        const IndexArray piece({2, n}, ids);
        outs.push_back(gpt.logits_cached(piece, caches));
        at += n;
      }
      CHECK(max_abs_diff(ops::concat(outs, 1).value(), full) < 1e-11);
    }
    // Prefix isolation: changing token 5 changes nothing before position 5, and something after.
    IndexArray changed = tokens;
    changed.data[5] = (changed.data[5] + 1) % 11;
    const Array other = gpt.logits(changed).value();
    const std::size_t V = 11;
    double before = 0, after = 0;
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t v = 0; v < V; ++v) {
        const double d = std::abs(other.at({0, t, v}) - full.at({0, t, v}));
        (t < 5 ? before : after) = std::max(t < 5 ? before : after, d);
      }
    CHECK(before == 0.0);
    CHECK(after > 1e-6);
  }
}

TEST_CASE("GPT position schemes differ in what they see / encoder-decoder refuses non-learned",
          "[nn][rope][alibi][gpt]") {
  // Without position information, one causal layer at position 2 attends to the set of
  // tokens 0..2 whatever their order: swapping tokens 0 and 1 leaves position 2's logits
  // unchanged for 'none', and changes them for rope and alibi.
  for (const PositionScheme pos : {PositionScheme::none, PositionScheme::rope, PositionScheme::alibi}) {
    Generator g(17);
    GPT gpt = make_gpt(pos, g, 1);
    const IndexArray a({1, 3}, {1, 2, 3}), b({1, 3}, {2, 1, 3});
    const Array la = gpt.logits(a).value(), lb = gpt.logits(b).value();
    double d = 0;
    for (std::size_t v = 0; v < 11; ++v) d = std::max(d, std::abs(la.at({0, 2, v}) - lb.at({0, 2, v})));
    INFO(position_scheme_name(pos));
    if (pos == PositionScheme::none)
      CHECK(d < 1e-12);
    else
      CHECK(d > 1e-6);
  }
  TransformerConfig c;
  c.V_vocab = 5;
  c.context = 8;
  c.d_model = 8;
  c.H_q = 2;
  c.pos = PositionScheme::rope;
  Generator g(1);
  CHECK_THROWS_WITH(EncoderDecoder(c, g), Catch::Contains("learned position embeddings only"));
  c.rope.fraction = 0.2;  // d_h = 4: floor(0.8) = 0 features
  CHECK_THROWS_AS(c.resolved(), ValueError);
  CHECK(position_scheme_from_name("alibi") == PositionScheme::alibi);
  CHECK_THROWS_WITH(position_scheme_from_name("sinusoidal"), Catch::Contains("unknown position scheme 'sinusoidal'"));
}

TEST_CASE("checkpoint metadata: the position scheme round-trips / without the key it is learned",
          "[train][checkpoint][rope]") {
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "sort";
  info.vocab = text::Vocabulary{{"a", "b", "c"}};
  info.config.V_vocab = 3;
  info.config.context = 8;
  info.config.d_model = 8;
  info.config.H_q = 2;
  info.config.pos = PositionScheme::rope;
  info.config.rope.base = 500.0;
  info.config.rope.fraction = 0.5;
  info.config.rope.layout = RopeLayout::half_split;
  auto meta = train::model_metadata(info);
  CHECK(meta.at("pos") == "rope");
  CHECK(meta.at("rope_layout") == "half-split");
  const train::ModelInfo back = train::model_info(meta, "m");
  CHECK(back.config.pos == PositionScheme::rope);
  CHECK(back.config.rope.base == 500.0);
  CHECK(back.config.rope.fraction == 0.5);
  CHECK(back.config.rope.layout == RopeLayout::half_split);
  auto bad = meta;
  bad["rope_layout"] = "neox";
  CHECK_THROWS_WITH(train::model_info(bad, "m"), Catch::Contains("'rope_layout' = 'neox'"));
  bad = meta;
  bad["rope_fraction"] = "2";
  CHECK_THROWS_AS(train::model_info(bad, "m"), FormatError);
  bad = meta;
  bad.erase("rope_base");
  CHECK_THROWS_WITH(train::model_info(bad, "m"), Catch::Contains("lacks 'rope_base'"));
  bad = meta;
  bad["pos"] = "sinusoidal";
  CHECK_THROWS_WITH(train::model_info(bad, "m"), Catch::Contains("'pos' = 'sinusoidal'"));
  auto old = meta;  // a checkpoint written before the key existed
  old.erase("pos");
  CHECK(train::model_info(old, "m").config.pos == PositionScheme::learned);
  info.config.pos = PositionScheme::learned;  // the default writes no key (old files stay identical)
  CHECK(train::model_metadata(info).count("pos") == 0);
  bad = meta;
  bad["pos"] = "learned";
  CHECK(train::model_info(bad, "m").config.pos == PositionScheme::learned);
  auto encdec = meta;
  encdec["model"] = "encoder_decoder";
  CHECK_THROWS_AS(train::model_info(encdec, "m"), FormatError);
}

// ---- Per-call positions (AttentionCall::positions, GPTCall): packed documents

namespace {

// Four documents of lengths 3, 5, 1, 4 packed into T = 13 positions: document ids, positions
// that restart at 0 in each document, and each document's first position in the pack.
struct Packing {
  std::vector<std::size_t> lens = {3, 5, 1, 4}, offsets;
  std::vector<std::int64_t> doc, pos;
  std::size_t T = 0;
  Packing() {
    for (std::size_t d = 0; d < lens.size(); ++d) {
      offsets.push_back(T);
      for (std::size_t i = 0; i < lens[d]; ++i) {
        doc.push_back(static_cast<std::int64_t>(d));
        pos.push_back(static_cast<std::int64_t>(i));
      }
      T += lens[d];
    }
  }
  Visibility documents() const { return Visibility::documents(IndexArray({T}, doc)); }
};

Array slice_positions(const Array& a, std::size_t at, std::size_t n) {
  return ops::slice(Tensor(a), 1, long(at), long(at + n)).value();
}

}  // namespace

TEST_CASE("attention positions: packed documents with restarted positions equal each document alone on both paths",
          "[nn][rope][alibi][window][positions]") {
  const Packing pk;
  struct Kind {
    const char* name;
    bool rope, alibi;
    std::size_t window;
  };
  for (const Kind& k : {Kind{"rope", true, false, 0}, Kind{"alibi, window 2", false, true, 2},
                        Kind{"window 4", false, false, 4}, Kind{"rope, alibi, window 3", true, true, 3}}) {
    INFO(k.name);
    Generator g(31);
    AttentionConfig c = mha_config(16, 4, 2);
    if (k.rope) c.rope = rope_cfg(RopeLayout::half_split, 1.0, 100.0);
    c.alibi = k.alibi;
    c.window = k.window;
    MultiHeadAttention base(c, g);
    randomise(base, g);
    std::vector<std::pair<std::string, Array>> weights;
    for (const auto& np : base.named_parameters()) weights.emplace_back(np.first, np.second.value());
    const Array X = rnd({2, pk.T, 16}, g), G = rnd({2, pk.T, 16}, g);
    for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
      INFO((impl == SdpaImpl::fused ? "fused" : "composed"));
      AttentionConfig ci = c;
      ci.impl = impl;
      MultiHeadAttention m(ci, weights);
      Tensor Xp(X, true);
      AttentionCall packed;
      packed.visibility = pk.documents();  // causal inside each document
      packed.positions = pk.pos;
      const AttentionOutput out = m.forward(Xp, packed);
      CHECK(out.path == impl);
      const Array dX = grad(out.Y, {Xp}, G)[0];
      for (std::size_t d = 0; d < pk.lens.size(); ++d) {
        const std::size_t at = pk.offsets[d], n = pk.lens[d];
        Tensor Xd(slice_positions(X, at, n), true);
        AttentionCall alone;
        alone.visibility = Visibility::causal(Position(n), Position(n));
        const AttentionOutput od = m.forward(Xd, alone);
        CHECK(od.path == impl);
        const Array dXd = grad(od.Y, {Xd}, slice_positions(G, at, n))[0];
        INFO("document " << d);
        // Not bit for bit: the pack's projections multiply [2 T, d] rows, each document alone
        // [2 n, d]; whether a row rounds the same in batches of other shapes depends on the BLAS
        // kernel. The fused backward's GEMMs also sum over the whole block of rows, where the
        // other documents add exact zeros at other places of the partial sums. The same sums in
        // another order: a few ulps of the longest reduction (the pack's T keys, or d_model).
        XGT_CHECK_WITHIN(slice_positions(out.Y.value(), at, n), od.Y.value(),
                         rounding_bound(pk.T + 16, DType::float64, std::max(1.0, max_abs(od.Y.value()))));
        XGT_CHECK_WITHIN(slice_positions(dX, at, n), dXd, rounding_bound(pk.T + 16, DType::float64, std::max(1.0, max_abs(dXd))));
      }
      // The positions are used: under plain causal attention over the whole pack (documents see
      // each other), restarted positions give other outputs than 0 .. T-1.
      AttentionCall causal;
      causal.visibility = Visibility::causal(Position(pk.T), Position(pk.T));
      const Array by_index = m.forward(Tensor(X), causal).Y.value();
      causal.positions = pk.pos;
      CHECK(max_abs_diff(m.forward(Tensor(X), causal).Y.value(), by_index) > 1e-6);
    }
  }
}

TEST_CASE("GPT positions: packed documents with restarted positions give each document's logits alone on both paths",
          "[nn][rope][alibi][gpt][positions]") {
  const Packing pk;
  for (const PositionScheme scheme :
       {PositionScheme::learned, PositionScheme::rope, PositionScheme::alibi, PositionScheme::none}) {
    for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
      INFO(position_scheme_name(scheme) << (impl == SdpaImpl::fused ? " fused" : " composed"));
      TransformerConfig c;
      c.V_vocab = 11;
      c.context = 16;
      c.d_model = 16;
      c.H_q = 4;
      c.H_kv = 2;
      c.layers = 2;
      c.dtype = DType::float64;
      c.pos = scheme;
      c.window = scheme == PositionScheme::alibi ? 3 : 0;
      c.rope.layout = RopeLayout::half_split;
      c.impl = impl;
      Generator g(18);  // the same weights for both paths
      GPT gpt(c, g);
      gpt.eval();
      for (auto& np : gpt.named_parameters()) {  // weights of order 1, so positions show in the scores
        Tensor t = np.second;
        t.set_value(rnd(t.shape(), g, -0.6, 0.6));
      }
      IndexArray tokens({2, pk.T}, std::vector<std::int64_t>(2 * pk.T));
      for (std::size_t i = 0; i < tokens.data.size(); ++i) tokens.data[i] = static_cast<std::int64_t>((i * 7 + 3) % 11);
      GPTCall call;
      call.positions = pk.pos;
      call.visibility = pk.documents();
      const Array packed = gpt.logits(tokens, call).value();
      for (std::size_t d = 0; d < pk.lens.size(); ++d) {
        const std::size_t at = pk.offsets[d], n = pk.lens[d];
        IndexArray alone({2, n}, std::vector<std::int64_t>(2 * n));
        for (std::size_t b = 0; b < 2; ++b)
          for (std::size_t i = 0; i < n; ++i) alone.data[b * n + i] = tokens.data[b * pk.T + at + i];
        INFO("document " << d);
        const Array logits_alone = gpt.logits(alone).value();
        // Not bit for bit: the packed batch multiplies [2 T, d] rows where each document alone
        // multiplies [2 n, d], and whether a row's dot products round the same way in batches of
        // other shapes depends on the BLAS kernel (it holds for OpenBLAS's Haswell kernels, not
        // for its SkylakeX or generic ones). Every logit is the same sums in another order: a few
        // ulps of the widest reduction (d_ff = 4 d_model) per layer, scaled by the logits' size.
        XGT_CHECK_WITHIN(slice_positions(packed, at, n), logits_alone,
                         rounding_bound(4 * c.d_model * c.layers, DType::float64, std::max(1.0, max_abs(logits_alone))));
      }
      // The positions are used: without the document rule, restarted positions change the logits.
      if (scheme != PositionScheme::none) {
        GPTCall positions_only;
        positions_only.positions = pk.pos;
        CHECK(max_abs_diff(gpt.logits(tokens, positions_only).value(), gpt.logits(tokens).value()) > 1e-6);
      }
      // The loss with the same call is the cross-entropy of those logits.
      IndexArray targets = tokens;
      for (auto& t : targets.data) t = (t + 1) % 11;
      CHECK(gpt.loss(tokens, targets, call).value().item() ==
            ops::cross_entropy(Tensor(packed), targets).value().item());
      // The layers run the configured path: a composed GPT returns its attention maps, a fused
      // one refuses to form them (AttentionOutput::path; the fused core never forms weights).
      std::vector<AttentionOutput> maps;
      if (impl == SdpaImpl::fused) {
        CHECK_THROWS_WITH(gpt.logits(tokens, call, nullptr, &maps), Catch::Contains("fused path does not form"));
      } else {
        gpt.logits(tokens, call, nullptr, &maps);
        REQUIRE(maps.size() == 2);
        for (const AttentionOutput& a : maps) CHECK(a.path == SdpaImpl::composed);
      }
    }
  }
}

TEST_CASE("attention positions: wrong length/negative/past the context or where unused are errors naming them",
          "[nn][positions][errors]") {
  Generator g(32);
  AttentionConfig c = mha_config(8, 2, 1);
  c.rope = rope_cfg(RopeLayout::interleaved);
  MultiHeadAttention m(c, g);
  const Tensor X(rnd({1, 4, 8}, g));
  AttentionCall call;
  call.positions = {0, 1, 2};
  CHECK_THROWS_AS(m.forward(X, call), ShapeError);
  CHECK_THROWS_WITH(m.forward(X, call), Catch::Contains("positions has 3 entries") && Catch::Contains("T = 4"));
  call.positions = {0, 1, -2, 3};
  CHECK_THROWS_AS(m.forward(X, call), ValueError);
  CHECK_THROWS_WITH(m.forward(X, call), Catch::Contains("positions[2] = -2 is negative"));
  AttentionConfig plain = mha_config(8, 2, 1);  // no RoPE, ALiBi or window: still checked
  MultiHeadAttention mp(plain, g);
  CHECK_THROWS_WITH(mp.forward(X, call), Catch::Contains("positions[2] = -2 is negative"));
  call.positions = {4, 5, 6, 7};
  KVCache cache = m.make_cache(1, 8);
  CHECK_THROWS_WITH(m.forward_cached(X, cache, call), Catch::Contains("call.positions must be empty"));
  CHECK(cache.next_position() == 0);
  CrossAttentionConfig cc;
  cc.d_q = 8;
  cc.d_m = 8;
  cc.H_q = 2;
  cc.dtype = DType::float64;
  CrossAttention ca(cc, g);
  CHECK_THROWS_WITH(ca.forward(X, X, call), Catch::Contains("cross-attention uses no positions"));

  TransformerConfig t;
  t.V_vocab = 5;
  t.context = 6;
  t.d_model = 8;
  t.H_q = 2;
  t.layers = 1;
  t.dtype = DType::float64;
  GPT gpt(t, g);
  const IndexArray tokens({1, 4}, {1, 2, 3, 4});
  GPTCall gc;
  gc.positions = {0, 1, 6, 2};
  CHECK_THROWS_WITH(gpt.logits(tokens, gc), Catch::Contains("positions[2] = 6 is not below the context length 6"));
  gc.positions = {0, 1};
  CHECK_THROWS_AS(gpt.logits(tokens, gc), ShapeError);
  gc.positions = {0, -1, 0, 1};
  CHECK_THROWS_WITH(gpt.logits(tokens, gc), Catch::Contains("gpt") && Catch::Contains("positions[1] = -1"));
}
