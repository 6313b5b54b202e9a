// The float64 GEMM of the BLAS doorway (core/detail/blas.hpp): xgrad's own kernel (AVX-512 and
// AVX2 builds, core/detail/dgemm.hpp) and OpenBLAS's dgemm, each against a long double
// reference on odd shapes, every transpose combination, padded leading dimensions, alpha and
// beta; the kernel chosen (and the environment variables that force it) and that it ran; the
// own kernel's bits against the summation order it documents, for any thread count and ISA.
// ctest runs the [gemm_f64] tests as built and with each path forced (tests/CMakeLists.txt:
// gemm_f64_openblas, gemm_f64_xgrad, gemm_f64_xgrad_avx2).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/ops/matmul.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;
using blas::F64Kernel;

namespace {

std::vector<F64Kernel> available_kernels() {
  std::vector<F64Kernel> out;
  for (F64Kernel k : {F64Kernel::openblas, F64Kernel::xgrad_avx2, F64Kernel::xgrad_avx512})
    if (blas::f64_kernel_available(k)) out.push_back(k);
  return out;
}

// The kernel the rule of core/detail/blas.hpp picks here, worked out from the environment and
// OpenBLAS's core name by this test's own copy of the rule.
F64Kernel expected_kernel() {
  const std::string ceiling = blas::isa_ceiling();
  const F64Kernel own = ceiling == "avx512" ? F64Kernel::xgrad_avx512 : F64Kernel::xgrad_avx2;
  const std::string force = blas::forced_kernel("XGRAD_FLOAT64_GEMM", "float64_gemm").value;
  if (force == "openblas") return F64Kernel::openblas;
  if (force == "xgrad") return own;
  if (ceiling == "none") return F64Kernel::openblas;
  std::string core = blas::openblas_corename();
  for (char& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ceiling == "avx512" && (core == "haswell" || core == "zen")) return own;  // an AVX2 core on an AVX-512 CPU
  if (ceiling != "avx512" && (core == "haswell" || core == "zen")) return F64Kernel::openblas;
  for (const char* v : {"skylakex", "cooperlake", "sapphirerapids"})  // AVX-512 on both sides: measured
    if (core == v)
      return ceiling != "avx512" ? F64Kernel::openblas
             : blas::f64_calibrated_speedup() >= blas::kF64MinSpeedup ? own
                                                                       : F64Kernel::openblas;
  return own;
}

struct Case {
  std::size_t M, N, K;
  bool ta, tb;
  double alpha, beta;
  std::size_t pad;  // added to each leading dimension
};

// C = alpha op(A) op(B) + beta C on kernel `k` against a long double reference: every entry
// within (K + 3) eps (|alpha| sum |a||b| + |beta c|) (a K-term float64 dot product in any order,
// alpha, beta and the sum), C's padding columns untouched, and beta 0 never reading C (NaN).
void check_case(F64Kernel k, const Case& c, std::mt19937& rng) {
  std::normal_distribution<double> dist(0.0, 1.0);
  const std::size_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const std::size_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const std::size_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  std::vector<double> A(a_rows * lda), B(b_rows * ldb), C(c.M * ldc);
  for (double& v : A) v = dist(rng);
  for (double& v : B) v = dist(rng);
  const double sentinel = 12345.0;
  for (std::size_t i = 0; i < c.M; ++i)
    for (std::size_t j = 0; j < ldc; ++j)
      C[i * ldc + j] = j >= c.N ? sentinel : c.beta == 0.0 ? std::numeric_limits<double>::quiet_NaN() : dist(rng);
  const std::vector<double> C0(C);
  blas::dgemm_on(k, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
  const double eps = std::numeric_limits<double>::epsilon();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < c.M; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const double got = C[i * ldc + j];
      if (j >= c.N) {
        bad += got != sentinel;
        continue;
      }
      long double s = 0, sabs = 0;
      for (std::size_t p = 0; p < c.K; ++p) {
        const long double a = c.ta ? A[p * lda + i] : A[i * lda + p];
        const long double b = c.tb ? B[j * ldb + p] : B[p * ldb + j];
        s += a * b;
        sabs += std::fabs(a * b);
      }
      const long double c0 = c.beta == 0.0 ? 0.0L : static_cast<long double>(C0[i * ldc + j]);
      const long double want = static_cast<long double>(c.alpha) * s + static_cast<long double>(c.beta) * c0;
      const double tol = double(c.K + 3) * eps * double(std::fabs(c.alpha) * sabs + std::fabs(c.beta * c0)) +
                         std::numeric_limits<double>::min();
      const bool ok = std::isfinite(got) && std::fabs(static_cast<long double>(got) - want) <= tol;
      if (!ok && bad < 3) {
        char line[160];
        std::snprintf(line, sizeof line, "C[%zu, %zu] = %.17g, reference %.17Lg, bound %.3e", i, j, got, want, tol);
        UNSCOPED_INFO(line);
      }
      bad += !ok;
    }
  INFO(blas::f64_kernel_name(k) << ": M " << c.M << ", N " << c.N << ", K " << c.K << ", trans_a " << c.ta
                                << ", trans_b " << c.tb << ", alpha " << c.alpha << ", beta " << c.beta << ", pad "
                                << c.pad);
  CHECK(bad == 0);
}

// (alpha, beta, pad) cycled through the shapes.
const struct {
  double alpha, beta;
  std::size_t pad;
} kScales[] = {{1.0, 0.0, 0}, {0.75, -1.5, 3}, {-2.0, 0.0, 5}, {1.0, 1.0, 1}};

}  // namespace

TEST_CASE("float64 GEMM runs the kernel the rule or XGRAD_FLOAT64_GEMM chooses", "[gemm_f64]") {
  const F64Kernel want = expected_kernel();
  INFO("OpenBLAS core " << blas::openblas_corename() << ", ISA ceiling " << blas::isa_ceiling()
                        << ", chosen: " << float64_gemm_kernels());
  CHECK(blas::dgemm_kernel() == want);
  CHECK(float64_gemm_kernels().rfind(std::string(blas::f64_kernel_name(want)) + " (", 0) == 0);
  CHECK(openblas_core() == blas::openblas_corename());
  CHECK(openblas_config().find("OpenBLAS") != std::string::npos);
  // The doorway's float64 gemm and a float64 matmul op both run on it (its counter moves, no
  // other kernel's does).
  std::vector<std::uint64_t> before;
  for (F64Kernel k : {F64Kernel::openblas, F64Kernel::xgrad_avx2, F64Kernel::xgrad_avx512})
    before.push_back(blas::dgemm_calls(k));
  std::vector<double> a(48 * 48, 1.0), c(48 * 48);
  blas::gemm(false, false, 48, 48, 48, 1.0, a.data(), 48, a.data(), 48, 0.0, c.data(), 48);
  CHECK(c[0] == 48.0);
  Generator gen(3);
  const Tensor x = randn({5, 7}, gen, DType::float64), y = randn({7, 3}, gen, DType::float64);
  ops::matmul(x, y);
  int i = 0;
  for (F64Kernel k : {F64Kernel::openblas, F64Kernel::xgrad_avx2, F64Kernel::xgrad_avx512}) {
    INFO(blas::f64_kernel_name(k));
    CHECK(blas::dgemm_calls(k) - before[i++] == (k == want ? 2u : 0u));
  }
}

TEST_CASE("float64 GEMM kernels match a long double reference on odd shapes/transposes/strides/alpha/beta",
          "[gemm_f64]") {
  std::mt19937 rng(7);
  const std::size_t sizes[] = {1, 7, 17, 33, 129};
  for (F64Kernel k : available_kernels()) {
    std::size_t n = 0;
    for (std::size_t M : sizes)
      for (std::size_t N : sizes)
        for (std::size_t K : sizes)
          for (int t = 0; t < 4; ++t) {
            const auto& s = kScales[n++ % 4];
            check_case(k, {M, N, K, (t & 1) != 0, (t & 2) != 0, s.alpha, s.beta, s.pad}, rng);
          }
    // K across the kernel's K blocks (256), and products large enough to split over the pool.
    for (std::size_t K : {255, 257, 300, 600})
      for (int t = 0; t < 4; ++t) {
        const auto& s = kScales[n++ % 4];
        check_case(k, {33, 47, K, (t & 1) != 0, (t & 2) != 0, s.alpha, s.beta, s.pad}, rng);
      }
    check_case(k, {200, 130, 260, false, true, 1.5, 0.5, 2}, rng);
    check_case(k, {9, 300, 129, true, false, -1.0, 0.0, 0}, rng);
  }
}

// On an AVX-512 CPU whose OpenBLAS core has AVX-512 dgemm kernels, the choice is the faster of
// the two, measured; elsewhere the rule needs no measurement.
TEST_CASE("float64 GEMM: the choice between two AVX-512 kernels is measured and says so", "[gemm_f64]") {
  const double measured = blas::f64_measured_speedup();
  if (!blas::f64_kernel_available(F64Kernel::xgrad_avx512)) {
    CHECK(measured == 0.0);  // nothing to measure without AVX-512
    return;
  }
  INFO("OpenBLAS time over xgrad's on a 256 x 256 x 256 product: " << measured);
  CHECK(std::isfinite(measured));
  CHECK(measured > 0.0);
  const double used = blas::f64_calibrated_speedup();
  const std::string reason = blas::dgemm_reason();
  INFO("chosen: " << float64_gemm_kernels() << ", ratio used " << used);
  if (used > 0.0) {  // this CPU and its OpenBLAS core took the measured branch
    CHECK(reason.rfind("xgrad's kernel measured at ", 0) == 0);
    CHECK((blas::dgemm_kernel() == F64Kernel::xgrad_avx512) == (used >= blas::kF64MinSpeedup));
  } else {
    CHECK(reason.find("measured") == std::string::npos);
  }
}

TEST_CASE("float64 GEMM kernels: empty products and K 0", "[gemm_f64]") {
  for (F64Kernel k : available_kernels()) {
    INFO(blas::f64_kernel_name(k));
    std::vector<double> a(16, 1.0), c(16, 2.0);
    blas::dgemm_on(k, false, false, 4, 4, 0, 1.0, a.data(), 1, a.data(), 4, 0.5, c.data(), 4);  // C = 0.5 C
    CHECK(c[0] == 1.0);
    CHECK(c[15] == 1.0);
    std::fill(c.begin(), c.end(), std::numeric_limits<double>::quiet_NaN());
    blas::dgemm_on(k, false, false, 4, 4, 0, 1.0, a.data(), 1, a.data(), 4, 0.0, c.data(), 4);  // C = 0
    CHECK(c[5] == 0.0);
    std::fill(c.begin(), c.end(), 3.0);
    blas::dgemm_on(k, false, false, 0, 4, 4, 1.0, a.data(), 4, a.data(), 4, 0.0, c.data(), 4);
    blas::dgemm_on(k, false, false, 4, 0, 4, 1.0, a.data(), 4, a.data(), 4, 0.0, c.data(), 4);
    CHECK(c[0] == 3.0);
  }
}

// core/detail/dgemm.hpp documents each entry's summation order: for each K block of 256 in
// turn, a fused multiply-add chain from 0 in increasing k; the first block's C = alpha s (+ beta
// C0 by one FMA), later blocks' C = C + alpha s. Computed here entry by entry in scalar code,
// those bits must come out of both ISAs on 1 and 2 threads, with A and B stored either way (the
// packing transposes full 8 x 8 or 4 x 4 blocks in registers, the rest element by element: K 603
// leaves a last K block of 91, M 70 a partial row group). The column panels (24 columns on
// AVX-512, 8 on AVX2) end three ways: N 90 with a partial panel, through the edge tile's buffer;
// N 88 with a panel of 16 on AVX-512 and N 92 with one of 4 on AVX2 (whole vectors, one short of
// a full panel: computed on C itself), on 1 thread and split by columns over 2.
TEST_CASE("the own float64 kernel sums each entry in its documented order whatever the thread count and ISA",
          "[gemm_f64]") {
  for (const std::size_t N : {90, 88, 92}) {
    const std::size_t M = 70, K = 603;  // 7.6 MFLOP: split over the pool on 2 threads
    std::mt19937 rng(11);
    std::normal_distribution<double> dist(0.0, 1.0);
    std::vector<double> A(K * M), B(N * K), C0(M * N);  // A stored [K, M] (trans_a), B [N, K] (trans_b)
    for (double& v : A) v = dist(rng);
    for (double& v : B) v = dist(rng);
    for (double& v : C0) v = dist(rng);
    const double alpha = 0.7, beta = -1.3;
    std::vector<double> want(M * N);
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        double r = 0;
        for (std::size_t k0 = 0; k0 < K; k0 += 256) {
          double s = 0;
          for (std::size_t k = k0; k < std::min(K, k0 + 256); ++k) s = std::fma(A[k * M + i], B[j * K + k], s);
          volatile double as = alpha * s;  // rounded on its own: never fused with what follows
          r = k0 == 0 ? std::fma(beta, C0[i * N + j], as) : r + as;
        }
        want[i * N + j] = r;
      }
    // The same product with op(A) and op(B) stored either way (each packed by its own path).
    std::vector<double> At(M * K), Bt(K * N);  // A as [M, K], B as [K, N]
    for (std::size_t k = 0; k < K; ++k) {
      for (std::size_t i = 0; i < M; ++i) At[i * K + k] = A[k * M + i];
      for (std::size_t j = 0; j < N; ++j) Bt[k * N + j] = B[j * K + k];
    }
    const xgt::ThreadCount restore;
    for (F64Kernel k : {F64Kernel::xgrad_avx2, F64Kernel::xgrad_avx512}) {
      if (!blas::f64_kernel_available(k)) continue;
      for (int threads : {1, 2})
        for (int t = 0; t < 4; ++t) {
          const bool ta = (t & 1) != 0, tb = (t & 2) != 0;
          set_num_threads(threads);
          std::vector<double> C(C0);
          blas::dgemm_on(k, ta, tb, M, N, K, alpha, ta ? A.data() : At.data(), ta ? M : K,
                         tb ? B.data() : Bt.data(), tb ? K : N, beta, C.data(), N);
          std::size_t differ = 0;
          for (std::size_t e = 0; e < C.size(); ++e) {
            if (std::memcmp(&C[e], &want[e], sizeof(double)) != 0 && differ++ < 3) {
              char line[128];
              std::snprintf(line, sizeof line, "entry %zu: %.17g, documented order %.17g", e, C[e], want[e]);
              UNSCOPED_INFO(line);
            }
          }
          INFO(blas::f64_kernel_name(k) << " on " << threads << " threads, trans_a " << ta << ", trans_b " << tb
                                        << ", N " << N);
          CHECK(differ == 0);
        }
    }
  }
}

TEST_CASE("float64 batched matmul through the op matches a long double reference", "[gemm_f64]") {
  Generator gen(5);
  const std::size_t Bn = 3, M = 17, K = 33, N = 9;
  const Tensor a = randn({Bn, M, K}, gen, DType::float64), b = randn({Bn, N, K}, gen, DType::float64);
  const std::uint64_t before = blas::dgemm_calls(blas::dgemm_kernel());
  const Tensor c = ops::matmul(a, b, {false, true});  // [Bn, M, N] = a b^T
  CHECK(blas::dgemm_calls(blas::dgemm_kernel()) > before);
  REQUIRE(c.shape() == Shape{Bn, M, N});
  const double* pa = a.value().data<double>();
  const double* pb = b.value().data<double>();
  const double* pc = c.value().data<double>();
  const double eps = std::numeric_limits<double>::epsilon();
  std::size_t bad = 0;
  for (std::size_t q = 0; q < Bn; ++q)
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        long double s = 0, sabs = 0;
        for (std::size_t p = 0; p < K; ++p) {
          const long double t = static_cast<long double>(pa[(q * M + i) * K + p]) * pb[(q * N + j) * K + p];
          s += t;
          sabs += std::fabs(t);
        }
        const double got = pc[(q * M + i) * N + j];
        const double tol = double(K + 1) * eps * double(sabs);
        if (!(std::fabs(static_cast<long double>(got) - s) <= tol)) {
          if (bad < 3) {
            char line[128];
            std::snprintf(line, sizeof line, "c[%zu, %zu, %zu] = %.17g, reference %.17Lg, bound %.3e", q, i, j, got,
                          s, tol);
            UNSCOPED_INFO(line);
          }
          ++bad;
        }
      }
  CHECK(bad == 0);
}
