// The float32 matrix-vector products of the BLAS doorway (core/detail/blas.hpp): xgrad's own
// kernel (core/detail/sgemv.hpp: AVX-512, AVX2 + FMA and scalar builds) and the old path
// (OpenBLAS's sgemv), each against a float64 reference on odd shapes, both forms (W [K, N] read
// by rows, W [N, K] by dot products), both kinds of product (one row, one column of C), padded
// leading dimensions, strided x, alpha and beta; the own kernel's bits against the fma chains it
// documents (worked out here with std::fma), equal across its ISAs and thread counts; the kernel
// chosen and that it ran; row_products against one gemm per weight.
// ctest runs the [gemv_f32] tests as built and with each path forced (tests/CMakeLists.txt:
// gemv_f32_openblas, gemv_f32_xgrad, gemv_f32_xgrad_avx2).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;
using blas::GemvKernel;

namespace {

std::vector<GemvKernel> available_kernels() {
  std::vector<GemvKernel> out;
  for (GemvKernel k : {GemvKernel::openblas, GemvKernel::xgrad_scalar, GemvKernel::xgrad_avx2, GemvKernel::xgrad_avx512})
    if (blas::gemv_kernel_available(k)) out.push_back(k);
  return out;
}

// The kernel the rule of core/detail/blas.hpp picks here, by this test's own copy of the rule.
GemvKernel expected_kernel() {
  const std::string ceiling = blas::isa_ceiling();
  const GemvKernel own = ceiling == "avx512" ? GemvKernel::xgrad_avx512
                         : ceiling == "avx2" ? GemvKernel::xgrad_avx2
                                             : GemvKernel::xgrad_scalar;
  const std::string force = blas::forced_kernel("XGRAD_FLOAT32_GEMV", "float32_gemv").value;
  if (force == "openblas") return GemvKernel::openblas;
  if (force == "xgrad") return own;
  if (ceiling == "none") return GemvKernel::openblas;
  std::string core = blas::openblas_corename();
  for (char& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // OpenBLAS's AVX2 cores keep its sgemv on an AVX-512 CPU (AMD Zen 5 with
  // OPENBLAS_CORETYPE=Haswell); everywhere else xgrad's kernel runs (streamed on AVX2 CPUs).
  for (const char* v : {"haswell", "zen"})
    if (core == v && ceiling == "avx512") return GemvKernel::openblas;
  return own;
}

struct Case {
  std::size_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  std::size_t pad;  // added to each leading dimension
};

struct Operands {
  std::size_t lda, ldb, ldc;
  std::vector<float> A, B, C;
};

Operands make(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Operands o;
  const std::size_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const std::size_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  o.lda = a_cols + c.pad;
  o.ldb = b_cols + c.pad;
  o.ldc = c.N + c.pad;
  o.A.resize(a_rows * o.lda);
  o.B.resize(b_rows * o.ldb);
  o.C.resize(c.M * o.ldc);
  for (float& v : o.A) v = dist(rng);
  for (float& v : o.B) v = dist(rng);
  for (std::size_t i = 0; i < c.M; ++i)
    for (std::size_t j = 0; j < o.ldc; ++j)
      o.C[i * o.ldc + j] =
          j >= c.N ? 12345.0f : c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  return o;
}

float a_at(const Case& c, const Operands& o, std::size_t i, std::size_t k) {
  return c.ta ? o.A[k * o.lda + i] : o.A[i * o.lda + k];
}
float b_at(const Case& c, const Operands& o, std::size_t k, std::size_t j) {
  return c.tb ? o.B[j * o.ldb + k] : o.B[k * o.ldb + j];
}

// The own kernel's bits by the order core/detail/sgemv.hpp documents: the matrix's operand read
// by rows (two halves of K, each a plain fma chain) or by dot products (16 partial chains, then
// the tree).
float documented(const Case& c, const Operands& o, std::size_t i, std::size_t j) {
  const bool one_row = c.M == 1;
  const bool by_rows = one_row ? !c.tb : c.ta;
  const auto x = [&](std::size_t k) { return one_row ? a_at(c, o, 0, k) : b_at(c, o, k, 0); };
  const auto w = [&](std::size_t k) { return one_row ? b_at(c, o, k, j) : a_at(c, o, i, k); };
  float s = 0.0f;
  if (by_rows) {  // two halves of K, h = floor(K / 2), each a chain from +0, then added
    float lo = 0.0f, hi = 0.0f;
    for (std::size_t k = 0; k < c.K / 2; ++k) lo = std::fma(x(k), w(k), lo);
    for (std::size_t k = c.K / 2; k < c.K; ++k) hi = std::fma(x(k), w(k), hi);
    s = lo + hi;
  } else {
    float p[16] = {};
    for (std::size_t g = 0; g < (c.K + 15) / 16; ++g)
      for (std::size_t l = 0; l < 16; ++l) {
        const std::size_t k = 16 * g + l;
        p[l] = k < c.K ? std::fma(w(k), x(k), p[l]) : std::fma(0.0f, 0.0f, p[l]);
      }
    for (std::size_t h = 8; h >= 1; h /= 2)
      for (std::size_t l = 0; l < h; ++l) p[l] = p[l] + p[l + h];
    s = p[0];
  }
  return s;
}

// Runs case `c` on kernel `k`; every entry within the float32 rounding bound of a K-term dot
// product of the float64 reference, the padding of C untouched, beta 0 never reading C (NaN).
// Returns C.
std::vector<float> check_case(GemvKernel k, const Case& c, std::mt19937& rng) {
  Operands o = make(c, rng);
  const std::vector<float> C0 = o.C;
  const std::uint64_t before = blas::sgemv_calls(k);
  blas::sgemv_on(k, c.ta, c.tb, c.M, c.N, c.K, c.alpha, o.A.data(), o.lda, o.B.data(), o.ldb, c.beta, o.C.data(),
                 o.ldc);
  CHECK(blas::sgemv_calls(k) == before + 1);
  const double eps = std::numeric_limits<float>::epsilon();
  std::size_t bad = 0, bits_off = 0;
  for (std::size_t i = 0; i < c.M; ++i)
    for (std::size_t j = 0; j < o.ldc; ++j) {
      const float got = o.C[i * o.ldc + j];
      if (j >= c.N) {
        bad += got != 12345.0f;
        continue;
      }
      double exact = 0, mag = 0;
      for (std::size_t kk = 0; kk < c.K; ++kk) {
        const double t = double(a_at(c, o, i, kk)) * double(b_at(c, o, kk, j));
        exact += t;
        mag += std::fabs(t);
      }
      const double c0 = c.beta == 0.0f ? 0.0 : double(C0[i * o.ldc + j]);
      const double want = double(c.alpha) * exact + double(c.beta) * c0;
      const double tol = double(c.K + 3) * eps * (std::fabs(c.alpha) * mag + std::fabs(c.beta) * std::fabs(c0)) +
                         std::numeric_limits<float>::min();
      const bool ok = std::isfinite(got) && std::fabs(double(got) - want) <= tol;
      if (!ok && bad < 3)
        UNSCOPED_INFO("C[" << i << ", " << j << "] = " << std::setprecision(9) << got << ", float64 " << want
                           << ", bound " << tol);
      bad += !ok;
      if (k != GemvKernel::openblas) {  // the documented chains, bit for bit
        const float s = documented(c, o, i, j);
        const float y = c.beta == 0.0f ? c.alpha * s : std::fma(c.beta, C0[i * o.ldc + j], c.alpha * s);
        if (std::memcmp(&y, &got, sizeof y) != 0) {
          if (bits_off < 3)
            UNSCOPED_INFO("C[" << i << ", " << j << "] = " << std::setprecision(9) << got << ", documented order "
                               << y);
          ++bits_off;
        }
      }
    }
  INFO(blas::gemv_kernel_name(k) << ": M " << c.M << ", N " << c.N << ", K " << c.K << ", trans_a " << c.ta
                                 << ", trans_b " << c.tb << ", alpha " << c.alpha << ", beta " << c.beta << ", pad "
                                 << c.pad);
  CHECK(bad == 0);
  CHECK(bits_off == 0);
  return o.C;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // K around the 16-lane steps, N around the panels (16 x 8 and 8 x 8 columns) and the split
  // blocks of 16; both kinds (one row, one column), both layouts, strided x (ta for one row,
  // !tb for one column), padding, alpha and beta.
  for (std::size_t K : {1, 7, 16, 17, 288})
    for (std::size_t n : {2, 15, 17, 129, 300})
      for (bool t : {false, true}) {
        out.push_back({1, n, K, t, false, 1.0f, 0.0f, 0});
        out.push_back({1, n, K, false, t, 1.0f, 0.0f, 3});
        out.push_back({n, 1, K, t, !t, -0.5f, 0.25f, 1});
      }
  out.push_back({1, 768, 288, false, false, 1.0f, 0.0f, 0});   // a stories15M gate
  out.push_back({1, 4000, 288, false, true, 1.0f, 0.0f, 0});   // a tied classifier's slice
  out.push_back({1, 1000, 700, false, false, 2.0f, -1.0f, 5}); // large enough to split
  return out;
}

}  // namespace

TEST_CASE("float32 matrix-vector kernel: chosen by the rule and run for one-row products", "[gemv_f32]") {
  const GemvKernel want = expected_kernel();
  INFO("chosen " << blas::gemv_kernel_name(blas::sgemv_kernel()) << " (" << blas::sgemv_reason() << "), OpenBLAS core "
                 << blas::openblas_corename() << ", ISA ceiling " << blas::isa_ceiling());
  CHECK(blas::sgemv_kernel() == want);
  // gemm(float) with one row of C goes to the chosen kernel (its counter moves).
  std::vector<float> x(32, 1.0f), W(32 * 40, 0.5f), y(40);
  const std::uint64_t before = blas::sgemv_calls(want);
  blas::gemm(false, false, 1, 40, 32, 1.0f, x.data(), 32, W.data(), 40, 0.0f, y.data(), 40);
  CHECK(blas::sgemv_calls(want) == before + 1);
  CHECK(y[0] == 16.0f);
  CHECK(y[39] == 16.0f);
}

TEST_CASE("float32 matrix-vector kernels: each against float64 and the documented order", "[gemv_f32]") {
  for (GemvKernel k : available_kernels()) {
    std::mt19937 rng(7);
    for (const Case& c : cases()) check_case(k, c, rng);
  }
}

TEST_CASE("float32 matrix-vector kernel: the same bits on every ISA and thread count", "[gemv_f32]") {
  const xgt::ThreadCount keep;
  std::vector<GemvKernel> own;
  for (GemvKernel k : available_kernels())
    if (k != GemvKernel::openblas) own.push_back(k);
  REQUIRE(!own.empty());  // the scalar build is always there
  for (const Case& c : cases()) {
    std::vector<float> first;
    for (GemvKernel k : own)
      for (int t : {1, 2, 3, 4}) {
        set_num_threads(t);
        std::mt19937 rng(11);  // the same operands each time
        const std::uint64_t halves0 = blas::gemv_rows_halves_calls();
        const std::vector<float> C = check_case(k, c, rng);
        // Rows-form products from 64K flops on two or more threads ran as two halves of K.
        const bool rows_form = c.M == 1 ? !c.tb : c.ta;
        const bool split = 2.0 * double(c.M * c.N) * double(c.K) >= 65536.0 && t >= 2;
        INFO(blas::gemv_kernel_name(k) << ", " << t << " threads, rows form " << rows_form << ": M " << c.M << ", N "
                                       << c.N << ", K " << c.K);
        CHECK(blas::gemv_rows_halves_calls() - halves0 == (rows_form && split ? 1u : 0u));
        if (first.empty()) {
          first = C;
          continue;
        }
        INFO(blas::gemv_kernel_name(k) << ", " << t << " threads: M " << c.M << ", N " << c.N << ", K " << c.K);
        CHECK(std::memcmp(first.data(), C.data(), C.size() * sizeof(float)) == 0);
      }
  }
}

TEST_CASE("row_products: bit for bit one gemm per weight with x shared", "[gemv_f32]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t K = 288, N1 = 768, N2 = 130;
  std::vector<float> x(K), W1(K * N1), W2(K * N2), y1(N1, -1.0f), y2(N2, -1.0f), r1(N1), r2(N2);
  for (auto* v : {&x, &W1, &W2})
    for (float& e : *v) e = dist(rng);
  const blas::RowProduct ps[2] = {{W1.data(), N1, y1.data()}, {W2.data(), N2, y2.data()}};
  const std::uint64_t before = blas::row_products_calls();
  blas::row_products(x.data(), K, ps, 2);
  CHECK(blas::row_products_calls() == before + 1);
  blas::gemm(false, false, 1, N1, K, 1.0f, x.data(), K, W1.data(), N1, 0.0f, r1.data(), N1);
  blas::gemm(false, false, 1, N2, K, 1.0f, x.data(), K, W2.data(), N2, 0.0f, r2.data(), N2);
  CHECK(std::memcmp(y1.data(), r1.data(), N1 * sizeof(float)) == 0);
  CHECK(std::memcmp(y2.data(), r2.data(), N2 * sizeof(float)) == 0);
}

TEST_CASE("sgemv_on refuses a product that is not matrix-vector", "[gemv_f32]") {
  std::vector<float> a(16, 1.0f), c(16);
  CHECK_THROWS_AS(blas::sgemv_on(GemvKernel::openblas, false, false, 4, 4, 4, 1.0f, a.data(), 4, a.data(), 4, 0.0f,
                                 c.data(), 4),
                  ValueError);
  CHECK_THROWS_WITH(blas::sgemv_on(blas::sgemv_kernel(), false, false, 1, 4, 0, 1.0f, a.data(), 1, a.data(), 4, 0.0f,
                                   c.data(), 4),
                    Catch::Contains("M 1, N 4, K 0"));
}
