// The float32 GEMM paths of the BLAS doorway (core/detail/blas.hpp): each backend this
// build has (OpenBLAS, oneDNN) against the float64 path (OpenBLAS dgemm) on odd shapes,
// transposed operands, padded leading dimensions, alpha and beta, and which kernels and ISA
// ran. ctest runs these tests twice: as built (the CPU's widest ISA) and with XGRAD_ISA=avx2
// (tests/CMakeLists.txt: gemm_paths_avx2), so both oneDNN ISA paths run on an AVX-512 machine.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;

namespace {

std::vector<blas::Backend> backends() {
  std::vector<blas::Backend> out{blas::Backend::openblas};
  if (blas::onednn_available()) out.push_back(blas::Backend::onednn);
  return out;
}

// The ISA the float32 kernels must use here: the CPU's widest, lowered by XGRAD_ISA=avx2.
std::string expected_isa() {
  if (!blas::onednn_available() || blas::cpu_isa() == "none") return "openblas";
  const char* env = std::getenv("XGRAD_ISA");
  if (env && std::string(env) == "avx2") return "avx2";
  return blas::cpu_isa();
}

struct Case {
  std::size_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  std::size_t pad;  // added to each leading dimension
};

// C = alpha op(A) op(B) + beta C through backend `be` in float32 and through the float64 GEMM
// on the same values; every entry within the float32 rounding bound of a K-term dot product,
// and the padding columns of C (ldc > N) untouched. beta 0: C starts as NaN, which must not be
// read (BLAS semantics).
void check_case(blas::Backend be, const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const std::size_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const std::size_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  std::vector<float> A(a_rows * lda), B(b_rows * ldb), C(c.M * ldc);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  const float sentinel = 12345.0f;
  for (std::size_t i = 0; i < c.M; ++i)
    for (std::size_t j = 0; j < ldc; ++j)
      C[i * ldc + j] = j >= c.N ? sentinel : c.beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  const std::vector<double> A64(A.begin(), A.end()), B64(B.begin(), B.end());
  std::vector<double> C64(C.begin(), C.end()), absA(A64.size()), absB(B64.size());
  for (std::size_t i = 0; i < A64.size(); ++i) absA[i] = std::fabs(A64[i]);
  for (std::size_t i = 0; i < B64.size(); ++i) absB[i] = std::fabs(B64[i]);
  std::vector<double> absAB(c.M * ldc, 0.0);
  const double beta64 = c.beta;
  blas::gemm(c.ta, c.tb, c.M, c.N, c.K, double(c.alpha), A64.data(), lda, B64.data(), ldb, beta64, C64.data(), ldc);
  blas::gemm(c.ta, c.tb, c.M, c.N, c.K, 1.0, absA.data(), lda, absB.data(), ldb, 0.0, absAB.data(), ldc);
  const std::vector<float> C0(C);
  blas::sgemm_on(be, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  // Rounding of a K-term float32 dot product (any summation order), of alpha, beta and the sum.
  const double eps = std::numeric_limits<float>::epsilon();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < c.M; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= c.N) {
        bad += got != sentinel;
        continue;
      }
      const double c0 = c.beta == 0.0f ? 0.0 : std::fabs(double(C0[i * ldc + j]));
      const double tol = double(c.K + 3) * eps * (std::fabs(c.alpha) * absAB[i * ldc + j] + std::fabs(c.beta) * c0) +
                         std::numeric_limits<float>::min();
      const bool ok = std::isfinite(got) && std::fabs(double(got) - C64[i * ldc + j]) <= tol;
      if (!ok && bad < 3)
        UNSCOPED_INFO("C[" << i << ", " << j << "] = " << got << ", float64 " << C64[i * ldc + j] << ", bound " << tol);
      bad += !ok;
    }
  INFO(blas::backend_name(be) << " (" << blas::sgemm_isa() << "): M " << c.M << ", N " << c.N << ", K " << c.K
                              << ", trans_a " << c.ta << ", trans_b " << c.tb << ", alpha " << c.alpha << ", beta "
                              << c.beta << ", pad " << c.pad);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("float32 GEMM kernels use the CPU's widest ISA unless XGRAD_ISA lowers the ceiling", "[gemm_paths]") {
  const std::string want = expected_isa();
  CHECK(blas::sgemm_isa() == want);
  if (want == "openblas") {
    CHECK(blas::sgemm_backend() == blas::Backend::openblas);
    CHECK(float32_gemm_kernels() == "OpenBLAS");
  } else {
    CHECK(blas::sgemm_backend() == blas::Backend::onednn);
    CHECK(float32_gemm_kernels() == "oneDNN " + want);
  }
  // The oneDNN path runs when asked for (its call counter moves); float64 never counts.
  std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
  for (blas::Backend be : backends()) {
    const std::uint64_t before = blas::sgemm_calls(be);
    blas::sgemm_on(be, false, false, 64, 64, 64, 1.0f, a.data(), 64, a.data(), 64, 0.0f, c.data(), 64);
    CHECK(blas::sgemm_calls(be) > before);
    CHECK(c[0] == 64.0f);
  }
  const std::uint64_t f32_before = blas::sgemm_calls(blas::Backend::openblas) + blas::sgemm_calls(blas::Backend::onednn);
  std::vector<double> a64(64 * 64, 1.0), c64(64 * 64);
  blas::gemm(false, false, 64, 64, 64, 1.0, a64.data(), 64, a64.data(), 64, 0.0, c64.data(), 64);
  CHECK(blas::sgemm_calls(blas::Backend::openblas) + blas::sgemm_calls(blas::Backend::onednn) == f32_before);
  CHECK(c64[0] == 64.0);
}

TEST_CASE("set_max_isa refuses an unknown ISA and a different ceiling once the kernels are fixed", "[gemm_paths]") {
  CHECK_THROWS_AS(set_max_isa("sse2"), ValueError);
  CHECK_THROWS_WITH(set_max_isa("avx1024"), Catch::Contains("unknown ISA 'avx1024' (avx2 or avx512)"));
  const std::string now = blas::sgemm_isa();  // fixes the kernels
  if (now == "avx512") {
    CHECK_THROWS_WITH(set_max_isa("avx2"), Catch::Contains("already fixed at avx512"));
    CHECK_NOTHROW(set_max_isa("avx512"));
  } else if (now == "avx2") {
    CHECK_NOTHROW(set_max_isa("avx2"));
    if (blas::cpu_isa() == "avx512") CHECK_THROWS_WITH(set_max_isa("avx512"), Catch::Contains("already fixed at avx2"));
  }
  CHECK(blas::sgemm_isa() == now);
}

TEST_CASE("float32 GEMM on each backend matches float64 on odd shapes transposes strides alpha and beta",
          "[gemm_paths]") {
  std::mt19937 rng(21);
  const std::size_t dims[] = {1, 7, 13, 127, 129};
  for (blas::Backend be : backends())
    for (std::size_t M : dims)
      for (std::size_t N : dims)
        for (std::size_t K : dims)
          for (int t = 0; t < 4; ++t) {
            const bool ta = t & 1, tb = t & 2;
            const bool scaled = (M + N + K + t) % 2 == 1;
            check_case(be, {M, N, K, ta, tb, scaled ? -0.5f : 1.0f, scaled ? 1.5f : 0.0f, (M * 7 + K) % 3}, rng);
          }
}

TEST_CASE("float32 GEMM on each backend matches float64 with a dimension of 1023", "[gemm_paths]") {
  std::mt19937 rng(1023);
  const Case cases[] = {{1023, 129, 127, false, false, 1.0f, 0.0f, 0}, {127, 1023, 129, false, true, 1.0f, 0.0f, 1},
                        {129, 127, 1023, true, false, 2.0f, 0.5f, 3},  {1023, 13, 1023, true, true, 1.0f, 0.0f, 5},
                        {1023, 1023, 7, false, false, 1.0f, 1.0f, 0},  {1, 1023, 1023, false, false, 1.0f, 0.0f, 2},
                        {1023, 1, 129, false, true, 1.0f, 0.0f, 0}};
  for (blas::Backend be : backends())
    for (const Case& c : cases) check_case(be, c, rng);
}

TEST_CASE("float32 GEMM with an empty dimension sets C to beta C on each backend", "[gemm_paths]") {
  for (blas::Backend be : backends()) {
    std::vector<float> a(16, 1.0f), c(16, 2.0f);
    blas::sgemm_on(be, false, false, 4, 4, 0, 1.0f, a.data(), 1, a.data(), 4, 0.5f, c.data(), 4);
    for (float v : c) CHECK(v == 1.0f);
    blas::sgemm_on(be, false, false, 0, 4, 4, 1.0f, a.data(), 4, a.data(), 4, 0.5f, c.data(), 4);
    for (float v : c) CHECK(v == 1.0f);
  }
}

// A product whose C is small beside K (K >= 4 max(M, N), a weight gradient over a batch of rows)
// splits K across the pool, the partial products added in chunk order (core/blas.cpp, split_k):
// within the float32 bound on each backend, at 2 threads with the split counted and at 1 thread
// without it, and bit-identical run to run at 2 threads.
namespace {
// C += A^T B (A [K, M], B [K, N], C 0.25 everywhere) twice on `be`: the same bits both times.
void same_bits_run_to_run(blas::Backend be, std::size_t M, std::size_t N, std::size_t K, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> A(K * M), B(K * N), C1(M * N, 0.25f), C2(M * N, 0.25f);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  blas::sgemm_on(be, true, false, M, N, K, 1.0f, A.data(), M, B.data(), N, 1.0f, C1.data(), N);
  blas::sgemm_on(be, true, false, M, N, K, 1.0f, A.data(), M, B.data(), N, 1.0f, C2.data(), N);
  INFO("backend " << blas::backend_name(be) << ", M " << M << ", N " << N << ", K " << K);
  CHECK(std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)) == 0);
}
}  // namespace

// A weight gradient whose C is at least twice as tall as wide over a long K (op(A) = A^T, K from
// 2 M, under the split-K rule's 4 M, from 1M flops) runs on oneDNN's AVX-512 kernels as its
// transpose C^T = B^T A, transposed into C afterwards (core/blas.cpp, transposed_product):
// within the float32 bound with alpha, beta (beta 0: C's NaN never read) and padded leading
// dimensions, counted there and only there (not on OpenBLAS, not under XGRAD_ISA=avx2, not for a
// C under twice as tall, a transposed B or a product under 1M flops), at 2 and 1 threads, and
// bit-identical run to run.
TEST_CASE("float32 weight gradients with a tall C run as their transpose on oneDNN AVX-512 within rounding",
          "[gemm_paths]") {
  const xgt::ThreadCount restore;
  std::mt19937 rng(2048);
  struct Expect {
    Case c;
    bool transposed;  // where oneDNN runs its AVX-512 kernels
  };
  const Expect cases[] = {{{128, 32, 300, true, false, 1.0f, 0.0f, 0}, true},
                          {{130, 40, 400, true, false, -0.5f, 1.5f, 3}, true},
                          {{129, 64, 258, true, false, 2.0f, 1.0f, 1}, true},
                          {{128, 65, 300, true, false, 1.0f, 0.0f, 0}, false},   // C under twice as tall
                          {{128, 32, 300, true, true, 1.0f, 0.0f, 0}, false},    // B transposed
                          {{128, 32, 300, false, false, 1.0f, 0.0f, 0}, false},  // A not transposed
                          {{64, 16, 160, true, false, 1.0f, 0.0f, 0}, false}};   // 327,680 flops
  const bool avx512 = expected_isa() == "avx512";
  for (const int threads : {2, 1}) {
    xg::set_num_threads(threads);
    for (blas::Backend be : backends())
      for (const Expect& e : cases) {
        INFO(threads << " threads, backend " << blas::backend_name(be) << ", M " << e.c.M << ", N " << e.c.N << ", K "
                     << e.c.K << ", ta " << e.c.ta << ", tb " << e.c.tb);
        const std::uint64_t before = blas::transposed_calls();
        check_case(be, e.c, rng);
        const bool expected = e.transposed && avx512 && be == blas::Backend::onednn;
        CHECK(blas::transposed_calls() - before == (expected ? 1u : 0u));
      }
  }
  xg::set_num_threads(2);
  for (blas::Backend be : backends()) same_bits_run_to_run(be, 256, 64, 600, rng);
}

TEST_CASE("float32 GEMM with a long K beside a small C splits K over the pool and stays within rounding",
          "[gemm_paths]") {
  const xgt::ThreadCount restore;
  std::mt19937 rng(4096);
  const Case cases[] = {{64, 256, 1024, true, false, 1.0f, 0.0f, 0},  {65, 64, 1024, true, false, -0.5f, 1.5f, 3},
                        {64, 64, 4099, false, true, 1.0f, 0.0f, 1},   {33, 17, 2777, true, true, 2.0f, 0.5f, 2},
                        {256, 64, 1024, false, false, 1.0f, 1.0f, 0}};
  for (const int threads : {2, 1}) {
    xg::set_num_threads(threads);
    for (blas::Backend be : backends())
      for (const Case& c : cases) {
        INFO(threads << " threads, M " << c.M << ", N " << c.N << ", K " << c.K);
        const std::uint64_t split0 = blas::k_split_calls();
        check_case(be, c, rng);
        CHECK(blas::k_split_calls() - split0 == (threads > 1 ? 1u : 0u));
      }
  }
  xg::set_num_threads(2);
  for (blas::Backend be : backends()) same_bits_run_to_run(be, 64, 256, 1024, rng);
}
