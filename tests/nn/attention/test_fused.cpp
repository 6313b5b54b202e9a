// The fused attention path (nn/detail/flash_attention.hpp) against the composed path, in float64 to
// 1e-12, on every visibility kind, with invalid queries, GQA/MQA, dropout, several query
// blocks (T > 128, the block height), and against the closed-form reference (5.24)-(5.31). Also: the same
// errors as the composed path, and bit-identical results run to run.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <utility>
#include <vector>

#include <xgrad/checks/detail/common.hpp>
#include "tests/support/helpers.hpp"
#include <xgrad/checks/attention_reference.hpp>
#include <xgrad/core/detail/amx_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/profile.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/nn/detail/flash_tile.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

constexpr double kTol = 1e-12;

struct Case {
  std::string name;
  std::size_t B, H_q, H_kv, T, S, d_k, d_v;
  Visibility vis;
  BoolArray valid;
};

struct Run {
  Array O, dQ, dK, dV;
  std::uint64_t seed = 0;
};

Run run(const Case& c, SdpaImpl impl, DType dtype, double dropout, std::uint64_t data_seed, std::uint64_t gen_seed) {
  Generator g(data_seed);
  Tensor Q(rnd({c.B, c.H_q, c.T, c.d_k}, g, -2, 2).astype(dtype), true);
  Tensor K(rnd({c.B, c.H_kv, c.S, c.d_k}, g, -2, 2).astype(dtype), true);
  Tensor V(rnd({c.B, c.H_kv, c.S, c.d_v}, g, -2, 2).astype(dtype), true);
  const Array G = rnd({c.B, c.H_q, c.T, c.d_v}, g).astype(dtype);
  Generator drop(gen_seed);
  SdpaOptions o{std::nullopt, c.valid};  // (initialised, not assigned: GCC 12 -Wnonnull false positive)
  o.impl = impl;
  o.dropout_p = dropout;
  o.training = dropout > 0;
  o.generator = &drop;
  const SdpaResult r = scaled_dot_product_attention(Q, K, V, c.vis, o);
  const auto grads = grad(r.output, {Q, K, V}, G);
  return {r.output.value(), grads[0], grads[1], grads[2], r.dropout_seed};
}

// How many floats of a and b differ in their bits; the first one is reported (full precision).
std::size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && differ++ == 0)
      UNSCOPED_INFO(what << " first differs at " << i << ": " << std::setprecision(9) << a[i] << " against " << b[i]);
  return differ;
}

std::vector<std::int64_t> iota(std::size_t n, std::int64_t start = 0) {
  std::vector<std::int64_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<std::int64_t>(i);
  return v;
}

// Every visibility kind, alone and intersected, at sizes that span several 64-row blocks. Head
// widths d_k, d_v (5 and 3 by default: the BLAS path; multiples of 16 take the float32 tile
// kernels of nn/detail/flash_tile.hpp on both ISAs).
std::vector<Case> cases(std::size_t d_k = 5, std::size_t d_v = 3) {
  Generator g(71);
  std::vector<Case> cs;
  auto add = [&](std::string name, std::size_t B, std::size_t H_q, std::size_t H_kv, std::size_t T, std::size_t S,
                 Visibility vis, BoolArray valid = {}) {
    // A valid query that sees no key is an error by design: such queries are declared invalid.
    const auto allowed = vis.expand_allowed("test", {B, H_q, T, S});
    if (valid.size() == 0) valid = BoolArray::filled({B, T}, true);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H_q; ++h)
        for (std::size_t i = 0; i < T; ++i) {
          bool any = false;
          for (std::size_t j = 0; j < S; ++j) any = any || allowed[((b * H_q + h) * T + i) * S + j];
          if (!any) valid.data[b * T + i] = 0;
        }
    cs.push_back({std::move(name), B, H_q, H_kv, T, S, d_k, d_v, std::move(vis), std::move(valid)});
  };
  add("no mask, MHA", 2, 2, 2, 70, 90, Visibility::all());
  add("causal square, GQA, 3 blocks", 1, 4, 2, 300, 300, Visibility::causal(300, 300));
  add("causal suffix T < S (bottom-right), MQA", 2, 3, 1, 67, 130, Visibility::causal(67, 130));
  {
    std::vector<std::int64_t> k = iota(40);
    std::swap(k[3], k[30]);  // unsorted key positions: no prefix search
    add("causal, unsorted key positions", 1, 2, 2, 20, 40, Visibility::causal(iota(20, 10), k));
  }
  add("key lengths (padding)", 3, 2, 1, 80, 80, Visibility::key_lengths({80, 33, 1}, 80));
  {
    BoolArray v = BoolArray::filled({2, 50}, true);
    for (std::size_t j = 0; j < 50; j += 3) v.data[j] = 0;  // holes, not a prefix
    add("valid keys with holes", 2, 2, 2, 30, 50, Visibility::valid_keys(v));
  }
  {
    IndexArray docs({2, 260}, std::vector<std::int64_t>(520));
    for (std::size_t i = 0; i < 260; ++i) {
      docs.data[i] = i < 40 ? 0 : (i < 200 ? 1 : 2);          // contiguous documents
      docs.data[260 + i] = static_cast<std::int64_t>(i % 3);  // interleaved ids
    }
    add("documents (contiguous and interleaved ids)", 2, 2, 1, 260, 260, Visibility::documents(docs));
  }
  add("dense allowed per head & causal", 2, 2, 2, 66, 66,
      Visibility::allowed(checks::random_allowed({2, 2, 66, 66}, g, 0.5)) & Visibility::causal(66, 66));
  {
    Array bias = Array::empty({2, 1, 40, 70}, DType::float64);
    for (std::size_t i = 0; i < bias.size(); ++i)
      bias.set_flat(i, g.uniform() < 0.3 ? -std::numeric_limits<double>::infinity() : 2 * g.uniform() - 1);
    add("soft bias with -inf & key lengths", 2, 2, 2, 40, 70, Visibility::additive(bias) & Visibility::key_lengths({70, 50}, 70));
  }
  {
    BoolArray valid = BoolArray::filled({2, 200}, true);
    for (std::size_t i = 0; i < 200; i += 7) valid.data[i] = 0;
    for (std::size_t i = 0; i < 200; ++i) valid.data[200 + i] = i >= 128;  // a whole block invalid
    add("invalid queries, causal, GQA", 2, 4, 2, 200, 200, Visibility::causal(200, 200), valid);
  }
  return cs;
}

}  // namespace

TEST_CASE("fused attention equals the composed path on every visibility kind (float64 to 1e-12)",
          "[attention][fused][reference]") {
  for (const Case& c : cases()) {
    for (double dropout : {0.0, 0.25}) {
      INFO(c.name << ", dropout " << dropout);
      const Run a = run(c, SdpaImpl::composed, DType::float64, dropout, 5, 9);
      const Run b = run(c, SdpaImpl::fused, DType::float64, dropout, 5, 9);
      CHECK(a.seed == b.seed);  // the same mask, drawn from the same generator state
      require_close(b.O, a.O, kTol);
      require_close(b.dQ, a.dQ, kTol);
      require_close(b.dK, a.dK, kTol);
      require_close(b.dV, a.dV, kTol);
    }
  }
}

TEST_CASE("fused attention: invalid queries give exact zero rows and exact zero gradients", "[attention][fused]") {
  const Case c = cases()[9];
  const Run r = run(c, SdpaImpl::fused, DType::float64, 0.0, 3, 4);
  for (std::size_t b = 0; b < c.B; ++b)
    for (std::size_t i = 0; i < c.T; ++i) {
      if (c.valid.data[b * c.T + i]) continue;
      for (std::size_t h = 0; h < c.H_q; ++h) {
        for (std::size_t e = 0; e < c.d_v; ++e) REQUIRE(r.O.at({b, h, i, e}) == 0.0);
        for (std::size_t e = 0; e < c.d_k; ++e) REQUIRE(r.dQ.at({b, h, i, e}) == 0.0);
      }
    }
}

TEST_CASE("fused attention tiles: invalid queries give zero rows in reused memory split and packed",
          "[attention][fused][gemm_paths]") {
  // The tile path writes every row of O itself (zeros where a query sees no key) and the
  // gradients it adds into are cleared by their allocation. Memory the caching allocator hands
  // back still holds what it held: here NaN, so a row left unwritten shows. In float32, and in
  // bfloat16 mixed precision where this CPU runs the tiles' products in bfloat16.
  const tile::Kernels* kz = tile::kernels();
  if (!kz) return;  // no AVX2 + FMA: the tile path is not used
  const std::size_t B = 2, Hq = 2, Hkv = 1, T = 200;
  BoolArray valid = BoolArray::filled({B, T}, true);
  for (std::size_t i = 0; i < T; i += 7) valid.data[i] = 0;       // holes in sample 0
  for (std::size_t i = 0; i < 128; ++i) valid.data[T + i] = 0;    // sample 1: a whole query block sees nothing
  const Visibility vis = Visibility::causal(T, T);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto dirty = [&](const std::vector<Shape>& shapes) {  // NaN blocks back into the cache
    std::vector<Array> held;
    for (int rep = 0; rep < 4; ++rep)
      for (const Shape& s : shapes) held.push_back(Array::full(s, nan, DType::float32));
  };
  const auto tiles = [] {
    return partial_tile_calls(PartialTilePath::exact_parts) + partial_tile_calls(PartialTilePath::general);
  };
  for (const MatmulDtype mode : {MatmulDtype::float32, MatmulDtype::bfloat16})
  for (const std::size_t d : {std::size_t(16), std::size_t(32)}) {
    if (d % kz->width) continue;
    const MatmulDtypeScope scope(mode);
    const bool bf16 = mode == MatmulDtype::bfloat16;
    // (bfloat16 tiles take head widths that are multiples of 32; others run float32's)
    if (bf16 && !(effective_matmul_dtype() == MatmulDtype::bfloat16 && tile::bf16_choice().use() && d % 32 == 0))
      continue;
    INFO("d " << d << ", " << (bf16 ? bfloat16_attention_kernels() : "float32 tile kernels: " + std::string(kz->isa)));
    const std::uint64_t bf16_products = blas::amx::calls();
    const std::size_t W = (Hq + 2 * Hkv) * d;
    Generator g(d);
    const Array Pv = rnd({B, T, W}, g, -2, 2).astype(DType::float32);
    const Array Gm = rnd({B, T, Hq * d}, g).astype(DType::float32);
    SdpaOptions o{std::nullopt, valid};
    o.impl = SdpaImpl::fused;
    // Rows i of sample b of a [B, T, H d] (merged) or [B, H, T, d] (split) array are zero for
    // invalid queries; every value is finite.
    const auto check_rows = [&](const Array& X, bool merged, std::size_t cols, std::size_t width, const char* what) {
      INFO(what);
      std::size_t nonzero = 0, nonfinite = 0;
      const std::vector<double> v = X.to_vector();
      for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < Hq; ++h)
          for (std::size_t i = 0; i < T; ++i)
            for (std::size_t e = 0; e < cols; ++e) {
              const double x = merged ? v[(b * T + i) * width + h * cols + e] : v[((b * Hq + h) * T + i) * cols + e];
              if (!std::isfinite(x)) ++nonfinite;
              if (!valid.data[b * T + i] && x != 0.0) ++nonzero;
            }
      CHECK(nonzero == 0);
      CHECK(nonfinite == 0);
    };

    const std::uint64_t before = tiles();
    dirty({{B, Hq, T, d}, {B, Hkv, T, d}});
    const auto parts = ops::split(Tensor(Pv), {Hq * d, Hkv * d, Hkv * d}, -1);
    Tensor Q(split_heads(parts[0], Hq).value(), true), K(split_heads(parts[1], Hkv).value(), true),
        V(split_heads(parts[2], Hkv).value(), true);
    const SdpaResult split = scaled_dot_product_attention(Q, K, V, vis, o);
    dirty({{B, Hq, T, d}, {B, Hkv, T, d}});
    const auto gs = grad(split.output, {Q, K, V}, split_heads(Tensor(Gm), Hq).value());
    CHECK(tiles() > before);  // the causal diagonal's tiles ran on the tile path
    check_rows(split.output.value(), false, d, d, "split: O");
    check_rows(gs[0], false, d, d, "split: dQ");
    CHECK(gs[1].all_finite());
    CHECK(gs[2].all_finite());

    const std::uint64_t mid = tiles();
    dirty({{B, T, Hq * d}, {B, T, W}});
    const Tensor P(Pv, true);
    SdpaResult packed;
    REQUIRE(packed_self_attention(P, Hq, Hkv, vis, o, packed));
    dirty({{B, T, Hq * d}, {B, T, W}});
    const Array dP = grad(packed.output, {P}, Gm)[0];
    CHECK(tiles() > mid);
    check_rows(packed.output.value(), true, d, Hq * d, "packed: O");
    check_rows(dP, true, d, W, "packed: dP's Q columns");
    CHECK(dP.all_finite());
    if (bf16) {
      CHECK(blas::amx::calls() > bf16_products);  // the tiles' products ran in bfloat16
      continue;
    }
    // The same values as the split heads (the tile kernels read any stride into the same chains).
    XGT_CHECK_SAME(packed.output.value(), merge_heads(Tensor(split.output.value())).value());
  }
}

TEST_CASE("fused attention agrees with the closed-form backward (5.24)-(5.31)", "[attention][fused][reference]") {
  Generator g(404);
  for (int n = 0; n < 40; ++n) {
    const checks::RefConfig c = checks::random_ref_config(g);
    INFO("case " << n << ": " << c.text);
    const auto& d = c.d;
    Tensor Q(rnd({d.B, d.H_q, d.T, d.d_k}, g, -2, 2), true), K(rnd({d.B, d.H_kv, d.S, d.d_k}, g, -2, 2), true),
        V(rnd({d.B, d.H_kv, d.S, d.d_v}, g, -2, 2), true);
    SdpaOptions o{std::nullopt, c.valid};  // (initialised, not assigned: GCC 12 -Wnonnull false positive)
    o.impl = SdpaImpl::fused;
    const SdpaResult r = scaled_dot_product_attention(Q, K, V, c.vis, o);
    const Array G = rnd(r.output.shape(), g);
    const auto tape = grad(r.output, {Q, K, V}, G);
    const Shape full{d.B, d.H_q, d.T, d.S};
    const auto ref = checks::reference::sdpa(Q.value(), K.value(), V.value(), c.vis.expand_allowed("test", full), c.valid,
                                     checks::soft_part(c.vis, full), 1.0 / std::sqrt(double(d.d_k)), Array(), G);
    require_close(r.output.value(), ref.O, kTol);
    require_close(tape[0], ref.Q_bar, kTol);
    require_close(tape[1], ref.K_bar, kTol);
    require_close(tape[2], ref.V_bar, kTol);
  }
}

// [gemm_paths]: ctest runs this under XGRAD_ISA=avx2 too (gemm_paths_avx2), so the float32 tile
// kernels of both ISAs are checked on an AVX-512 machine.
TEST_CASE("fused attention in float32 stays within float32 rounding of the float64 result", "[attention][fused][gemm_paths]") {
  const tile::Kernels* kz = tile::kernels();
  if (kz) CHECK(std::string(kz->isa) == blas::isa_ceiling());
  INFO("float32 tile kernels: " << (kz ? kz->isa : "none"));
  for (const auto& [d_k, d_v] : std::vector<std::pair<std::size_t, std::size_t>>{{5, 3}, {16, 16}, {32, 16}})
    for (const Case& c : cases(d_k, d_v)) {
      INFO(c.name << ", d_k " << d_k << ", d_v " << d_v);
      const Run a = run(c, SdpaImpl::fused, DType::float64, 0.0, 8, 1);
      const Run b = run(c, SdpaImpl::fused, DType::float32, 0.0, 8, 1);
      require_close(b.O.astype(DType::float64), a.O, 2e-5);
      require_close(b.dQ.astype(DType::float64), a.dQ, 1e-4);
      require_close(b.dK.astype(DType::float64), a.dK, 1e-4);
      require_close(b.dV.astype(DType::float64), a.dV, 1e-4);
    }
}

// A chunk of the float32 tile path's passes can run several (batch, kv head) groups (always on one
// thread): it transposes each group's K (and V) panels as it reaches the group. At 2 threads the
// cases' chunks hold one group each, so the thread counts 1 and 3 run them here. With at least as
// many groups as threads, no result depends on the thread count: the same bits at 1, 2 and 3.
TEST_CASE("fused attention in float32: a chunk that runs several kv groups reads each group's own panels",
          "[attention][fused][gemm_paths]") {
  if (!tile::kernels()) return;  // no AVX2 + FMA: the tile path is not used
  const ThreadCount restore;
  std::vector<Case> cs;
  for (const Case& c : cases(16, 16))
    if (c.B * c.H_kv >= 3) cs.push_back(c);  // at least as many groups as threads
  REQUIRE(cs.size() >= 3);
  for (const Case& c : cs) {
    INFO(c.name);
    const Run ref = run(c, SdpaImpl::fused, DType::float64, 0.0, 8, 1);
    std::vector<Run> by_threads;
    for (int threads : {1, 2, 3}) {
      INFO("threads " << threads);
      set_num_threads(threads);
      by_threads.push_back(run(c, SdpaImpl::fused, DType::float32, 0.0, 8, 1));
      const Run& b = by_threads.back();
      require_close(b.O.astype(DType::float64), ref.O, 2e-5);
      require_close(b.dQ.astype(DType::float64), ref.dQ, 1e-4);
      require_close(b.dK.astype(DType::float64), ref.dK, 1e-4);
      require_close(b.dV.astype(DType::float64), ref.dV, 1e-4);
    }
    for (std::size_t k = 1; k < by_threads.size(); ++k) {
      XGT_CHECK_SAME(by_threads[k].O, by_threads[0].O);
      XGT_CHECK_SAME(by_threads[k].dQ, by_threads[0].dQ);
      XGT_CHECK_SAME(by_threads[k].dK, by_threads[0].dK);
      XGT_CHECK_SAME(by_threads[k].dV, by_threads[0].dV);
    }
  }
}

// The backward pass computes the softmax weights and the softmax VJP in the products' registers
// (gemm_exp, gemm_dsoft); they must give the bits of the product stored, then the row pass
// (exp_shift, and dU = A (dA - delta)), which the rest of the tile path and the docs rely on.
// [gemm_paths]: ctest runs it under XGRAD_ISA=avx2 too, so both ISAs' kernels are compared.
TEST_CASE("fused attention tile kernels: gemm_exp and gemm_dsoft equal the product then the row pass bit for bit",
          "[attention][fused][gemm_paths]") {
  const tile::Kernels* kz = tile::kernels();
  if (!kz) return;  // no AVX2 + FMA: the tile path is not used
  INFO("float32 tile kernels: " << kz->isa);
  Generator g(5);
  // M 128 and 13 (a partial micro-tile of rows), N 64, 2 * width and width (one vector: micro-tiles
  // of 12 rows), K 64 and 7; A read by rows and transposed (a_cs = M).
  // alpha 1/8 (exact products) and 1/sqrt(32), the score scale of a 32-wide head: a product
  // that the compiler fused with the subtraction of m (an FMA, one rounding) gave other bits.
  for (const std::size_t M : {std::size_t(128), std::size_t(13)})
    for (const std::size_t N : {std::size_t(64), 2 * kz->width, kz->width})
      for (const std::size_t K : {std::size_t(64), std::size_t(7)})
        for (const bool trans : {false, true})
          for (const float alpha : {0.125f, static_cast<float>(1 / std::sqrt(32.0))}) {
            INFO("M " << M << ", N " << N << ", K " << K << ", A transposed " << trans << ", alpha " << alpha);
            std::vector<float> A(M * K), B(K * N), P(M * N), m(M), lz(M), D(M);
            for (float& v : A) v = static_cast<float>(g.normal());
            for (float& v : B) v = static_cast<float>(g.normal());
            for (float& v : P) v = static_cast<float>(g.uniform());
            for (std::size_t i = 0; i < M; ++i) {
              m[i] = static_cast<float>(2 * g.normal());
              lz[i] = static_cast<float>(g.uniform());
              D[i] = static_cast<float>(g.normal());
            }
            const std::size_t ars = trans ? 1 : K, acs = trans ? M : 1;
            std::vector<float> ref(M * N), got(M * N, -1.0f);
            kz->gemm(M, N, K, alpha, A.data(), ars, acs, B.data(), N, ref.data(), N, false);
            for (std::size_t i = 0; i < M; ++i) kz->exp_shift(ref.data() + i * N, N, m[i], lz[i]);
            kz->gemm_exp(M, N, K, alpha, A.data(), ars, acs, B.data(), N, got.data(), N, m.data(), lz.data());
            std::size_t differ = 0;
            for (std::size_t j = 0; j < M * N; ++j)
              if (std::memcmp(&ref[j], &got[j], sizeof(float)) != 0 && differ++ == 0)
                UNSCOPED_INFO("gemm_exp first differs at " << j << ": " << std::setprecision(9) << got[j] << " against "
                                                          << ref[j]);
            CHECK(differ == 0);
            kz->gemm(M, N, K, 1.0f, A.data(), ars, acs, B.data(), N, ref.data(), N, false);
            for (std::size_t i = 0; i < M; ++i)
              for (std::size_t j = 0; j < N; ++j) ref[i * N + j] = P[i * N + j] * (ref[i * N + j] - D[i]);
            std::fill(got.begin(), got.end(), -1.0f);
            kz->gemm_dsoft(M, N, K, A.data(), ars, acs, B.data(), N, got.data(), N, P.data(), N, D.data());
            differ = 0;
            for (std::size_t j = 0; j < M * N; ++j)
              if (std::memcmp(&ref[j], &got[j], sizeof(float)) != 0 && differ++ == 0)
                UNSCOPED_INFO("gemm_dsoft first differs at " << j << ": " << std::setprecision(9) << got[j] << " against "
                                                          << ref[j]);
            CHECK(differ == 0);
          }
}

// The tile kernels compile A's strides in where they are a tile's (rows 64 floats apart, or
// columns: the scores and dU, read by rows or transposed) and read them from the call otherwise.
// The same A at stride 64 and at stride 67 must give the same bits in every product, each epilogue,
// every width of C (one, two, three and four vectors) and partial micro-tiles of rows.
// [gemm_paths]: ctest runs it under XGRAD_ISA=avx2 too.
TEST_CASE("fused attention tile kernels: A at a tile's stride and at another stride give the same bits",
          "[attention][fused][gemm_paths]") {
  const tile::Kernels* kz = tile::kernels();
  if (!kz) return;  // no AVX2 + FMA: the tile path is not used
  INFO("float32 tile kernels: " << kz->isa);
  Generator g(31);
  constexpr std::size_t kTileStride = 64, kOther = 67;
  for (const bool trans : {false, true})
    for (const std::size_t M : {std::size_t(64), std::size_t(13)})
      for (std::size_t nv = 1; nv <= 4; ++nv) {
        const std::size_t N = nv * kz->width, K = trans ? 40 : 64;  // A(i, k): K <= 64 columns of a tile row
        INFO("A transposed " << trans << ", M " << M << ", N " << N << ", K " << K);
        // A(i, k) at i * rs + k * cs: by rows rs = stride, cs = 1; transposed rs = 1, cs = stride
        const auto fill = [&](std::size_t stride, const std::vector<float>& vals) {
          std::vector<float> a(stride * 64 + 64, std::numeric_limits<float>::quiet_NaN());
          for (std::size_t i = 0; i < M; ++i)
            for (std::size_t k = 0; k < K; ++k) a[trans ? k * stride + i : i * stride + k] = vals[i * K + k];
          return a;
        };
        std::vector<float> vals(M * K), B(K * N), P(M * N), m(M), lz(M), D(M);
        for (float& v : vals) v = static_cast<float>(g.normal());
        for (float& v : B) v = static_cast<float>(g.normal());
        for (float& v : P) v = static_cast<float>(g.uniform());
        for (std::size_t i = 0; i < M; ++i) {
          m[i] = static_cast<float>(g.normal());
          lz[i] = static_cast<float>(g.uniform());
          D[i] = static_cast<float>(g.normal());
        }
        const std::vector<float> a64 = fill(kTileStride, vals), a67 = fill(kOther, vals);
        const std::size_t rs64 = trans ? 1 : kTileStride, cs64 = trans ? kTileStride : 1;
        const std::size_t rs67 = trans ? 1 : kOther, cs67 = trans ? kOther : 1;
        const float alpha = static_cast<float>(1 / std::sqrt(32.0));
        std::vector<float> c64(M * N), c67(M * N);
        for (const bool acc : {false, true}) {
          for (std::size_t i = 0; i < M * N; ++i) c64[i] = c67[i] = static_cast<float>(i % 7);
          kz->gemm(M, N, K, alpha, a64.data(), rs64, cs64, B.data(), N, c64.data(), N, acc);
          kz->gemm(M, N, K, alpha, a67.data(), rs67, cs67, B.data(), N, c67.data(), N, acc);
          CHECK(bit_differences(c64, c67, "C") == 0);
        }
        kz->gemm_exp(M, N, K, alpha, a64.data(), rs64, cs64, B.data(), N, c64.data(), N, m.data(), lz.data());
        kz->gemm_exp(M, N, K, alpha, a67.data(), rs67, cs67, B.data(), N, c67.data(), N, m.data(), lz.data());
        CHECK(bit_differences(c64, c67, "C") == 0);
        kz->gemm_dsoft(M, N, K, a64.data(), rs64, cs64, B.data(), N, c64.data(), N, P.data(), N, D.data());
        kz->gemm_dsoft(M, N, K, a67.data(), rs67, cs67, B.data(), N, c67.data(), N, P.data(), N, D.data());
        CHECK(bit_differences(c64, c67, "C") == 0);
      }
}

// The forward pass's whole tiles take the scores' product and the online-softmax step in one call
// (gemm_softmax; with AVX-512 and N 64 from the product's registers): the bits, the return and the
// state of gemm then softmax_rows, on rows with nothing accumulated yet, rows whose max grows and
// rows whose max stays, partial micro-tiles of rows, and a non-finite score in the first, a middle
// and the last micro-tile (the call stops at that row as softmax_rows does, the rows from it left
// as the product's scores).
// [gemm_paths]: ctest runs it under XGRAD_ISA=avx2 too (there every N takes gemm and softmax_rows).
TEST_CASE("fused attention tile kernels: gemm_softmax equals the product then softmax_rows bit for bit",
          "[attention][fused][gemm_paths]") {
  const tile::Kernels* kz = tile::kernels();
  if (!kz) return;  // no AVX2 + FMA: the tile path is not used
  INFO("float32 tile kernels: " << kz->isa);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::size_t dv = 3 * kz->width;
  Generator g(29);
  for (const std::size_t M : {std::size_t(128), std::size_t(13), std::size_t(6), std::size_t(2)})
    for (const std::size_t N : {std::size_t(64), 2 * kz->width})
      for (const std::size_t K : {std::size_t(64), std::size_t(7)})
        for (const float alpha : {1.0f, 0.125f, static_cast<float>(1 / std::sqrt(32.0))})
          for (const std::size_t bad_row : {M, std::size_t(0), M / 2, M - 1}) {  // M: none
            const float bad = bad_row % 2 ? std::numeric_limits<float>::quiet_NaN()
                                          : std::numeric_limits<float>::infinity();
            INFO("M " << M << ", N " << N << ", K " << K << ", alpha " << alpha << ", non-finite score in row "
                      << bad_row << " (M: none)");
            std::vector<float> A(M * K), B(K * N), acc0(M * dv), m0(M), l0(M);
            for (float& v : A) v = static_cast<float>(2 * g.normal());
            for (float& v : B) v = static_cast<float>(g.normal());
            for (float& v : acc0) v = static_cast<float>(g.normal());
            for (std::size_t i = 0; i < M; ++i) {  // none yet / a max far below (it grows) / far above (it stays)
              m0[i] = i % 3 == 0 ? kNegInf : static_cast<float>(i % 3 == 1 ? -40 : 40);
              l0[i] = m0[i] == kNegInf ? 0.0f : static_cast<float>(1 + g.uniform());
            }
            if (bad_row < M) A[bad_row * K + K / 2] = bad;  // a whole row of non-finite scores
            std::vector<float> C1(M * N), acc1 = acc0, m1 = m0, l1 = l0;
            kz->gemm(M, N, K, alpha, A.data(), K, 1, B.data(), N, C1.data(), N, false);
            const std::size_t done1 =
                kz->softmax_rows(C1.data(), N, M, N, m1.data(), l1.data(), acc1.data(), dv, dv);
            REQUIRE(done1 == bad_row);  // (the reference stops where the scores are not finite)
            std::vector<float> C2(M * N, -1.0f), acc2 = acc0, m2 = m0, l2 = l0;
            const std::size_t done2 = kz->gemm_softmax(M, N, K, alpha, A.data(), K, 1, B.data(), N, C2.data(), N,
                                                       m2.data(), l2.data(), acc2.data(), dv, dv);
            CHECK(done2 == done1);
            CHECK(bit_differences(C2, C1, "C") == 0);
            CHECK(bit_differences(acc2, acc1, "acc") == 0);
            CHECK(bit_differences(m2, m1, "m") == 0);
            CHECK(bit_differences(l2, l1, "l") == 0);
          }
}

// The tile kernels' e^x (exp_shift, and so gemm_exp, which gives its bits): within 1 ulp of
// double-precision exp over float32's whole normal range of results (every 997th bit pattern of
// [-87.33, 88.37], about 4.5 million values, and their edges), 0 below -87.34 and for -inf
// (no subnormal weight), NaN kept; and the sum it returns is the sum of what it stores.
// [gemm_paths]: ctest runs it under XGRAD_ISA=avx2 too (the AVX2 kernels build 2^n another way).
TEST_CASE("fused attention tile kernels: exp_shift is within 1 ulp of e^x and flushes below -87.34",
          "[attention][fused][gemm_paths]") {
  const tile::Kernels* kz = tile::kernels();
  if (!kz) return;  // no AVX2 + FMA: the tile path is not used
  INFO("float32 tile kernels: " << kz->isa);
  const auto bits_of = [](float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  const auto float_of = [](std::uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  };
  std::vector<float> x;
  // negative arguments: bit patterns from -0 up to -87.33; positive: from +0 up to 88.37
  for (std::uint32_t u = bits_of(-0.0f); u <= bits_of(-87.33f); u += 997) x.push_back(float_of(u));
  const std::size_t negatives = x.size();
  for (std::uint32_t u = 0; u <= bits_of(88.37f); u += 997) x.push_back(float_of(u));
  for (const float e : {-87.33f, 88.37f, 88.3762589f, -87.3365f, 0.3465736f, -0.3465736f, 1e-30f, -1e-30f})
    x.push_back(e);
  const std::size_t n = x.size();
  std::vector<float> y = x;
  const float neg_sum = kz->exp_shift(y.data(), negatives, 0.0f, 0.0f);
  kz->exp_shift(y.data() + negatives, n - negatives, 0.0f, 0.0f);
  double worst = 0.0, neg_total = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    int e = 0;
    std::frexp(ref, &e);
    const double ulp = std::ldexp(1.0, std::max(e, -125) - 24);  // float32's ulp at ref
    const double err = std::fabs(static_cast<double>(y[i]) - ref) / ulp;
    if (!(err <= worst)) {
      worst = err;
      at = i;
    }
    if (i < negatives) neg_total += y[i];
  }
  INFO(std::setprecision(9) << "worst " << worst << " ulp at x = " << x[at] << ": " << y[at] << " against "
                            << std::exp(static_cast<double>(x[at])) << " (" << n << " arguments)");
  CHECK(worst <= 1.0);
  // The returned sum (of the negative arguments' results: the positive ones overflow a float32
  // sum): each lane adds negatives / width positive terms in float32, then the lanes are added,
  // so the sum is within (negatives / width + width) 2^-24 of the double total, relatively.
  const double terms = static_cast<double>(negatives) / static_cast<double>(kz->width) + static_cast<double>(kz->width);
  CHECK(std::fabs(neg_sum - neg_total) <= terms * std::ldexp(1.0, -24) * neg_total);
  // Flushed and special arguments, in a row of 2 * width + 3 (vectors and the padded tail).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special{-87.34f, -87.4f, -100.0f, -1e30f, -inf, nan, 0.0f, -0.0f};
  for (std::size_t shift = 0; shift < 2 * kz->width + 3; shift += 5) {
    std::vector<float> row(2 * kz->width + 3, -inf);
    for (std::size_t k = 0; k < special.size(); ++k) row[(shift + k) % row.size()] = special[k];
    kz->exp_shift(row.data(), row.size(), 0.0f, 0.0f);
    for (std::size_t k = 0; k < special.size(); ++k) {
      const float v = row[(shift + k) % row.size()];
      INFO(std::setprecision(9) << "e^" << special[k] << " gave " << v << " (lane " << (shift + k) % row.size() << ")");
      if (k < 5)
        CHECK(bits_of(v) == 0u);  // +0: flushed, never a subnormal
      else if (k == 5)
        CHECK(std::isnan(v));
      else
        CHECK(v == 1.0f);  // e^0 and e^-0
    }
  }
}

// The row kernels on every length from 0 to 3 widths + 1 (whole vectors and a masked tail):
// max is the row's maximum wherever it lies, finite is false wherever an inf or NaN lies,
// exp_shift gives each element the bits it gets inside a whole vector (tail lanes alike) and
// writes nothing past the row (guard values after it stay).
// [gemm_paths]: ctest runs it under XGRAD_ISA=avx2 too.
TEST_CASE("fused attention tile kernels: max finite and exp_shift on every row length",
          "[attention][fused][gemm_paths]") {
  const tile::Kernels* kz = tile::kernels();
  if (!kz) return;  // no AVX2 + FMA: the tile path is not used
  INFO("float32 tile kernels: " << kz->isa);
  const std::size_t W = kz->width, longest = 3 * W + 1;
  Generator g(17);
  std::vector<float> base(longest);
  for (float& v : base) v = static_cast<float>(4 * g.normal());
  // exp_shift of the whole vectors of a long row: the reference bits of each element.
  std::vector<float> whole(base.begin(), base.begin() + 3 * W);
  const float m = 1.5f, lz = 0.25f;
  kz->exp_shift(whole.data(), whole.size(), m, lz);
  constexpr float kGuard = 12345.0f;
  for (std::size_t n = 0; n <= longest; ++n) {
    INFO("row length " << n);
    std::vector<float> row(base.begin(), base.begin() + n);
    float ref_max = -std::numeric_limits<float>::infinity();
    for (const float v : row) ref_max = std::max(ref_max, v);
    CHECK(kz->max(row.data(), n) == ref_max);
    CHECK(kz->finite(row.data(), n));
    for (std::size_t at = 0; at < n; ++at) {  // the largest value at each position, then a non-finite one
      std::vector<float> r = row;
      r[at] = 100.0f;
      CHECK(kz->max(r.data(), n) == 100.0f);
      for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()}) {
        r[at] = bad;
        if (kz->finite(r.data(), n)) FAIL_CHECK("finite() missed " << bad << " at " << at);
      }
    }
    if (n > 3 * W) continue;  // (the reference row is 3 widths long)
    std::vector<float> x(row);
    x.resize(n + W, kGuard);  // a whole vector of guards after the row
    const float sum = kz->exp_shift(x.data(), n, m, lz);
    double total = 0.0;
    std::size_t differ = 0;
    for (std::size_t j = 0; j < n; ++j) {
      total += x[j];
      if (std::memcmp(&x[j], &whole[j], sizeof(float)) != 0 && differ++ == 0)
        UNSCOPED_INFO(std::setprecision(9) << "exp_shift element " << j << ": " << x[j] << " against " << whole[j]);
    }
    CHECK(differ == 0);
    for (std::size_t j = n; j < n + W; ++j)
      if (x[j] != kGuard) FAIL_CHECK("exp_shift wrote past the row at " << j << ": " << x[j]);
    CHECK(std::fabs(sum - total) <= 1e-6 * (total + 1e-30));
  }
}

// The forward pass's online-softmax step on rows that see parts of a tile (softmax_parts): the
// per-row loop it replaces (finite, max, the rescale, exp_shift, the zeros outside the part),
// bit for bit, on parts that are empty, whole, at the start, at the end and inside, with rows
// that have accumulated nothing yet and rows whose max grows or stays; and its stop at the first
// row with a non-finite score in its part, a non-finite score outside the part ignored.
// [gemm_paths]: ctest runs it under XGRAD_ISA=avx2 too.
TEST_CASE("fused attention tile kernels: softmax_parts equals the per-row loop bit for bit",
          "[attention][fused][gemm_paths]") {
  const tile::Kernels* kz = tile::kernels();
  if (!kz) return;  // no AVX2 + FMA: the tile path is not used
  INFO("float32 tile kernels: " << kz->isa);
  constexpr std::size_t n = 64, rows = 14, dv = 2 * 16;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::size_t ja[rows] = {0, 0, 0, 5, 17, 33, 63, 0, 10, 40, 1, 0, 20, 7};
  const std::size_t je[rows] = {0, 64, 1, 6, 49, 64, 64, 31, 10, 41, 63, 16, 64, 8};
  Generator g(41);
  std::vector<float> S0(rows * n), acc0(rows * dv), m0(rows), l0(rows);
  for (float& v : S0) v = static_cast<float>(3 * g.normal());
  for (float& v : acc0) v = static_cast<float>(g.normal());
  for (std::size_t k = 0; k < rows; ++k) {
    m0[k] = k % 3 == 0 ? kNegInf : static_cast<float>(k % 3 == 1 ? -10 : 10);  // none yet / grows / stays
    l0[k] = m0[k] == kNegInf ? 0.0f : static_cast<float>(1 + g.uniform());
  }
  // The reference: forward_block_tiles' per-row loop on the same rows.
  std::vector<float> S1 = S0, acc1 = acc0, m1 = m0, l1 = l0;
  for (std::size_t k = 0; k < rows; ++k) {
    float* s = S1.data() + k * n;
    if (ja[k] == je[k]) {
      std::fill(s, s + n, 0.0f);
      continue;
    }
    REQUIRE(kz->finite(s + ja[k], je[k] - ja[k]));
    const float mx = kz->max(s + ja[k], je[k] - ja[k]);
    if (mx > m1[k]) {
      if (m1[k] != kNegInf) {
        const float f = std::exp(m1[k] - mx);
        l1[k] *= f;
        for (std::size_t c = 0; c < dv; ++c) acc1[k * dv + c] *= f;
      }
      m1[k] = mx;
    }
    std::fill(s, s + ja[k], 0.0f);
    l1[k] += kz->exp_shift(s + ja[k], je[k] - ja[k], m1[k], 0.0f);
    std::fill(s + je[k], s + n, 0.0f);
  }
  std::vector<float> S2 = S0, acc2 = acc0, m2 = m0, l2 = l0;
  CHECK(kz->softmax_parts(S2.data(), n, rows, ja, je, n, m2.data(), l2.data(), acc2.data(), dv, dv) == rows);
  CHECK(bit_differences(S2, S1, "S") == 0);
  CHECK(bit_differences(acc2, acc1, "acc") == 0);
  CHECK(bit_differences(m2, m1, "m") == 0);
  CHECK(bit_differences(l2, l1, "l") == 0);
  // A non-finite score inside row 4's part stops the call there (rows 0-3 done, row 4 untouched);
  // one outside row 3's part (key 20, the part is [5, 6)) is not looked at.
  std::vector<float> S3 = S0, acc3 = acc0, m3 = m0, l3 = l0;
  S3[3 * n + 20] = std::numeric_limits<float>::quiet_NaN();
  S3[4 * n + 30] = std::numeric_limits<float>::infinity();
  CHECK(kz->softmax_parts(S3.data(), n, rows, ja, je, n, m3.data(), l3.data(), acc3.data(), dv, dv) == 4);
  CHECK(std::memcmp(S3.data(), S1.data(), 4 * n * sizeof(float)) == 0);  // rows 0-3, the NaN zeroed
  CHECK(std::memcmp(S3.data() + 4 * n, S0.data() + 4 * n, 30 * sizeof(float)) == 0);
  CHECK(std::memcmp(m3.data(), m1.data(), 4 * sizeof(float)) == 0);
  CHECK(m3[4] == m0[4]);
}

// Tiles that rows see in part (the causal diagonal, windows' and documents' edges) take the exact
// path when every row of the tile is valid with nothing to apply in its part (the fused passes,
// and on either path dV and dK summed by key chunks over the rows that see each), the general
// path otherwise. set_exact_parts(false) is the tile path as it was before both: the two must give
// the same bits, on every visibility kind of cases() with the float32 tile kernels (head widths
// 16 and 64: one vector of the AVX-512 kernels, micro-tiles of 12 rows, and four), with dropout
// too. The counters show which path each run took.
// [gemm_paths]: ctest runs it under XGRAD_ISA=avx2 too.
TEST_CASE("fused attention: partial tiles give the same bits on the exact and the general path",
          "[attention][fused][gemm_paths]") {
  if (!tile::kernels()) return;  // no AVX2 + FMA: the tile path is not used
  INFO("float32 tile kernels: " << tile::kernels()->isa);
  struct Restore {
    ~Restore() { set_exact_parts(true); }
  } restore;
  const auto calls = [] {
    return std::make_pair(partial_tile_calls(PartialTilePath::exact_parts),
                          partial_tile_calls(PartialTilePath::general));
  };
  std::uint64_t exact_total = 0;
  for (const auto& dims : {std::make_pair(std::size_t(16), std::size_t(16)), std::make_pair(std::size_t(32), std::size_t(32)), std::make_pair(std::size_t(64), std::size_t(32))})
    for (const Case& c : cases(dims.first, dims.second))
      for (const double p : {0.0, 0.2}) {
        INFO(c.name << ", d_k " << c.d_k << ", d_v " << c.d_v << ", dropout " << p);
        set_exact_parts(false);
        const auto before = calls();
        const Run a = run(c, SdpaImpl::fused, DType::float32, p, 13, 5);
        const auto mid = calls();
        set_exact_parts(true);
        const Run b = run(c, SdpaImpl::fused, DType::float32, p, 13, 5);
        const auto after = calls();
        CHECK(mid.first == before.first);  // the general path only
        if (c.name.rfind("causal square", 0) == 0) CHECK(mid.second > before.second);
        exact_total += after.first - mid.first;
        if (p > 0) CHECK(after.first == mid.first);  // dropout: the general path (dV, dK by key chunks)
        // The exact path where the tiles' rows are exact: the causal and window-like kinds.
        if (p == 0 && (c.name.rfind("causal square", 0) == 0 || c.name.rfind("documents", 0) == 0))
          CHECK(after.first > mid.first);
        if (c.name.rfind("soft bias", 0) == 0) CHECK(after.first == mid.first);  // a bias: never exact
        // Same arithmetic on the same visible ranges, less leading and trailing zero terms.
        XGT_CHECK_SAME(b.O, a.O);
        XGT_CHECK_SAME(b.dQ, a.dQ);
        XGT_CHECK_SAME(b.dK, a.dK);
        XGT_CHECK_SAME(b.dV, a.dV);
      }
  CHECK(exact_total > 0);
}

TEST_CASE("fused attention in float32 on odd lengths 1 7 13 127 129 with dropout matches float64",
          "[attention][fused][gemm_paths]") {
  // Odd query and key counts leave partial 128-row blocks and 64-key tiles; dropout draws the
  // same mask in both dtypes (the seed is the generator's), so the float64 run is the reference.
  for (std::size_t T : {1, 7, 13, 127, 129})
    for (double p : {0.0, 0.2}) {
      INFO("T " << T << ", dropout " << p);
      const Case c{"causal GQA", 2, 4, 2, T, T, 16, 32, Visibility::causal(T, T), BoolArray::filled({2, T}, true)};
      const Run a = run(c, SdpaImpl::fused, DType::float64, p, 9, 3);
      const Run b = run(c, SdpaImpl::fused, DType::float32, p, 9, 3);
      require_close(b.O.astype(DType::float64), a.O, 2e-5);
      require_close(b.dQ.astype(DType::float64), a.dQ, 1e-4);
      require_close(b.dK.astype(DType::float64), a.dK, 1e-4);
      require_close(b.dV.astype(DType::float64), a.dV, 1e-4);
    }
}

TEST_CASE("fused attention is bit-identical run to run", "[attention][fused]") {
  const Case c = cases()[1];
  const Run a = run(c, SdpaImpl::fused, DType::float32, 0.1, 2, 2);
  const Run b = run(c, SdpaImpl::fused, DType::float32, 0.1, 2, 2);
  // The same shapes, thread count and partition: the same bits (the tiles' order is fixed).
  XGT_CHECK_SAME(a.O, b.O);
  XGT_CHECK_SAME(a.dQ, b.dQ);
  XGT_CHECK_SAME(a.dK, b.dK);
  XGT_CHECK_SAME(a.dV, b.dV);
}

TEST_CASE("fused attention reports the composed path's errors", "[attention][fused][errors]") {
  Generator g(1);
  const Tensor Q(rnd({1, 1, 3, 2}, g)), K(rnd({1, 1, 3, 2}, g)), V(rnd({1, 1, 3, 2}, g));
  SdpaOptions o;
  o.impl = SdpaImpl::fused;
  // A valid query that sees no key: causal over keys all in the future.
  const Visibility future = Visibility::causal({0, 1, 2}, {5, 6, 7});
  CHECK_THROWS_AS(scaled_dot_product_attention(Q, K, V, future, o), VisibilityError);
  CHECK_THROWS_WITH(scaled_dot_product_attention(Q, K, V, future, o), Catch::Contains("batch 0, head 0, query 0"));
  o.impl = SdpaImpl::composed;
  CHECK_THROWS_AS(scaled_dot_product_attention(Q, K, V, future, o), VisibilityError);
  // The weights exist only on the composed path.
  o.impl = SdpaImpl::fused;
  o.return_weights = true;
  CHECK_THROWS_WITH(scaled_dot_product_attention(Q, K, V, Visibility::all(), o), Catch::Contains("return_weights"));
  o.impl = SdpaImpl::automatic;  // automatic takes the composed path when the weights are asked for
  CHECK(scaled_dot_product_attention(Q, K, V, Visibility::all(), o).weights.defined());
  // A visibility that does not broadcast to the scores names both shapes.
  o.return_weights = false;
  CHECK_THROWS_WITH(scaled_dot_product_attention(Q, K, V, Visibility::causal(2, 2), o),
                    Catch::Contains("(1, 1, 3, 3)"));
}

TEST_CASE("fused attention: non-finite scores from finite inputs are an error (Algorithm 5.1 step 3)",
          "[attention][fused][errors]") {
  const Tensor Q(Array::full({1, 1, 2, 1}, 1e200, DType::float64));
  const Tensor K(Array::full({1, 1, 2, 1}, 1e200, DType::float64));
  const Tensor V(Array::full({1, 1, 2, 1}, 1.0, DType::float64));
  SdpaOptions o;
  o.impl = SdpaImpl::fused;
  CHECK_THROWS_WITH(scaled_dot_product_attention(Q, K, V, Visibility::all(), o), Catch::Contains("step 3"));
}

namespace {

// Q [1, 1, 3, 2], K and V [1, 1, 4, 2]. Feature 0 of Q is 0 except at `big_query`, feature 0 of K
// is 0 except at `big_key`, both `big`: the score (big_query, big_key) overflows to +inf and every
// other score is the moderate feature-1 product. With big = 0 the same inputs without overflow.
struct Overflow {
  Array Q, K, V, G;
};
Overflow overflow_inputs(DType dt, double big, std::size_t big_query, std::size_t big_key) {
  Generator g(313);
  Overflow o{rnd({1, 1, 3, 2}, g, -1, 1), rnd({1, 1, 4, 2}, g, -1, 1), rnd({1, 1, 4, 2}, g, -1, 1),
             rnd({1, 1, 3, 2}, g, -1, 1)};
  for (std::size_t i = 0; i < 3; ++i) o.Q.set_flat(i * 2, i == big_query ? big : 0.0);
  for (std::size_t j = 0; j < 4; ++j) o.K.set_flat(j * 2, j == big_key ? big : 0.0);
  o.Q = o.Q.astype(dt);
  o.K = o.K.astype(dt);
  o.V = o.V.astype(dt);
  o.G = o.G.astype(dt);
  return o;
}

std::vector<Array> run_overflow(const Overflow& in, const Visibility& vis, const BoolArray& valid, SdpaImpl impl) {
  Tensor Q(in.Q, true), K(in.K, true), V(in.V, true);
  SdpaOptions o{std::nullopt, valid};  // (initialised, not assigned: GCC 12 -Wnonnull false positive)
  o.impl = impl;
  const SdpaResult r = scaled_dot_product_attention(Q, K, V, vis, o);
  REQUIRE(r.path == impl);
  std::vector<Array> out{r.output.value()};
  for (const Array& a : grad(r.output, {Q, K, V}, in.G)) out.push_back(a);
  return out;
}

}  // namespace

TEST_CASE("attention: both paths check Algorithm 5.1 step 3 only on visible keys of valid queries",
          "[attention][fused][errors]") {
  // float64: 1e200 * 1e200 overflows; float32: 1e20 * 1e20 does.
  for (const DType dt : {DType::float64, DType::float32}) {
    const double big = dt == DType::float64 ? 1e200 : 1e20, tol = dt == DType::float64 ? 1e-14 : 2e-6;
    const std::vector<std::string> names = {"output", "dQ", "dK", "dV"};
    // (a) The overflow is at a key the query may not see: past the row's key range (causal), or
    // inside it, forbidden by a dense mask (the row is not one contiguous run of keys).
    const Visibility dense =
        Visibility::allowed(BoolArray({3, 4}, {1, 0, 1, 1, /**/ 1, 0, 1, 1, /**/ 1, 1, 0, 1}));
    struct Sub {
      const char* name;
      Visibility vis;
      BoolArray valid;
      std::size_t q, k;
    };
    const std::vector<Sub> subs = {
        {"forbidden key past the row's range, causal", Visibility::causal(3, 4), {}, 0, 3},
        {"forbidden key inside the row's range, dense mask", dense, {}, 0, 1},
        {"forbidden key inside the row's range, dense mask and causal", dense & Visibility::causal(3, 4), {}, 1, 1},
        {"forbidden key, dense mask, last row", dense, BoolArray({1, 3}, {0, 1, 1}), 2, 2},
        // (b) The overflow is in the row of an invalid query (every key visible to it).
        {"invalid query row", Visibility::all(), BoolArray({1, 3}, {1, 1, 0}), 2, 1},
        {"invalid query row, causal", Visibility::causal(3, 4), BoolArray({1, 3}, {0, 1, 1}), 0, 0},
    };
    for (const Sub& sub : subs) {
      INFO(dtype_name(dt) << ": " << sub.name);
      const Overflow in = overflow_inputs(dt, big, sub.q, sub.k);
      // The reference: the same inputs with big = 0. Big multiplies only feature 0 of one query
      // and one key, so the overflowing score is the only score it changes, and that score is
      // never used: the output, dV and the feature-1 gradients of Q and K are the reference's.
      // The feature-0 gradients are big * (other rows' score gradients): the paths must agree.
      const auto ref = run_overflow(overflow_inputs(dt, 0.0, sub.q, sub.k), sub.vis, sub.valid, SdpaImpl::composed);
      std::vector<std::vector<Array>> got(2);
      for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
        INFO((impl == SdpaImpl::fused ? "fused" : "composed"));
        auto& r = got[impl == SdpaImpl::fused];
        REQUIRE_NOTHROW(r = run_overflow(in, sub.vis, sub.valid, impl));
        for (std::size_t k = 0; k < r.size(); ++k) {
          INFO(names[k]);
          REQUIRE(r[k].all_finite());
          for (std::size_t x = 0; x < r[k].size(); ++x)
            if (k == 0 || k == 3 || x % 2 == 1) CHECK(std::fabs(r[k].flat(x) - ref[k].flat(x)) <= tol);
        }
      }
      for (const std::size_t k : {1, 2})  // dQ, dK feature 0: the two paths agree
        for (std::size_t x = 0; x < got[0][k].size(); x += 2) {
          INFO(names[k] << " flat " << x << ": composed " << got[0][k].flat(x) << ", fused " << got[1][k].flat(x));
          CHECK(std::fabs(got[0][k].flat(x) - got[1][k].flat(x)) <= tol * (1 + std::fabs(got[0][k].flat(x))));
        }
    }
    // (c) The overflow at a visible key of a valid query is an error on both paths, naming it.
    for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
      INFO(dtype_name(dt) << (impl == SdpaImpl::fused ? " fused" : " composed"));
      const Overflow in = overflow_inputs(dt, big, 1, 2);
      CHECK_THROWS_WITH(run_overflow(in, Visibility::all(), {}, impl),
                        Catch::Contains("query 1, key 2") && Catch::Contains("Algorithm 5.1 step 3"));
      CHECK_THROWS_WITH(run_overflow(in, dense & Visibility::causal(3, 4), BoolArray({1, 3}, {1, 1, 0}), impl),
                        Catch::Contains("query 1, key 2") && Catch::Contains("Algorithm 5.1 step 3"));
    }
  }
}

TEST_CASE("attention in float32 with scores near 1e3: both paths match a float64 computation to the same tolerance",
          "[attention][fused][precision]") {
  // Scaled scores u = 0.5 q.k with feature 0 of Q near 40 and of K near 50: every row maximum is
  // about 1e3 while the scores of a row differ by O(1), so the weights are far from one-hot and
  // the gradients are not small. The float32 inputs are cast exactly to float64 and run through
  // the composed path in float64: the reference (independent of the fused kernel).
  Generator g(2024);
  const std::size_t B = 2, H_q = 4, H_kv = 2, T = 37, S = 41, d_k = 8, d_v = 4;
  Array Q = rnd({B, H_q, T, d_k}, g, -1, 1), K = rnd({B, H_kv, S, d_k}, g, -1, 1);
  for (std::size_t r = 0; r < B * H_q * T; ++r) Q.set_flat(r * d_k, 40.0 + 0.05 * Q.flat(r * d_k));
  for (std::size_t r = 0; r < B * H_kv * S; ++r) K.set_flat(r * d_k, 50.0 + 0.05 * K.flat(r * d_k));
  const Array V = rnd({B, H_kv, S, d_v}, g, -1, 1), G = rnd({B, H_q, T, d_v}, g, -1, 1);
  const auto run = [&](DType dt, SdpaImpl impl, const Visibility& vis) {
    Tensor q(Q.astype(DType::float32).astype(dt), true), k(K.astype(DType::float32).astype(dt), true);
    Tensor v(V.astype(DType::float32).astype(dt), true);
    SdpaOptions o;
    o.impl = impl;
    o.scale = 0.5;
    const SdpaResult r = scaled_dot_product_attention(q, k, v, vis, o);
    REQUIRE(r.path == impl);
    std::vector<Array> out{r.output.value()};
    for (const Array& a : grad(r.output, {q, k, v}, G.astype(DType::float32).astype(dt)))
      out.push_back(a.astype(DType::float64));
    out[0] = out[0].astype(DType::float64);
    return out;
  };
  // One tolerance for both paths, relative to the largest reference value. Rounding the scores
  // (~1e3) to float32 alone moves the weights by ~6e-5 relative: both paths stay below 1e-4.
  // A fused backward that rebuilt the weights from one float32 log-sum-exp (m + log z rounded
  // together) had dQ errors of 2e-3 here.
  const double kTolLargeScores = 2e-4;
  const std::vector<std::string> names = {"O", "dQ", "dK", "dV"};
  for (const Visibility& vis : {Visibility::all(), Visibility::causal(T, S)}) {
    const auto ref = run(DType::float64, SdpaImpl::composed, vis);
    double row_max = -1e300;  // the largest scaled score: near 1e3
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H_q; ++h)
        for (std::size_t i = 0; i < T; ++i)
          for (std::size_t j = 0; j < S; ++j) {
            double u = 0;
            for (std::size_t x = 0; x < d_k; ++x)
              u += Q.flat(((b * H_q + h) * T + i) * d_k + x) * K.flat(((b * H_kv + h / 2) * S + j) * d_k + x);
            row_max = std::max(row_max, 0.5 * u);
          }
    REQUIRE(row_max > 900.0);
    REQUIRE(row_max < 1100.0);
    for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
      const auto got = run(DType::float32, impl, vis);
      for (std::size_t k = 0; k < got.size(); ++k) {
        double scale = 0;
        for (std::size_t x = 0; x < ref[k].size(); ++x) scale = std::max(scale, std::fabs(ref[k].flat(x)));
        const double err = max_abs_diff(got[k], ref[k]) / scale;
        INFO((impl == SdpaImpl::fused ? "fused " : "composed ") << names[k] << " error / max |reference| = " << err);
        CHECK(err < kTolLargeScores);
      }
    }
  }
}

namespace {

// How many times op `name` ran forward and backward since the profile was last reset.
std::pair<std::uint64_t, std::uint64_t> op_calls(const std::string& name) {
  for (const auto& t : detail::op_profile())
    if (t.op == name) return {t.forward_calls, t.backward_calls};
  return {0, 0};
}

struct Profiled {
  Profiled() {
    detail::set_profiling(true);
    detail::reset_profile();
  }
  ~Profiled() { detail::set_profiling(false); }
};

}  // namespace

TEST_CASE("fused attention reads Q K V in place from the packed projection: equal to the split heads",
          "[attention][fused][gemm_paths]") {
  // MultiHeadAttention's projection P [B, T, (H_q + 2 H_kv) d] holds [Q heads | K heads | V heads].
  // The packed op reads them strided and writes O [B, T, H_q d] and dP in place; the split path
  // slices P, transposes the heads, runs flash_attention and merges the heads back. The two run
  // the same products over the same operands, only read through other strides (bits: below).
  struct PackedCase {
    const char* name;
    std::size_t B, H_q, H_kv, T;
    Visibility vis;
    BoolArray valid;
  };
  BoolArray holes = BoolArray::filled({2, 129}, true);
  for (std::size_t i = 0; i < 129; i += 5) holes.data[129 + i] = 0;
  const std::vector<PackedCase> cs = {
      {"causal GQA over two query blocks with invalid queries", 2, 4, 2, 129, Visibility::causal(129, 129), holes},
      {"ALiBi and a sliding window on one kv head (blocks split over threads)", 1, 2, 1, 70,
       Visibility::alibi(alibi_slopes(2), iota(70), iota(70)) & Visibility::sliding_window(70, 70, 9), {}},
      {"key lengths MHA", 3, 2, 2, 40, Visibility::key_lengths({40, 17, 1}, 40) & Visibility::causal(40, 40), {}},
  };
  for (const DType dtype : {DType::float32, DType::float64})
    for (const std::size_t d : {5, 16, 32})
      for (const PackedCase& c : cs)
        for (const double p : {0.0, 0.2}) {
          INFO(c.name << ", " << dtype_name(dtype) << ", d " << d << ", dropout " << p);
          Generator g(d * 7 + c.T);
          const std::size_t W = (c.H_q + 2 * c.H_kv) * d;
          const Tensor P(rnd({c.B, c.T, W}, g, -2, 2).astype(dtype), true);
          const Array G = rnd({c.B, c.T, c.H_q * d}, g).astype(dtype);
          SdpaOptions o{std::nullopt, c.valid};  // (initialised, not assigned: GCC 12 -Wnonnull false positive)
          o.impl = SdpaImpl::fused;
          o.dropout_p = p;
          o.training = p > 0;
          Generator drop_a(3), drop_b(3);

          Profiled prof_a;
          o.generator = &drop_a;
          SdpaResult packed;
          REQUIRE(packed_self_attention(P, c.H_q, c.H_kv, c.vis, o, packed));
          const Array dP_packed = grad(packed.output, {P}, G)[0];
          CHECK(op_calls("flash_attention_packed") == std::pair<std::uint64_t, std::uint64_t>{1, 1});
          CHECK(op_calls("flash_attention").first == 0);
          CHECK(op_calls("slice").first == 0);

          detail::reset_profile();
          o.generator = &drop_b;
          const auto parts = ops::split(P, {c.H_q * d, c.H_kv * d, c.H_kv * d}, -1);
          const SdpaResult split = scaled_dot_product_attention(
              split_heads(parts[0], c.H_q), split_heads(parts[1], c.H_kv), split_heads(parts[2], c.H_kv), c.vis, o);
          const Tensor O_split = merge_heads(split.output);
          const Array dP_split = grad(O_split, {P}, G)[0];
          CHECK(op_calls("flash_attention") == std::pair<std::uint64_t, std::uint64_t>{1, 1});
          CHECK(op_calls("flash_attention_packed").first == 0);

          CHECK(packed.dropout_seed == split.dropout_seed);
          REQUIRE(packed.output.shape() == O_split.shape());
          // xgrad's own float32 tiles (d a multiple of the vector width) read each operand
          // element by element into the same FMA chains whatever its stride: the same bits. The
          // BLAS path (float64, other d) hands the strided operands to the BLAS, whose kernels may
          // round by stride or alignment (OpenBLAS's SkylakeX sgemm does): the same sums, a few
          // ulps of the longest reduction (T keys, or d features) apart.
          const tile::Kernels* kz = tile::kernels();
          if (dtype == DType::float32 && kz && d % kz->width == 0) {
            XGT_CHECK_SAME(packed.output.value(), O_split.value());
            XGT_CHECK_SAME(dP_packed, dP_split);
          } else {
            const std::size_t n = std::max<std::size_t>(c.T, d);
            XGT_CHECK_WITHIN(packed.output.value(), O_split.value(),
                             rounding_bound(n, dtype, std::max(1.0, max_abs(O_split.value()))));
            XGT_CHECK_WITHIN(dP_packed, dP_split, rounding_bound(n, dtype, std::max(1.0, max_abs(dP_split))));
          }
          CHECK(max_abs_diff(dP_packed, Array::zeros(dP_packed.shape(), dtype)) > 0.0);  // the gradient is not all zero
        }
}

TEST_CASE("MultiHeadAttention takes the packed fused path (RoPE included) unless the weights need the split heads",
          "[attention][fused]") {
  Generator g(4);
  AttentionConfig cfg;
  cfg.d_model = 32;
  cfg.H_q = 2;
  cfg.H_kv = 1;
  cfg.dtype = DType::float32;
  MultiHeadAttention plain(cfg, g);
  const Tensor X(rnd({2, 9, 32}, g).astype(DType::float32), true);
  AttentionCall call;
  call.visibility = Visibility::causal(9, 9);
  {
    Profiled prof;
    grad(ops::sum(plain.forward(X, call).Y), {X});
    CHECK(op_calls("flash_attention_packed") == std::pair<std::uint64_t, std::uint64_t>{1, 1});
    CHECK(op_calls("flash_attention").first == 0);
    CHECK(op_calls("slice").first == 0);
    CHECK(op_calls("permute").first == 0);
  }
  {
    Profiled prof;
    call.return_weights = true;  // the weights exist only on the composed path
    grad(ops::sum(plain.forward(X, call).Y), {X});
    CHECK(op_calls("flash_attention_packed").first == 0);
    CHECK(op_calls("softmax").first == 1);
    call.return_weights = false;
  }
  {
    AttentionConfig rc = cfg;
    rc.rope = ops::RopeConfig{};
    MultiHeadAttention rotary(rc, g);
    Profiled prof;  // RoPE turns Q and K where they lie in the projection: one rope op, no split
    grad(ops::sum(rotary.forward(X, call).Y), {X});
    CHECK(op_calls("rope") == std::pair<std::uint64_t, std::uint64_t>{1, 1});
    CHECK(op_calls("flash_attention_packed") == std::pair<std::uint64_t, std::uint64_t>{1, 1});
    CHECK(op_calls("slice").first == 0);
    CHECK(op_calls("permute").first == 0);
  }
  // A non-finite input is reported as the split path reports it: naming Q and the index there.
  Array bad = X.value();
  bad.set_flat(5, std::numeric_limits<double>::quiet_NaN());
  CHECK_THROWS_WITH(plain.forward(Tensor(bad), call),
                    Catch::Contains("Q has") && Catch::Contains("at index (0, 0, 0, "));
}
