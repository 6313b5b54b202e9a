// Sliding-window causal visibility (Visibility::sliding_window) and the windowed KV cache
// (KVCache::windowed): the boundary q - W < k <= q checked against masks built here from the
// definition, the tight key range the fused path reads, intersections with padding and
// documents, composed == fused, and a windowed GPT decoded with a bounded cache equal to its
// full forward.
#include <algorithm>
#include <cmath>
#include <limits>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/transformer.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

std::vector<std::int64_t> iota(std::size_t n, std::int64_t start = 0) {
  std::vector<std::int64_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<std::int64_t>(i);
  return v;
}

// The definition, written out: key j visible to query i iff q[i] - W < k[j] <= q[i].
std::vector<unsigned char> window_mask(const std::vector<std::int64_t>& q, const std::vector<std::int64_t>& k,
                                       std::int64_t W) {
  std::vector<unsigned char> m;
  for (std::int64_t qi : q)
    for (std::int64_t kj : k) m.push_back(qi - W < kj && kj <= qi);
  return m;
}

std::vector<unsigned char> expand(const Visibility& v, std::size_t B, std::size_t H, std::size_t T, std::size_t S) {
  return v.expand_allowed("test", {B, H, T, S});
}

std::string str(const std::vector<unsigned char>& m, std::size_t S) {
  std::string s;
  for (std::size_t i = 0; i < m.size(); ++i) s += (m[i] ? '1' : '.') + std::string(i % S == S - 1 ? "\n" : "");
  return s;
}

}  // namespace

TEST_CASE("sliding window: the boundary q - W < k <= q on a square mask", "[visibility][window]") {
  // W = 2 over 5 positions, written by hand: each row sees itself and the one before.
  CHECK(str(expand(Visibility::sliding_window(5, 5, 2), 1, 1, 5, 5), 5) ==
        "1....\n"
        "11...\n"
        ".11..\n"
        "..11.\n"
        "...11\n");
  // W = 1: only itself (the identity).
  CHECK(str(expand(Visibility::sliding_window(4, 4, 1), 1, 1, 4, 4), 4) ==
        "1...\n"
        ".1..\n"
        "..1.\n"
        "...1\n");
  for (std::int64_t T : {1, 3, 6, 9})
    for (std::int64_t W = 1; W <= T + 2; ++W) {
      INFO("T " << T << " W " << W);
      CHECK(expand(Visibility::sliding_window(T, T, W), 1, 1, T, T) == window_mask(iota(T), iota(T), W));
      if (W >= T)  // a window covering the whole sequence is plain causal
        CHECK(expand(Visibility::sliding_window(T, T, W), 1, 1, T, T) == expand(Visibility::causal(T, T), 1, 1, T, T));
    }
}

TEST_CASE("sliding window: suffix and cached (absolute-position) layouts", "[visibility][window]") {
  // (T, S, W): T queries are the last T of S positions, as causal(T, S).
  for (std::int64_t S : {1, 4, 7})
    for (std::int64_t T = 1; T <= S; ++T)
      for (std::int64_t W : {1, 2, 3, 10}) {
        INFO("T " << T << " S " << S << " W " << W);
        CHECK(expand(Visibility::sliding_window(T, S, W), 1, 1, T, S) == window_mask(iota(T, S - T), iota(S), W));
      }
  // A cache that dropped its oldest keys: keys at 7..11, queries at 10..12 (one beyond).
  const auto q = iota(3, 10), k = iota(5, 7);
  CHECK(expand(Visibility::sliding_window(q, k, 3), 1, 1, 3, 5) == window_mask(q, k, 3));
  // Keys in any order (positions not ascending), repeated positions, negative positions.
  const std::vector<std::int64_t> kk = {5, 2, 9, 4, 4, -1, 8, 7}, qq = {4, 9, 0, 8, -1};
  for (std::int64_t W : {1, 2, 4, 20}) CHECK(expand(Visibility::sliding_window(qq, kk, W), 1, 1, 5, 8) == window_mask(qq, kk, W));
  // Extreme positions do not overflow.
  const std::int64_t lo = std::numeric_limits<std::int64_t>::min(), hi = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::int64_t> ext = {lo, lo + 1, 0, hi - 1, hi};
  CHECK(str(expand(Visibility::sliding_window(ext, ext, 2), 1, 1, 5, 5), 5) ==
        "1....\n"
        "11...\n"
        "..1..\n"
        "...1.\n"
        "...11\n");
  // W = 2^63 - 1: distances of 2^63 - 1 and more (from the negative extreme) are outside.
  CHECK(str(expand(Visibility::sliding_window(ext, ext, hi), 1, 1, 5, 5), 5) ==
        "1....\n"
        "11...\n"
        "..1..\n"
        "..11.\n"
        "...11\n");
}

TEST_CASE("sliding window: the plan gives the tight key range the fused path reads", "[visibility][window]") {
  const std::int64_t T = 6, S = 10, W = 3;
  const VisibilityPlan p = Visibility::sliding_window(T, S, W).plan("test", {1, 1, T, S});
  for (std::size_t i = 0; i < std::size_t(T); ++i) {
    std::size_t lo = 99, hi = 99;
    const bool exact = p.range(0, 0, i, lo, hi);
    const std::size_t q = S - T + i;  // keys q-2, q-1, q
    CHECK(exact);
    CHECK(lo == q - 2);
    CHECK(hi == q + 1);
  }
  // Intersected with key padding (length 8 of 10): the range shrinks, and apply() agrees.
  const Visibility v = Visibility::sliding_window(T, S, W) & Visibility::key_lengths({8}, S);
  const VisibilityPlan pv = v.plan("test", {1, 1, T, S});
  std::size_t lo = 0, hi = 0;
  pv.range(0, 0, 5, lo, hi);  // query at 9: window 7..9, padding keeps 7
  CHECK(lo == 7);
  CHECK(hi == 8);
  pv.range(0, 0, 4, lo, hi);  // query at 8: window 6..8, padding keeps 6, 7
  CHECK(lo == 6);
  CHECK(hi == 8);
}

TEST_CASE("sliding window: bad arguments", "[visibility][window][errors]") {
  CHECK_THROWS_WITH(Visibility::sliding_window(3, 3, 0), Catch::Contains("[visibility]") && Catch::Contains("W = 0"));
  CHECK_THROWS_AS(Visibility::sliding_window(3, 3, 0), ValueError);
  CHECK_THROWS_WITH(Visibility::sliding_window({0, 1}, {0, 1}, -2), Catch::Contains("W = -2"));
  CHECK_THROWS_AS(Visibility::sliding_window(4, 3, 2), ShapeError);
  CHECK_THROWS_WITH(Visibility::sliding_window(-1, 3, 2), Catch::Contains("T must be >= 0"));
  // A [T, S] window does not broadcast to scores of another T.
  CHECK_THROWS_AS(Visibility::sliding_window(3, 3, 2).plan("test", {1, 1, 4, 3}), ShapeError);
}

TEST_CASE("sliding window: intersections with padding/documents/dense masks", "[visibility][window]") {
  const std::size_t B = 2, T = 7;
  const std::int64_t W = 3;
  const auto win = window_mask(iota(T), iota(T), W);
  // Key padding: sample 0 has 7 keys, sample 1 has 4.
  const std::vector<std::int64_t> len = {7, 4};
  const auto got = expand(Visibility::sliding_window(T, T, W) & Visibility::key_lengths(len, T), B, 1, T, T);
  // Documents [0 0 0 1 1 1 1] (causal inside each): a query sees keys of its document in the window.
  const std::vector<std::int64_t> doc = {0, 0, 0, 1, 1, 1, 1};
  const auto got_doc = expand(Visibility::sliding_window(T, T, W) & Visibility::documents(IndexArray({T}, doc)), 1, 1, T, T);
  // A dense forbidden mask hiding key 2 from every query.
  BoolArray hide = BoolArray::filled({T, T}, false);
  for (std::size_t i = 0; i < T; ++i) hide.data[i * T + 2] = 1;
  const auto got_dense = expand(Visibility::forbidden(hide) & Visibility::sliding_window(T, T, W), 1, 1, T, T);
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j < T; ++j) {
      INFO("i " << i << " j " << j);
      for (std::size_t b = 0; b < B; ++b)
        CHECK(got[(b * T + i) * T + j] == (win[i * T + j] && std::int64_t(j) < len[b]));
      CHECK(got_doc[i * T + j] == (win[i * T + j] && doc[i] == doc[j]));
      CHECK(got_dense[i * T + j] == (win[i * T + j] && j != 2));
    }
  // The bias agrees with expand_allowed (0 where allowed, -inf elsewhere).
  const Array bias = (Visibility::sliding_window(T, T, W) & Visibility::key_lengths(len, T)).bias(DType::float64);
  for (std::size_t k = 0; k < got.size(); ++k)
    CHECK((bias.flat(k) == 0.0) == (got[k] != 0));
}

TEST_CASE("sliding window: the fused path equals the composed path and a dense mask from the definition",
          "[visibility][window][fused]") {
  Generator g(11);
  struct C {
    std::size_t B, H_q, H_kv, T, S;
    std::int64_t W;
    bool padding;
  };
  // T > 128 spans several query blocks of the fused kernel; a wide S has many skipped tiles.
  for (const C c : {C{2, 2, 1, 5, 5, 2, true}, C{1, 2, 2, 4, 9, 3, false}, C{1, 1, 1, 150, 300, 17, true},
                    C{2, 4, 2, 6, 6, 1, false}, C{1, 1, 1, 6, 6, 40, true}}) {
    INFO("T " << c.T << " S " << c.S << " W " << c.W);
    Visibility vis = Visibility::sliding_window(c.T, c.S, c.W);
    // The same set built independently: a dense allowed mask from the definition.
    std::vector<unsigned char> dense = window_mask(iota(c.T, c.S - c.T), iota(c.S), c.W);
    std::vector<unsigned char> bytes;
    std::vector<std::int64_t> len(c.B, static_cast<std::int64_t>(c.S));
    if (c.padding) len[0] = static_cast<std::int64_t>(c.S) - 1;
    for (std::size_t b = 0; b < c.B; ++b)
      for (std::size_t i = 0; i < c.T; ++i)
        for (std::size_t j = 0; j < c.S; ++j) bytes.push_back(dense[i * c.S + j] && std::int64_t(j) < len[b]);
    const BoolArray allowed({c.B, 1, c.T, c.S}, bytes);
    vis = vis & Visibility::key_lengths(len, c.S);
    const Visibility ref_vis = Visibility::allowed(allowed);
    const Array Qa = rnd({c.B, c.H_q, c.T, 4}, g, -2, 2), Ka = rnd({c.B, c.H_kv, c.S, 4}, g, -2, 2),
                Va = rnd({c.B, c.H_kv, c.S, 3}, g, -2, 2), G = rnd({c.B, c.H_q, c.T, 3}, g);
    std::vector<Array> res[3];
    int k = 0;
    for (SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused, SdpaImpl::composed}) {
      Tensor Q(Qa, true), K(Ka, true), V(Va, true);
      SdpaOptions o;
      o.impl = impl;
      const Tensor O = scaled_dot_product_attention(Q, K, V, k == 2 ? ref_vis : vis, o).output;
      const auto gr = grad(O, {Q, K, V}, G);
      res[k++] = {O.value(), gr[0], gr[1], gr[2]};
    }
    for (int r = 1; r < 3; ++r)
      for (std::size_t a = 0; a < 4; ++a) require_close(res[r][a], res[0][a], 1e-12);
  }
}

namespace {

TransformerConfig windowed_config(std::size_t window, std::size_t layers, std::size_t context) {
  TransformerConfig c;
  c.V_vocab = 11;
  c.context = context;
  c.d_model = 16;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = layers;
  c.window = window;
  c.dtype = DType::float64;
  return c;
}

IndexArray random_tokens(std::size_t B, std::size_t T, Generator& g) {
  std::vector<std::int64_t> t(B * T);
  for (auto& x : t) x = static_cast<std::int64_t>(g.uniform() * 11) % 11;
  return IndexArray({B, T}, t);
}

IndexArray columns(const IndexArray& a, std::size_t from, std::size_t to) {
  const std::size_t B = a.shape[0], T = a.shape[1];
  std::vector<std::int64_t> v;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t t = from; t < to; ++t) v.push_back(a.data[b * T + t]);
  return IndexArray({B, to - from}, v);
}

}  // namespace

TEST_CASE("windowed KV cache: prefill / chunks larger and smaller than W / one token at a time equal the full "
          "forward with bounded memory",
          "[nn][window][kv_cache]") {
  NoGradGuard ng;
  const std::size_t W = 4, T = 5 * W + 3;
  Generator g(21);
  GPT model(windowed_config(W, 2, T), g);
  const IndexArray tokens = random_tokens(2, T, g);
  const Array full = model.logits(tokens).value();
  for (const std::vector<std::size_t>& chunks :
       {std::vector<std::size_t>{T}, std::vector<std::size_t>{7, 9, 7}, std::vector<std::size_t>{2, 3, 2, 5, 1, 10},
        std::vector<std::size_t>(T, 1), std::vector<std::size_t>{W - 1, 1, W, W + 1, 1, 1, 8}}) {
    auto caches = model.make_caches(2, T);
    std::vector<Array> outs;
    std::size_t at = 0, largest = 0;
    for (std::size_t n : chunks) {
      outs.push_back(model.logits_cached(columns(tokens, at, at + n), caches).value());
      at += n;
      largest = std::max(largest, n);
      for (const KVCache& c : caches) {
        CHECK(c.window() == W);
        CHECK(c.next_position() == at);
        CHECK(c.length() <= W - 1 + n);  // bounded: the last W - 1 and this chunk
        CHECK(c.capacity() >= W);
        CHECK(c.capacity() <= W - 1 + largest);  // never more room than the largest chunk needs
        CHECK(c.positions() == iota(c.length(), static_cast<std::int64_t>(at - c.length())));
      }
    }
    std::vector<Tensor> ts;
    for (const Array& a : outs) ts.push_back(Tensor(a));
    INFO("chunks " << chunks.size());
    require_close(ops::concat(ts, 1).value(), full, 1e-10);
  }
}

TEST_CASE("windowed KV cache: decoding 5 W tokens one at a time never holds more than W keys",
          "[nn][window][kv_cache]") {
  NoGradGuard ng;
  const std::size_t W = 3, T = 5 * W;
  Generator g(22);
  GPT model(windowed_config(W, 1, T), g);
  const IndexArray tokens = random_tokens(1, T, g);
  const Array full = model.logits(tokens).value();
  auto caches = model.make_caches(1, T);
  for (std::size_t t = 0; t < T; ++t) {
    const Array step = model.logits_cached(columns(tokens, t, t + 1), caches).value();
    CHECK(caches[0].length() == std::min(t + 1, W));
    CHECK(caches[0].capacity() == W);
    CHECK(caches[0].bytes() == 2 * W * 2 * (16 / 4) * sizeof(double));  // 2 tensors, W slots, H_kv 2, d_h 4
    for (std::size_t v = 0; v < 11; ++v) CHECK(std::abs(step.flat(v) - full.flat(t * 11 + v)) < 1e-10);
  }
}

TEST_CASE("windowed KV cache: a window longer than the sequence allocates the sequence only",
          "[nn][window][kv_cache]") {
  NoGradGuard ng;
  const std::size_t T = 9;
  for (std::size_t W : {std::size_t(65536), T, T + 1}) {
    Generator g(24);
    GPT model(windowed_config(W, 2, T), g);
    GPT plain(windowed_config(0, 2, T), g);
    const IndexArray tokens = random_tokens(3, T, g);
    const Array full = model.logits(tokens).value();
    auto caches = model.make_caches(3, T);
    const auto plain_caches = plain.make_caches(3, T);
    for (std::size_t l = 0; l < caches.size(); ++l) {
      INFO("W " << W << ", layer " << l);
      CHECK(caches[l].window() == W);
      CHECK(caches[l].capacity() == T);  // min(W, T): not W
      CHECK(caches[l].bytes() == plain_caches[l].bytes());  // as much as without a window, no more
    }
    for (std::size_t t = 0; t < T; ++t) {
      const Array step = model.logits_cached(columns(tokens, t, t + 1), caches).value();
      for (std::size_t b = 0; b < 3; ++b)
        for (std::size_t v = 0; v < 11; ++v)
          CHECK(std::abs(step.flat(b * 11 + v) - full.flat((b * T + t) * 11 + v)) < 1e-10);
    }
    CHECK(caches[0].capacity() == T);  // the hint was enough: never grown
  }
}

TEST_CASE("windowed KV cache: storage that starts below the window doubles up to what the window needs",
          "[nn][window][kv_cache]") {
  const std::size_t W = 8;
  KVCache c = KVCache::windowed(1, 1, W, 2, 2, DType::float64, 2);
  CHECK(c.capacity() == 2);
  std::vector<std::size_t> seen;
  for (std::int64_t t = 0; t < 30; ++t) {
    const Array k = Array::full({1, 1, 1, 2}, static_cast<double>(t), DType::float64);
    c.append(k, k);
    if (seen.empty() || seen.back() != c.capacity()) seen.push_back(c.capacity());
    CHECK(c.length() == std::min<std::size_t>(static_cast<std::size_t>(t) + 1, W));
    CHECK(c.keys().flat(c.length() * 2 - 1) == static_cast<double>(t));  // the newest key last
    CHECK(c.keys().flat(0) == static_cast<double>(t + 1 - static_cast<std::int64_t>(c.length())));
  }
  CHECK(seen == std::vector<std::size_t>{2, 4, 8});  // doubling, capped at W - 1 + 1
  // Without the hint, the storage is the window, as before.
  CHECK(KVCache::windowed(1, 1, W, 2, 2, DType::float64).capacity() == W);
}

TEST_CASE("windowed GPT: a token is invisible beyond its window and prefixes are isolated", "[nn][window]") {
  NoGradGuard ng;
  const std::size_t W = 3, T = 9;
  Generator g(23);
  GPT one(windowed_config(W, 1, T), g);  // one layer: position t sees tokens t-2 .. t only
  GPT two(windowed_config(W, 2, T), g);  // two layers: t-4 .. t
  const IndexArray a = random_tokens(1, T, g);
  IndexArray b = a;
  b.data[2] = (b.data[2] + 1) % 11;  // change the token at position 2
  for (auto* m : {&one, &two}) {
    const std::size_t reach = m == &one ? W - 1 : 2 * (W - 1);
    const Array la = m->logits(a).value(), lb = m->logits(b).value();
    for (std::size_t t = 0; t < T; ++t) {
      double d = 0;
      for (std::size_t v = 0; v < 11; ++v) d = std::max(d, std::abs(la.flat(t * 11 + v) - lb.flat(t * 11 + v)));
      INFO("position " << t << " reach " << reach);
      if (t < 2 || t > 2 + reach)
        CHECK(d == 0.0);  // before the change (prefix isolation) or out of its reach
      else
        CHECK(d > 1e-9);
    }
  }
}

TEST_CASE("windowed KV cache: a failed call leaves it usable / truncate and bad caches", "[nn][window][kv_cache][errors]") {
  NoGradGuard ng;
  Generator g(24);
  AttentionConfig c;
  c.d_model = 8;
  c.H_q = 2;
  c.window = 3;
  c.dtype = DType::float64;
  MultiHeadAttention m(c, g);
  const std::size_t T = 10;
  const Array X = rnd({1, T, 8}, g);
  const Array full = m(Tensor(X), Visibility::all()).value();  // the layer's window applies
  const Array causal_only = [&] {
    AttentionConfig c2 = c;
    c2.window = 0;
    std::vector<std::pair<std::string, Array>> w;
    for (const auto& p : m.named_parameters()) w.emplace_back(p.first, p.second.value());
    MultiHeadAttention m2(c2, w);
    return m2(Tensor(X), Visibility::causal(T, T)).value();
  }();
  CHECK(max_abs_diff(full, causal_only) > 1e-6);  // the window changes the result
  KVCache cache = m.make_cache(1, T);
  std::vector<Tensor> outs;
  outs.push_back(m.forward_cached(ops::slice(Tensor(X), 1, 0, 6), cache).Y);
  CHECK(cache.first_position() == 0);
  CHECK(cache.length() == 6);
  // A call that fails after the append keeps the cache's state; the keys 0..2 dropped at the
  // start of that append were invisible to every query from 6 on.
  AttentionCall bad;
  bad.visibility = Visibility::causal(2, 2);
  CHECK_THROWS_AS(m.forward_cached(ops::slice(Tensor(X), 1, 6, 7), cache, bad), ShapeError);
  CHECK(cache.next_position() == 6);
  CHECK(cache.positions() == iota(2, 4));
  for (long t = 6; t < long(T); ++t) outs.push_back(m.forward_cached(ops::slice(Tensor(X), 1, t, t + 1), cache).Y);
  require_close(ops::concat(outs, 1).value(), full, 1e-12);
  // truncate by absolute position: back to 9 works (keys 7, 8 held); back to 5 needs key 3.
  CHECK(cache.positions() == iota(3, 7));
  cache.truncate(9);
  CHECK(cache.next_position() == 9);
  CHECK_THROWS_WITH(cache.truncate(5), Catch::Contains("[kv_cache]") && Catch::Contains("dropped"));
  CHECK_THROWS_AS(cache.truncate(10), ValueError);
  cache.clear();
  CHECK(cache.next_position() == 0);
  // A cache narrower than the layer's window, or windowed for a layer without one: refused.
  KVCache narrow = KVCache::windowed(1, 2, 2, 4, 4, DType::float64);
  CHECK_THROWS_WITH(m.forward_cached(Tensor(rnd({1, 1, 8}, g)), narrow), Catch::Contains("window of 2"));
  AttentionConfig c0 = c;
  c0.window = 0;
  MultiHeadAttention plain(c0, g);
  KVCache w3 = m.make_cache(1, 4);
  CHECK_THROWS_AS(plain.forward_cached(Tensor(rnd({1, 1, 8}, g)), w3), ValueError);
  CHECK(w3.next_position() == 0);
  // A wider windowed cache is fine (it keeps more than the layer needs).
  KVCache wide = KVCache::windowed(1, 2, 5, 4, 4, DType::float64);
  CHECK_NOTHROW(m.forward_cached(Tensor(rnd({1, 2, 8}, g)), wide));
  CHECK_THROWS_WITH(KVCache::windowed(1, 2, 0, 4, 4, DType::float64), Catch::Contains("W = 0"));
}

TEST_CASE("windowed encoder-decoder: cached decoding equals the full decode / the encoder stays bidirectional",
          "[nn][window][kv_cache]") {
  NoGradGuard ng;
  Generator g(25);
  TransformerConfig c = windowed_config(2, 2, 8);
  EncoderDecoder model(c, g);
  const IndexArray src = random_tokens(2, 5, g), tgt = random_tokens(2, 7, g);
  const std::vector<std::size_t> lengths = {5, 3};
  const Tensor memory = model.encode(src, lengths);
  const Array full = model.decode(tgt, memory, lengths).value();
  auto caches = model.make_caches(2, 7);
  const auto kv = model.memory_kv(memory);
  std::vector<Tensor> outs;
  for (std::size_t t = 0; t < 7; ++t) {
    outs.push_back(model.decode_cached(columns(tgt, t, t + 1), caches, kv, lengths));
    CHECK(caches[0].length() <= 2);
  }
  require_close(ops::concat(outs, 1).value(), full, 1e-10);
  for (const auto& b : model.encoder) CHECK(b->attn.config().window == 0);
  for (const auto& b : model.decoder) CHECK(b->attn.config().window == 2);
}
