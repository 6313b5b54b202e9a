// Attention layers (SPEC 6-8, 11): MHA/GQA/MQA in one module, cross attention, the KV cache,
// PyTorch layout conversion, dropout modes, configuration errors.
#include "tests/support/helpers.hpp"
#include <xgrad/nn/detail/flash_attention.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

AttentionConfig config(std::size_t d, std::size_t H_q, std::size_t H_kv, bool bias = true) {
  AttentionConfig c;
  c.d_model = d;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.bias = bias;
  c.dtype = DType::float64;
  return c;
}

void randomise_biases(Module& m, Generator& g) {
  for (auto& [name, t] : m.named_parameters())
    if (name.rfind("b_", 0) == 0) t.set_value(rnd(t.shape(), g));
}

}  // namespace

TEST_CASE("attention layer: parameter names/shapes/counts for MHA/GQA/MQA (5.22) and (5.36)",
          "[nn][attention]") {
  Generator g(1);
  for (std::size_t H_kv : {4, 2, 1}) {
    MultiHeadAttention m(config(16, 4, H_kv), g);
    const std::size_t d_h = 4, width = (4 + 2 * H_kv) * d_h;
    CHECK(m.W_QKV.shape() == Shape{16, width});
    CHECK(m.b_QKV.shape() == Shape{width});
    CHECK(m.W_O.shape() == Shape{16, 16});
    CHECK(m.parameter("W_QKV").impl() == m.W_QKV.impl());
    // By hand: W_Q d*H_q*d_h + W_K, W_V 2*d*H_kv*d_h + W_O H_q*d_h*d + biases.
    const std::size_t by_hand = 16 * 16 + 2 * 16 * H_kv * 4 + 16 * 16 + (16 + 2 * H_kv * 4) + 16;
    CHECK(m.parameter_count() == by_hand);
    CHECK(m.parameter_count() == cost::attention_params(16, 4, H_kv, 4, true));
  }
  CHECK_THROWS_WITH(MultiHeadAttention(config(12, 6, 4), g),
                    Catch::Contains("[attention]") && Catch::Contains("H_q (6)") && Catch::Contains("H_kv (4)"));
  CHECK_THROWS_WITH(MultiHeadAttention(config(10, 4, 4), g), Catch::Contains("d_model (10)") && Catch::Contains("H_q (4)"));
  CHECK_THROWS_WITH(nn::attention(Tensor(rnd({1, 6, 2, 3}, g)), Tensor(rnd({1, 4, 2, 3}, g)), Tensor(rnd({1, 4, 2, 3}, g)),
                                  Visibility::all()),
                    Catch::Contains("H_q (6) must be a multiple of H_kv (4)"));
}

TEST_CASE("attention layer: Y = sum_h O^(h) W_O^(h) with per-head slices of the packed W_QKV (5.20)-(5.22)",
          "[nn][attention][spec]") {
  Generator g(2);
  MultiHeadAttention m(config(6, 3, 3), g);
  randomise_biases(m, g);
  const Array X = rnd({2, 4, 6}, g);
  const Array Y = m(Tensor(X), Visibility::causal(4, 4)).value();
  // Rebuild from per-head pieces: head h uses columns [h d_h, (h+1) d_h) of each of the
  // Q, K and V blocks, and rows [h d_h, (h+1) d_h) of W_O.
  const std::size_t d_h = 2;
  auto cols = [](const Array& a, std::size_t s, std::size_t n) {
    return ops::slice(Tensor(a), -1, long(s), long(s + n));
  };
  Tensor Y_sum = Tensor(m.b_O.value());
  for (std::size_t h = 0; h < 3; ++h) {
    const Tensor Xt(X);
    const Tensor Q = ops::matmul(Xt, cols(m.W_QKV.value(), h * d_h, d_h)) + cols(m.b_QKV.value(), h * d_h, d_h);
    const Tensor K = ops::matmul(Xt, cols(m.W_QKV.value(), 6 + h * d_h, d_h)) + cols(m.b_QKV.value(), 6 + h * d_h, d_h);
    const Tensor V = ops::matmul(Xt, cols(m.W_QKV.value(), 12 + h * d_h, d_h)) + cols(m.b_QKV.value(), 12 + h * d_h, d_h);
    const Tensor O = ops::squeeze(nn::attention(ops::unsqueeze(Q, 1), ops::unsqueeze(K, 1), ops::unsqueeze(V, 1),
                                                Visibility::causal(4, 4)), 1);
    const Tensor W_O_h = ops::slice(Tensor(m.W_O.value()), 0, long(h * d_h), long((h + 1) * d_h));
    Y_sum = Y_sum + ops::matmul(O, W_O_h);  // (5.21)
  }
  CHECK(max_abs_diff(Y, Y_sum.value()) < 1e-12);
}

TEST_CASE("attention layer: H_kv == H_q is MHA and H_kv == 1 is MQA - all through one module", "[nn][attention]") {
  Generator g(3);
  for (std::size_t H_kv : {4, 2, 1}) {
    MultiHeadAttention m(config(8, 4, H_kv), g);
    Tensor X(rnd({2, 5, 8}, g), true);
    Tensor Y = m(X, Visibility::causal(5, 5));
    CHECK(Y.shape() == Shape{2, 5, 8});
    ops::sum(Y * Y).backward();
    CHECK(m.W_QKV.has_grad());
    CHECK(X.has_grad());
  }
}

TEST_CASE("cross attention: T != S and d_q != d_m / source padding zeroes weights / no causal mask implied (5.23)",
          "[nn][attention]") {
  Generator g(4);
  CrossAttentionConfig c;
  c.d_q = 6;
  c.d_m = 5;
  c.H_q = 2;
  c.dtype = DType::float64;
  CrossAttention xa(c, g);
  CHECK(xa.W_KV.shape() == Shape{5, 12});
  const Tensor Xq(rnd({2, 3, 6}, g)), Xm(rnd({2, 4, 5}, g));
  AttentionCall call;
  call.visibility = Visibility::key_lengths({4, 2}, 4);
  call.return_weights = true;
  const AttentionOutput out = xa.forward(Xq, Xm, call);
  CHECK(out.Y.shape() == Shape{2, 3, 6});
  const Array& A = out.weights.value();
  CHECK(A.shape() == Shape{2, 2, 3, 4});
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 3; ++i) {
      for (std::size_t j = 0; j < 4; ++j) CHECK(A.at({0, h, i, j}) > 0.0);  // every source key, every query
      CHECK(A.at({1, h, i, 2}) == 0.0);  // padded source positions: exactly zero
      CHECK(A.at({1, h, i, 3}) == 0.0);
    }
  // project_memory + forward_with_memory is the same computation (reused K/V in decoding).
  const auto kv = xa.project_memory(Xm);
  XGT_CHECK_SAME(xa.forward_with_memory(Xq, kv, call).Y.value(), out.Y.value());  // the same calls, split in two
}

TEST_CASE("KV cache: prefill and chunked prefill and one-token decoding equal the full causal pass",
          "[nn][attention][kv_cache]") {
  Generator g(5);
  for (std::size_t H_kv : {3, 1}) {
    MultiHeadAttention m(config(12, 3, H_kv), g);
    randomise_biases(m, g);
    const std::size_t T = 7;
    const Array X = rnd({2, T, 12}, g);
    const Array full = m(Tensor(X), Visibility::causal(T, T)).value();
    auto run = [&](const std::vector<std::size_t>& chunks) {
      KVCache cache = m.make_cache(2, T);
      std::vector<Tensor> outs;
      std::size_t at = 0;
      for (std::size_t n : chunks) {
        const Tensor piece = ops::slice(Tensor(X), 1, long(at), long(at + n));
        outs.push_back(m.forward_cached(piece, cache).Y);
        at += n;
      }
      CHECK(cache.length() == T);
      return ops::concat(outs, 1).value();
    };
    INFO("H_kv " << H_kv);
    CHECK(max_abs_diff(run({T}), full) < 1e-12);                        // prefill
    CHECK(max_abs_diff(run({3, 2, 2}), full) < 1e-12);                  // chunked prefill
    CHECK(max_abs_diff(run({1, 1, 1, 1, 1, 1, 1}), full) < 1e-12);      // one token at a time
    CHECK(max_abs_diff(run({4, 1, 1, 1}), full) < 1e-12);               // prefill, then decode
  }
}

TEST_CASE("KV cache: tracks positions and sizes and refuses to overflow", "[nn][attention][kv_cache][errors]") {
  Generator g(6);
  MultiHeadAttention m(config(8, 2, 1), g);
  KVCache cache = m.make_cache(1, 4);
  CHECK(cache.bytes() == cost::kv_cache_bytes(1, 4, 1, 4, 8));  // 2 S H_kv d_h elements (the text after (5.36))
  m.forward_cached(Tensor(rnd({1, 3, 8}, g)), cache);
  CHECK(cache.positions() == std::vector<std::int64_t>{0, 1, 2});
  CHECK(cache.keys().shape() == Shape{1, 1, 3, 4});
  CHECK_THROWS_WITH(m.forward_cached(Tensor(rnd({1, 2, 8}, g)), cache),
                    Catch::Contains("[kv_cache] overflow") && Catch::Contains("capacity of 4"));
  CHECK_THROWS_AS(cache.append(Array::zeros({1, 2, 1, 4}, DType::float64), Array::zeros({1, 2, 1, 4}, DType::float64)),
                  ShapeError);
  // A call that fails after the append (here: a visibility of the wrong shape) leaves the
  // cache as it was.
  AttentionCall bad;
  bad.visibility = Visibility::causal(2, 2);
  CHECK_THROWS_AS(m.forward_cached(Tensor(rnd({1, 1, 8}, g)), cache, bad), ShapeError);
  CHECK(cache.length() == 3);
  CHECK_THROWS_AS(cache.truncate(4), ValueError);
}

TEST_CASE("KV cache: the one-query decoding step reads the cache in place and equals the fused path bit for bit",
          "[nn][attention][kv_cache]") {
  // forward_cached of one position per sample takes nn::attention_one_query on the cache's
  // buffers; a call with query_valid set takes the general path (keys and values copied out,
  // then the fused op). Same arithmetic, so the same bits: MHA, GQA, MQA, RoPE, a window that
  // drops keys, a scale, both dtypes.
  Generator g(61);
  NoGradGuard ng;
  for (DType dt : {DType::float32, DType::float64})
    for (std::size_t H_kv : {4, 2, 1})
      for (std::size_t window : {0, 3}) {
        INFO("dtype " << dtype_name(dt) << ", H_kv " << H_kv << ", window " << window);
        AttentionConfig c = config(16, 4, H_kv);
        c.dtype = dt;
        c.window = window;
        c.rope = ops::RopeConfig{};
        if (H_kv == 1) c.scale = 0.3;
        MultiHeadAttention m(c, g);
        for (auto& [name, p] : m.named_parameters())
          if (name.rfind("b_", 0) == 0) p.set_value(rnd(p.shape(), g).astype(dt));
        KVCache step = m.make_cache(2, 12), general = m.make_cache(2, 12);
        const auto all_valid = [](std::size_t n) {
          AttentionCall call;
          call.query_valid = BoolArray::filled({2, n}, true);
          return call;
        };
        const Tensor prompt(rnd({2, 4, 16}, g).astype(dt));
        // The two schedules run the same products on caches of the same shapes: the same bits.
        XGT_CHECK_SAME(m.forward_cached(prompt, step).Y.value(), m.forward_cached(prompt, general, all_valid(4)).Y.value());
        for (int t = 0; t < 6; ++t) {
          const Tensor x(rnd({2, 1, 16}, g).astype(dt));
          const AttentionOutput a = m.forward_cached(x, step), b = m.forward_cached(x, general, all_valid(1));
          CHECK(a.path == SdpaImpl::fused);
          XGT_CHECK_SAME(a.Y.value(), b.Y.value());
        }
        CHECK(step.first_position() == general.first_position());
        CHECK(step.length() == general.length());
        // A non-finite input is refused as on the general path, and the cache is left as it was
        // (a windowed one may have dropped keys no later query sees).
        Array bad = rnd({2, 1, 16}, g).astype(dt);
        bad.set_flat(3, std::nan(""));
        const std::size_t next = step.next_position();
        CHECK_THROWS_WITH(m.forward_cached(Tensor(bad), step), Catch::Contains("Q has nan"));
        CHECK(step.next_position() == next);
      }
}

TEST_CASE("KV cache: a float32 cache without a window keeps its keys transposed and the decoding step reads them",
          "[nn][attention][kv_cache]") {
  // key_columns() is K^T tile by tile, written on append; attention_one_query given it reads its
  // tiles of K^T in place, without it transposes K's slots: the same products on the same values,
  // the same bits, over one tile of keys and over several (70 keys: a full tile of 64 and a partial).
  // d 16: a multiple of the tile kernels' width (16 with AVX-512, 8 with AVX2), so the tiles run.
  Generator g(62);
  NoGradGuard ng;
  const std::size_t B = 2, H_kv = 2, d = 16, cap = 80;
  KVCache cache(B, H_kv, cap, d, d, DType::float32);
  REQUIRE(cache.key_columns().defined());
  // Tile by tile: 80 slots are two tiles of 64, each a contiguous [d, 64] block.
  const std::size_t T = KVCache::kColumnTile;
  REQUIRE(T == 64);
  CHECK(cache.key_columns().shape() == Shape{B, H_kv, 2, d, T});
  CHECK(cache.bytes() == (2 * B * H_kv * cap * d + B * H_kv * 2 * d * T) * 4);
  cache.append(rnd({B, H_kv, 5, d}, g).astype(DType::float32), rnd({B, H_kv, 5, d}, g).astype(DType::float32));
  const auto check_columns = [&] {
    const Array K = cache.keys(), Kt = cache.key_columns();
    for (std::size_t bh = 0; bh < B * H_kv; ++bh)
      for (std::size_t s = 0; s < cache.length(); ++s)
        for (std::size_t c = 0; c < d; ++c) {
          INFO("group " << bh << ", slot " << s << ", feature " << c);
          CHECK(Kt.data<float>()[((bh * 2 + s / T) * d + c) * T + s % T] ==
                K.data<float>()[(bh * cache.length() + s) * d + c]);
        }
  };
  check_columns();
  for (std::size_t t = 0; t < 65; ++t)
    cache.append(rnd({B, H_kv, 1, d}, g).astype(DType::float32), rnd({B, H_kv, 1, d}, g).astype(DType::float32));
  cache.truncate(68);  // undone keys are overwritten by the next append
  cache.append(rnd({B, H_kv, 2, d}, g).astype(DType::float32), rnd({B, H_kv, 2, d}, g).astype(DType::float32));
  REQUIRE(cache.length() == 70);
  check_columns();
  const Array Q = rnd({B, 4, 1, d}, g).astype(DType::float32);  // GQA: 2 query heads per kv head
  // Keys [lo, hi): from slot 0 (the tiles read in place; 9 and 70 end in a partial tile, whose
  // columns past the keys are not all read) and from slot 3 (not a tile's first: the keys are
  // transposed as without the columns).
  for (const auto& [lo, hi] : {std::pair<std::size_t, std::size_t>{0, 9}, {0, 17}, {0, 64}, {0, 70}, {3, 70}}) {
    INFO("keys " << lo << " to " << hi);
    const Array in_place = attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), lo, hi, 0.35, true,
                                               cache.key_columns());
    const Array transposed = attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), lo, hi, 0.35, true);
    XGT_CHECK_SAME(in_place, transposed);
  }
  // The columns are what the in-place path reads: zeroed columns of the right shape change the
  // output where the first key starts a tile, and nothing where it does not (the keys transposed).
  const Array zero_columns = Array::zeros(cache.key_columns().shape(), DType::float32);
  const Array from_zeros = attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), 0, 70, 0.35, true,
                                               zero_columns);
  CHECK_FALSE(from_zeros.data<float>()[0] ==
              attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), 0, 70, 0.35, true).data<float>()[0]);
  XGT_CHECK_SAME(attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), 3, 70, 0.35, true, zero_columns),
                 attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), 3, 70, 0.35, true));
  // Columns of another layout or rank are refused, naming the op and both shapes.
  CHECK_THROWS_WITH(attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), 0, 9, 0.35, true,
                                        Array::zeros({B, H_kv, d, cap + 64}, DType::float32)),
                    Catch::Contains("attention_one_query") && Catch::Contains("(2, 2, tiles, 16, 64)") &&
                        Catch::Contains("got float32 (2, 2, 16, 144)"));
  CHECK_THROWS_WITH(attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), 0, 9, 0.35, true,
                                        Array::zeros({B, H_kv}, DType::float32)),
                    Catch::Contains("got float32 (2, 2)"));
  // Not kept where the decoding step could not read it in place: float64, a window (keys move down).
  CHECK_FALSE(KVCache(B, H_kv, cap, d, d, DType::float64).key_columns().defined());
  CHECK_FALSE(KVCache::windowed(B, H_kv, 4, d, d, DType::float32).key_columns().defined());
}

TEST_CASE("attention layer: PyTorch layout export/import round-trips and matches the packed blocks",
          "[nn][attention][layout]") {
  Generator g(7);
  MultiHeadAttention a(config(6, 2, 2), g), b(config(6, 2, 2), g);
  randomise_biases(a, g);
  const auto w = torch_layout::export_mha(a);
  CHECK(w.in_proj_weight.shape() == Shape{18, 6});  // [3d, d], out x in
  // Row block 1 of in_proj_weight is W_K^T: in_proj_weight[6 + o][i] == W_QKV[i][6 + o].
  CHECK(w.in_proj_weight.at({6 + 1, 4}) == a.W_QKV.value().at({4, 6 + 1}));
  torch_layout::import_mha(b, w);
  const Tensor X(rnd({1, 3, 6}, g));
  XGT_CHECK_SAME(a(X, Visibility::all()).value(), b(X, Visibility::all()).value());  // same weights, same calls
  MultiHeadAttention gqa(config(8, 4, 2), g);
  CHECK_THROWS_WITH(torch_layout::export_mha(gqa), Catch::Contains("H_kv == H_q"));
  // A failed import changes nothing: here the state lacks the output bias.
  auto no_bias = w;
  no_bias.out_proj_bias = Array();
  const Array before = b.W_QKV.value().clone();
  MultiHeadAttention c(config(6, 2, 2), g);
  const Array c_before = c.W_QKV.value().clone();
  CHECK_THROWS_WITH(torch_layout::import_mha(c, no_bias), Catch::Contains("bias presence"));
  XGT_CHECK_SAME(c.W_QKV.value(), c_before);
  auto wrong = w;
  wrong.out_proj_weight = Array::zeros({6, 5}, DType::float64);
  CHECK_THROWS_WITH(torch_layout::import_mha(c, wrong), Catch::Contains("out_proj.weight"));
  XGT_CHECK_SAME(c.W_QKV.value(), c_before);
  XGT_CHECK_SAME(b.W_QKV.value(), before);  // failed imports change nothing
}

TEST_CASE("attention layer: dropout only in training / eval is exactly the deterministic path (SPEC 2)",
          "[nn][attention][dropout]") {
  Generator g(8);
  AttentionConfig c = config(8, 2, 2);
  c.dropout = 0.5;
  MultiHeadAttention m(c, g);
  AttentionConfig c0 = c;
  c0.dropout = 0.0;
  Generator g2(8);
  MultiHeadAttention m0(c0, g2);  // same weights, no dropout
  const Tensor X(rnd({1, 4, 8}, g));
  AttentionCall call;
  call.generator = &g;
  m.eval();
  XGT_CHECK_SAME(m.forward(X, call).Y.value(), m0.forward(X, call).Y.value());  // eval: no dropout op runs
  m.train();
  const AttentionOutput tr = m.forward(X, call);
  CHECK(tr.dropout_seed != 0);  // dropout drew its mask (fused path: from this seed)
  CHECK(max_abs_diff(tr.Y.value(), m0.forward(X, call).Y.value()) > 1e-6);
  call.generator = nullptr;
  CHECK_THROWS_WITH(m.forward(X, call), Catch::Contains("needs a generator"));
}

TEST_CASE("attention: returned weights rows sum to 1 for valid queries and are zero for invalid ones (SPEC 1.1 and SPEC 4.6)",
          "[nn][attention]") {
  Generator g(9);
  SdpaOptions o;
  o.return_weights = true;
  o.query_valid = BoolArray({1, 3}, {1, 0, 1});
  const SdpaResult r = scaled_dot_product_attention(Tensor(rnd({1, 2, 3, 4}, g)), Tensor(rnd({1, 1, 5, 4}, g)),
                                                    Tensor(rnd({1, 1, 5, 2}, g)), Visibility::causal(3, 5), o);
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t i = 0; i < 3; ++i) {
      double s = 0;
      for (std::size_t j = 0; j < 5; ++j) {
        const double a = r.weights.value().at({0, h, i, j});
        CHECK(a >= 0.0);
        s += a;
      }
      if (i == 1) CHECK(s == 0.0);
      else CHECK(s == Approx(1.0).margin(1e-14));
    }
}

TEST_CASE("attention: Algorithm 5.1 input checks name the offending shapes and values", "[nn][attention][errors]") {
  Generator g(10);
  const Tensor Q(rnd({1, 1, 2, 3}, g)), K(rnd({1, 1, 4, 3}, g)), V(rnd({1, 1, 4, 2}, g));
  CHECK_THROWS_WITH(nn::attention(Q, Tensor(rnd({1, 1, 4, 2}, g)), V, Visibility::all()),
                    Catch::Contains("Q and K widths (d_k) differ") && Catch::Contains("(1, 1, 2, 3)"));
  CHECK_THROWS_WITH(nn::attention(Q, K, Tensor(rnd({1, 1, 3, 2}, g)), Visibility::all()),
                    Catch::Contains("K and V lengths (S) differ"));
  CHECK_THROWS_WITH(nn::attention(Tensor(rnd({2, 3}, g)), K, V, Visibility::all()), Catch::Contains("[B, H, length, width]"));
  Array bad = rnd({1, 1, 4, 2}, g);
  bad.set_flat(5, NAN);
  CHECK_THROWS_WITH(nn::attention(Q, K, Tensor(bad), Visibility::all()),
                    Catch::Contains("V has nan") && Catch::Contains("(0, 0, 2, 1)"));
  SdpaOptions skip;
  skip.check_finite = false;  // documented opt-out: no error raised (the NaN propagates)
  CHECK_NOTHROW(nn::attention(Q, K, Tensor(bad), Visibility::all(), skip));
  CHECK_THROWS_AS(nn::attention(Q, K, V, Visibility::causal(2, 4) & Visibility::key_lengths({0}, 4)), VisibilityError);
  CHECK_THROWS_WITH(nn::attention(Q, K, V, Visibility::key_lengths({0}, 4)),
                    Catch::Contains("batch 0, head 0, query 0 is valid but sees no key"));
}

TEST_CASE("attention layers: the config's impl reaches the attention core and AttentionOutput::path says which ran",
          "[nn][attention][fused]") {
  Generator g(11);
  const Tensor X(rnd({2, 5, 8}, g)), Xm(rnd({2, 3, 6}, g));
  const Visibility causal = Visibility::causal(5, 5);
  AttentionCall plain;
  plain.visibility = causal;
  AttentionCall weights = plain;
  weights.return_weights = true;
  CrossAttentionConfig cc;
  cc.d_q = 8;
  cc.d_m = 6;
  cc.H_q = 2;
  cc.dtype = DType::float64;
  AttentionCall cross_plain, cross_weights;
  cross_weights.return_weights = true;
  for (const SdpaImpl impl : {SdpaImpl::automatic, SdpaImpl::composed, SdpaImpl::fused}) {
    INFO("impl " << static_cast<int>(impl));
    AttentionConfig c = config(8, 4, 2);
    c.impl = impl;
    MultiHeadAttention m(c, g);
    cc.impl = impl;
    CrossAttention ca(cc, g);
    // Without weights: automatic takes the fused path; composed and fused take their own.
    const SdpaImpl expect_plain = impl == SdpaImpl::composed ? SdpaImpl::composed : SdpaImpl::fused;
    CHECK(m.forward(X, plain).path == expect_plain);
    CHECK(ca.forward(X, Xm, cross_plain).path == expect_plain);
    KVCache cache = m.make_cache(2, 5);
    CHECK(m.forward_cached(X, cache).path == expect_plain);
    if (impl == SdpaImpl::fused) {  // the fused path never forms the weights: refused, as the core refuses it
      CHECK_THROWS_WITH(m.forward(X, weights), Catch::Contains("fused path does not form the weights"));
      CHECK_THROWS_WITH(ca.forward(X, Xm, cross_weights), Catch::Contains("fused path does not form the weights"));
    } else {
      const AttentionOutput a = m.forward(X, weights);
      CHECK(a.path == SdpaImpl::composed);
      CHECK(a.weights.shape() == Shape{2, 4, 5, 5});
      const AttentionOutput b = ca.forward(X, Xm, cross_weights);
      CHECK(b.path == SdpaImpl::composed);
      CHECK(b.weights.shape() == Shape{2, 2, 5, 3});
    }
  }
  // Dropout in training: the composed path returns its mask, the fused path only the seed.
  for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
    AttentionConfig c = config(8, 2, 2);
    c.impl = impl;
    c.dropout = 0.5;
    MultiHeadAttention m(c, g);
    m.train();
    AttentionCall call = plain;
    call.generator = &g;
    const AttentionOutput a = m.forward(X, call);
    CHECK(a.path == impl);
    CHECK(a.dropout_seed != 0);
    if (impl == SdpaImpl::composed) {
      REQUIRE(a.dropout_mask.shape() == Shape{2, 2, 5, 5});
      CHECK(a.dropout_mask.to_vector() ==
            attention_dropout_mask({2, 2, 5, 5}, 0.5, a.dropout_seed, DType::float64).to_vector());
    } else {
      CHECK_FALSE(a.dropout_mask.defined());
    }
  }
}
