// The fused attention under bfloat16 mixed precision (xg::set_matmul_dtype): where the choice
// (nn/detail/flash_tile.hpp, bf16_choice) runs its tile products in bfloat16 (AMX tiles or
// AVX512_BF16 dot products), O and the
// gradients stay within bfloat16 rounding of the float64 result, on the visibility kinds whose
// tiles start at odd keys and odd rows (the paths that round an operand per product) as well as
// whole tiles; the products are counted; and the bits do not depend on the thread count. Where
// the choice keeps float32, the results are float32's bits. ctest runs these tests under
// XGRAD_BF16_ATTENTION=on, =off, =amx and =dpbf16 as well (attention_bf16_forced_on, _off, _amx,
// _dpbf16).
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/helpers.hpp"
#include <xgrad/core/detail/amx_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/nn/detail/flash_tile.hpp>
#include <xgrad/nn/sdpa.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

struct Shape4 {
  std::string name;
  std::size_t B, H_q, H_kv, T, d_k, d_v;
  Visibility vis;
};

struct Outputs {
  Array O, dQ, dK, dV;
};

// Fused attention forward and backward of `s` on fixed random inputs in `dtype`, under `mode`,
// with dropout p on the weights (the same mask in every call: a generator of the same seed).
Outputs fused(const Shape4& s, DType dtype, MatmulDtype mode, double dropout = 0.0) {
  const MatmulDtypeScope scope(mode);
  Generator g(29);
  Tensor Q(rnd({s.B, s.H_q, s.T, s.d_k}, g, -1, 1).astype(dtype), true);
  Tensor K(rnd({s.B, s.H_kv, s.T, s.d_k}, g, -1, 1).astype(dtype), true);
  Tensor V(rnd({s.B, s.H_kv, s.T, s.d_v}, g, -1, 1).astype(dtype), true);
  const Array G = rnd({s.B, s.H_q, s.T, s.d_v}, g).astype(dtype);
  Generator drop(31);
  SdpaOptions o;
  o.impl = SdpaImpl::fused;
  o.dropout_p = dropout;
  o.training = dropout > 0;
  o.generator = &drop;
  const SdpaResult r = scaled_dot_product_attention(Q, K, V, s.vis, o);
  const auto grads = grad(r.output, {Q, K, V}, G);
  return {r.output.value(), grads[0], grads[1], grads[2]};
}

// ||a - ref|| / ||ref|| (a float32, ref float64).
double rel_error(const Array& a, const Array& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double d = a.flat(i) - ref.flat(i);
    num += d * d;
    den += ref.flat(i) * ref.flat(i);
  }
  return std::sqrt(num / den);
}

std::vector<Shape4> shapes() {
  std::vector<Shape4> v;
  v.push_back({"causal, 3 blocks, GQA, d 32", 1, 4, 2, 300, 32, 32, Visibility::causal(300, 300)});
  v.push_back({"no mask, d_k 64 d_v 32", 2, 2, 2, 150, 64, 32, Visibility::all()});
  // documents from keys 41 and 157: blocks whose key ranges start at odd keys, tiles whose
  // first rows are odd
  IndexArray docs({1, 260}, std::vector<std::int64_t>(260));
  for (std::size_t i = 0; i < 260; ++i) docs.data[i] = i < 41 ? 0 : (i < 157 ? 1 : 2);
  v.push_back({"documents at odd keys, d 32", 1, 2, 1, 260, 32, 32, Visibility::documents(docs)});
  v.push_back({"sliding window 45, d 64", 1, 2, 2, 200, 64, 64,
               Visibility::sliding_window(200, 200, 45)});
  return v;
}

std::string forced() { return blas::forced_kernel("XGRAD_BF16_ATTENTION", "bf16_attention").value; }

}  // namespace

TEST_CASE("bfloat16 attention: the choice follows XGRAD_BF16_ATTENTION and what this CPU has", "[attention_bf16]") {
  const tile::Bf16Choice& c = tile::bf16_choice();
  const bool amx = blas::amx::available(), dot = blas::amx::dot_available();
  INFO("choice: " << bfloat16_attention_kernels() << "; AMX: "
                  << (amx ? std::string("available") : blas::amx::unavailable_reason())
                  << "; AVX512_BF16 dot products: " << (dot ? std::string("available") : blas::amx::dot_unavailable_reason()));
  const std::string f = forced();
  if (f == "off") {
    CHECK_FALSE(c.use());
    CHECK(c.why == blas::forced_kernel("XGRAD_BF16_ATTENTION", "bf16_attention").setting());
  } else if (f == "amx") {
    CHECK(c.engine == (amx ? tile::Bf16Engine::amx : tile::Bf16Engine::none));
    if (!amx) CHECK(c.why.find("no AMX bfloat16 tiles") == 0);
  } else if (f == "dpbf16") {
    CHECK(c.engine == (dot ? tile::Bf16Engine::dpbf16 : tile::Bf16Engine::none));
    if (!dot) CHECK(c.why.find("no AVX512_BF16 dot products") == 0);
  } else if (!dot) {  // (AMX implies the dot products)
    CHECK_FALSE(c.use());
    CHECK(c.why.find("no bfloat16 tile products") == 0);
  } else if (f == "on") {
    CHECK(c.engine == (amx ? tile::Bf16Engine::amx : tile::Bf16Engine::dpbf16));
  } else {  // auto: measured, on the first engine the CPU has
    CHECK(c.why.find(amx ? "AMX tile products measured at" : "AVX512_BF16 dot products measured at") == 0);
    if (c.use()) CHECK(c.engine == (amx ? tile::Bf16Engine::amx : tile::Bf16Engine::dpbf16));
    // The ratio the choice used (this process's, measured or read from the calibration cache;
    // a second measurement is never taken: the stand-in below would give 0).
    const double r = detail::calibrated(amx ? "attention_tiles_amx" : "attention_tiles_dpbf16", [] { return 0.0; }).value;
    INFO("calibrated ratio " << r);
    CHECK(c.use() == (r >= tile::kMinBf16Speedup));
  }
  const char* const want = !c.use() ? "float32 (" :
                           c.engine == tile::Bf16Engine::amx ? "AMX bfloat16 tiles (" : "AVX512_BF16 dot products (";
  CHECK(bfloat16_attention_kernels().find(want) == 0);
}

TEST_CASE("bfloat16 attention: within bfloat16 rounding of float64 and the products counted", "[attention_bf16]") {
  bool bf16_products = false;  // the CPU runs bfloat16 products at all (else --dtype bfloat16 is float32)
  {
    const MatmulDtypeScope scope(MatmulDtype::bfloat16);
    bf16_products = effective_matmul_dtype() == MatmulDtype::bfloat16;
  }
  const bool ran = tile::bf16_choice().use() && bf16_products;
  std::vector<std::pair<Shape4, double>> runs;  // (shape, dropout)
  for (const Shape4& s : shapes()) runs.emplace_back(s, 0.0);
  runs.emplace_back(shapes()[0], 0.25);  // the backward's dropout branch
  for (const auto& [s, dropout] : runs) {
    INFO(s.name << ", dropout " << dropout << "; " << bfloat16_attention_kernels() << "; bfloat16 products "
                << bfloat16_gemm_kernels());
    const Outputs ref = fused(s, DType::float64, MatmulDtype::float32, dropout);
    const Outputs f32 = fused(s, DType::float32, MatmulDtype::float32, dropout);
    const std::uint64_t before = blas::amx::calls();
    const Outputs b16 = fused(s, DType::float32, MatmulDtype::bfloat16, dropout);
    const std::uint64_t products = blas::amx::calls() - before;
    if (!ran) {  // float32 products: float32's bits
      CHECK(products == 0);
      CHECK(differing_bits(b16.O, f32.O) == 0);
      CHECK(differing_bits(b16.dQ, f32.dQ) == 0);
      CHECK(differing_bits(b16.dK, f32.dK) == 0);
      CHECK(differing_bits(b16.dV, f32.dV) == 0);
      continue;
    }
    CHECK(products > 0);
    // Each product's inputs carry a relative rounding error of at most u = 2^-8; the scores
    // (inputs in [-1, 1], |scale q.k| up to sqrt(d)) pass theirs through e^x, and the weights
    // and dU are rounded again before their products: about u in norm (0.2-0.35% measured on
    // these shapes). Bound: 2u = 0.78%.
    // float32 products stay near 1e-6, so the bound also says the products were rounded.
    const double bound = 2.0 / 256;
    const Array* got[] = {&b16.O, &b16.dQ, &b16.dK, &b16.dV};
    const Array* want[] = {&ref.O, &ref.dQ, &ref.dK, &ref.dV};
    const Array* single[] = {&f32.O, &f32.dQ, &f32.dK, &f32.dV};
    const char* names[] = {"O", "dQ", "dK", "dV"};
    for (int t = 0; t < 4; ++t) {
      const double e = rel_error(*got[t], *want[t]), e32 = rel_error(*single[t], *want[t]);
      INFO(names[t] << ": relative error " << std::setprecision(6) << e << " (float32 products " << e32 << ")");
      CHECK(e <= bound);
      CHECK(e > 20 * e32);
    }
  }
}

// With at least as many (batch, kv head) groups as threads each group's dK and dV are summed by
// one thread in one order (with fewer, per-thread parts are added: float32 differs there too).
TEST_CASE("bfloat16 attention: the bits do not depend on the thread count", "[attention_bf16]") {
  Shape4 s = shapes()[2];  // odd starts: every path of the products
  s.H_kv = s.H_q = 2;
  Outputs one, two;
  {
    const ThreadCount restore;
    set_num_threads(1);
    one = fused(s, DType::float32, MatmulDtype::bfloat16);
    set_num_threads(2);
    two = fused(s, DType::float32, MatmulDtype::bfloat16);
  }
  INFO(bfloat16_attention_kernels());
  CHECK(differing_bits(one.O, two.O) == 0);
  CHECK(differing_bits(one.dQ, two.dQ) == 0);
  CHECK(differing_bits(one.dK, two.dK) == 0);
  CHECK(differing_bits(one.dV, two.dV) == 0);
}

// The exact path of the tiles that rows see in part (nn/detail/flash_attention.hpp,
// PartialTilePath) with the bfloat16 products: the scores' pass fused, the weights of the
// backward pass from one rounding and e^x per chunk of rows up to its rows' parts. The same bits
// as the general path (set_exact_parts(false)), on the causal, documents and window shapes; the
// counters show both paths ran. Where the choice keeps float32, this is the float32 tile path.
TEST_CASE("bfloat16 attention: partial tiles give the same bits on the exact and the general path",
          "[attention_bf16]") {
  struct Restore {
    ~Restore() { set_exact_parts(true); }
  } restore;
  const auto exact = [] { return partial_tile_calls(PartialTilePath::exact_parts); };
  const auto general = [] { return partial_tile_calls(PartialTilePath::general); };
  for (const Shape4& s : shapes()) {
    if (s.name.rfind("no mask", 0) == 0) continue;  // no partial tiles
    INFO(s.name << "; " << bfloat16_attention_kernels());
    set_exact_parts(false);
    const std::uint64_t e0 = exact(), g0 = general();
    const Outputs a = fused(s, DType::float32, MatmulDtype::bfloat16);
    const std::uint64_t e1 = exact(), g1 = general();
    set_exact_parts(true);
    const Outputs b = fused(s, DType::float32, MatmulDtype::bfloat16);
    CHECK(e1 == e0);
    CHECK(g1 > g0);
    CHECK(exact() > e1);
    CHECK(differing_bits(b.O, a.O) == 0);
    CHECK(differing_bits(b.dQ, a.dQ) == 0);
    CHECK(differing_bits(b.dK, a.dK) == 0);
    CHECK(differing_bits(b.dV, a.dV) == 0);
  }
}

TEST_CASE("bfloat16 attention: a score that overflows is the error float32 gives (Algorithm 5.1 step 3)",
          "[attention_bf16]") {
  // One query and one key carry 1e20 in feature 0: their score overflows to +inf in either
  // precision (bfloat16 keeps float32's exponent range); every other input is moderate.
  Generator g(77);
  Array q = rnd({1, 2, 70, 32}, g, -1, 1), k = rnd({1, 2, 70, 32}, g, -1, 1);
  q.set_flat(40 * 32, 1e20);
  k.set_flat(33 * 32, 1e20);
  const Tensor Q(q.astype(DType::float32)), K(k.astype(DType::float32)),
      V(rnd({1, 2, 70, 32}, g, -1, 1).astype(DType::float32));
  SdpaOptions o;
  o.impl = SdpaImpl::fused;
  for (const MatmulDtype mode : {MatmulDtype::float32, MatmulDtype::bfloat16}) {
    INFO(matmul_dtype_name(mode) << "; " << bfloat16_attention_kernels());
    const MatmulDtypeScope scope(mode);
    CHECK_THROWS_WITH(scaled_dot_product_attention(Q, K, V, Visibility::causal(70, 70), o),
                      Catch::Contains("batch 0, head 0, query 40, key 33") && Catch::Contains("step 3"));
  }
}
