// bfloat16 mixed precision for float32 matmuls (core/matmul_dtype.hpp).
// - The kernel (core/detail/bf16_gemm.hpp) against a float64 product of the bfloat16-rounded
//   inputs on odd shapes, transposed operands, padded leading dimensions, alpha and beta: only
//   float32 accumulation error is allowed, so a kernel that did not round its inputs fails.
// - The matmul op with the switch on, forward and backward, against the float64 op, within the
//   bound bfloat16's unit roundoff u = 2^-8 gives: each product of two rounded inputs is off by
//   at most (2u + u^2) |a||b|, plus float32 accumulation, gamma_K = K 2^-24.
// - The switch itself: the scope guard, float64 untouched, and the float32 fallback where the CPU
//   has no AVX512_BF16, the kernels are capped at AVX2 (ctest runs the [gemm_paths] tests
//   again with XGRAD_ISA=avx2: gemm_paths_avx2), or the calibration measured bfloat16 dot
//   products slower than float32 FMAs (ctest runs the [matmul_bf16] tests again with
//   XGRAD_BF16_GEMM=on and =off: matmul_bf16_forced_on, matmul_bf16_forced_off).
#include "tests/support/helpers.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iomanip>
#include <limits>
#include <random>
#include <vector>

#include <xgrad/core/detail/amx_gemm.hpp>
#include <xgrad/core/detail/bf16_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/core/detail/profile.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/nn/detail/flash_tile.hpp>
#include <xgrad/nn/sdpa.hpp>
#include <xgrad/nn/transformer.hpp>

using namespace xg;
using namespace xgt;

namespace {

constexpr double kU = 1.0 / 256;                 // bfloat16 unit roundoff, 2^-8
constexpr double kU32 = 1.0 / (1 << 24);         // float32 unit roundoff, 2^-24

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

bool xisa_avx2() {
  const char* env = std::getenv("XGRAD_ISA");
  return env && std::string(env) == "avx2";
}

std::string bf16_forced() { return blas::forced_kernel("XGRAD_BF16_GEMM", "bf16_gemm").value; }

// C = alpha op(A) op(B) + beta C through `f` (gemm_block or gemm_bf16) against float64 on the
// rounded inputs: each entry within (K + 2) 2^-24 (|alpha| sum |a~||b~| + |beta c|), the
// padding columns of C untouched, beta 0 never reading C (NaN there).
template <class F>
void check_kernel(F&& f, std::size_t M, std::size_t N, std::size_t K, bool ta, bool tb, float alpha, float beta,
                  std::size_t pad, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  const std::size_t lda = a_cols + pad, ldb = b_cols + pad, ldc = N + pad;
  std::vector<float> A(a_rows * lda), B(b_rows * ldb), C(M * ldc);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  const float sentinel = 12345.0f;
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < ldc; ++j)
      C[i * ldc + j] = j >= N ? sentinel : beta == 0.0f ? std::numeric_limits<float>::quiet_NaN() : dist(rng);
  const std::vector<float> C0 = C;
  f(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  // op(A) and op(B)^T rounded, row-major [M, K] and [N, K].
  std::vector<double> ar(M * K), br(N * K);
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t k = 0; k < K; ++k) ar[i * K + k] = blas::bf16::round(ta ? A[k * lda + i] : A[i * lda + k]);
  for (std::size_t j = 0; j < N; ++j)
    for (std::size_t k = 0; k < K; ++k) br[j * K + k] = blas::bf16::round(tb ? B[j * ldb + k] : B[k * ldb + j]);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= N) {
        if (bits_of(got) != bits_of(sentinel)) ++bad;
        continue;
      }
      double s = 0, mag = 0;
      const double *x = ar.data() + i * K, *y = br.data() + j * K;
      for (std::size_t k = 0; k < K; ++k) {
        s += x[k] * y[k];
        mag += std::fabs(x[k] * y[k]);
      }
      const double c0 = beta == 0.0f ? 0.0 : double(C0[i * ldc + j]);
      const double want = double(alpha) * s + double(beta) * c0;
      const double tol = double(K + 2) * kU32 * (std::fabs(alpha) * mag + std::fabs(double(beta) * c0)) + 1e-30;
      if (!(std::fabs(double(got) - want) <= tol)) {
        if (bad < 3)
          UNSCOPED_INFO("M " << M << " N " << N << " K " << K << " ta " << ta << " tb " << tb << " C[" << i << "," << j
                             << "] = " << got << ", want " << want << " +- " << tol);
        ++bad;
      }
    }
  CHECK(bad == 0);
}

// check_kernel over every M x N of `dims` and K of `ks`, cycling through the transposes, alpha,
// beta and padding; returns how many products it ran.
template <class F>
int check_odd_shapes(F&& f, std::initializer_list<std::size_t> dims, std::initializer_list<std::size_t> ks,
                     std::mt19937& rng) {
  int n = 0;
  for (std::size_t M : dims)
    for (std::size_t N : dims)
      for (std::size_t K : ks) {
        const bool ta = n & 1, tb = (n >> 1) & 1;
        const float alpha = n % 3 == 0 ? 1.0f : -0.75f, beta = n % 5 == 0 ? 0.5f : 0.0f;
        check_kernel(f, M, N, K, ta, tb, alpha, beta, n % 7 == 0 ? 3 : 0, rng);
        ++n;
      }
  return n;
}

}  // namespace

TEST_CASE("bf16 rounding is to nearest with ties to even and keeps NaN and infinities", "[ops][matmul_bf16]") {
  CHECK(blas::bf16::round_bits(1.0f) == 0x3f80);
  CHECK(blas::bf16::round_bits(1.0f + 1.0f / 256) == 0x3f80);      // tie: down to the even 1.0
  CHECK(blas::bf16::round_bits(1.0f + 3.0f / 256) == 0x3f82);      // tie: up to the even 1 + 2^-6
  CHECK(blas::bf16::round_bits(1.0f + 1.0f / 256 + 1.0f / 4096) == 0x3f81);  // above the tie: up
  CHECK(blas::bf16::round_bits(-2.0f) == 0xc000);
  CHECK(blas::bf16::round_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(blas::bf16::round_bits(std::numeric_limits<float>::max()) == 0x7f80);  // overflows to infinity
  CHECK(std::isnan(blas::bf16::round(std::numeric_limits<float>::quiet_NaN())));
  CHECK(std::isnan(blas::bf16::round(std::numeric_limits<float>::signaling_NaN())));
  CHECK(blas::bf16::round_bits(-std::numeric_limits<float>::denorm_min()) == 0x8000);  // denormals: signed zero
  CHECK(blas::bf16::round(3.0f) == 3.0f);
}

TEST_CASE("bf16 kernel matches float64 of the rounded inputs on odd shapes", "[ops][matmul_bf16]") {
  if (!blas::bf16::cpu_supported()) {
    CHECK_THROWS_AS(blas::bf16::gemm_block(false, false, 2, 2, 2, 1.0f, nullptr, 2, nullptr, 2, 0.0f, nullptr, 2),
                    Error);
    return;  // nothing else to run on this CPU (the fallback is tested below)
  }
  std::mt19937 rng(1201);
  // K 300: two K blocks of the kernel, the second odd-sized.
  check_odd_shapes(blas::bf16::gemm_block, {1, 7, 13, 127, 129}, {1, 13, 129, 300}, rng);
  // Every transpose combination on one odd shape with padded leading dimensions.
  for (int t = 0; t < 4; ++t) check_kernel(blas::bf16::gemm_block, 37, 45, 263, t & 1, t & 2, 1.0f, 1.0f, 5, rng);
}

TEST_CASE("bf16 kernel gives the same bits with and without prefetching the next pack", "[ops][matmul_bf16]") {
  if (!blas::bf16::cpu_supported()) return;  // gemm_block needs the instructions (its refusal is tested above)
  struct Restore {
    bool on = blas::bf16::prefetch_ahead();
    ~Restore() { blas::bf16::set_prefetch_ahead(on); }
  } restore;
  std::mt19937 rng(1207);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // A transposed (the prefetched case): 203 rows of C (three row blocks of 96, the last short),
  // K 555 (three K blocks, the last odd), lda padded; and A not transposed (never prefetched).
  for (const bool ta : {true, false}) {
    const std::size_t M = 203, N = 77, K = 555, lda = (ta ? M : K) + 3, ldb = N + 1;
    std::vector<float> A((ta ? K : M) * lda), B(K * ldb);
    for (float& v : A) v = dist(rng);
    for (float& v : B) v = dist(rng);
    std::vector<float> with(M * N), without(M * N);
    for (const bool on : {true, false}) {
      blas::bf16::set_prefetch_ahead(on);
      const std::uint64_t lines0 = blas::bf16::prefetch_ahead_lines();
      blas::bf16::gemm_block(ta, false, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 0.0f,
                             (on ? with : without).data(), N);
      const std::uint64_t lines = blas::bf16::prefetch_ahead_lines() - lines0;
      INFO("ta " << ta << " prefetch " << on << ": " << lines << " lines prefetched");
      if (on && ta)  // at least the second row block's 96 floats (6 lines) of each of A's K rows
        CHECK(lines >= K * (96 * sizeof(float) / 64));
      else
        CHECK(lines == 0);
    }
    std::size_t differ = 0;
    for (std::size_t i = 0; i < M * N; ++i)
      if (bits_of(with[i]) != bits_of(without[i])) {
        if (differ++ < 3)
          UNSCOPED_INFO("ta " << ta << " C[" << i << "] " << std::setprecision(9) << with[i] << " against "
                              << without[i]);
      }
    CHECK(differ == 0);
  }
  // and the kernel as split over the pool, with the prefetches on, against float64 once more
  blas::bf16::set_prefetch_ahead(true);
  check_kernel([](auto&&... args) { blas::gemm_bf16_on(blas::Bf16Kernel::xgrad, args...); }, 300, 70, 600, true,
               false, 1.0f, 0.0f, 1, rng);
}

TEST_CASE("bf16 products on oneDNN match float64 of the rounded inputs", "[ops][matmul_bf16]") {
  const auto onednn = [](auto&&... args) { blas::gemm_bf16_on(blas::Bf16Kernel::onednn, args...); };
  const std::string why = blas::bf16::onednn_unavailable_reason();
  if (!blas::bf16::onednn_supported()) {
    CHECK(blas::bf16::onednn_impl().empty());
    CHECK(blas::bf16::onednn_measured_speedup() == 0.0);
    // The reason names the first cause that holds: the build, the CPU, the ISA ceiling.
    const std::string cause = !blas::onednn_available()      ? "built without oneDNN (XGRAD_WITH_ONEDNN)"
                              : !blas::bf16::cpu_supported() ? "this CPU has no AVX512_BF16 instructions"
                                                             : "the kernels are capped at avx2";
    INFO("oneDNN's bfloat16 products unavailable: " << why);
    CHECK(why.find(cause) != std::string::npos);
    CHECK_THROWS_WITH(onednn(false, false, 2, 2, 2, 1.0f, nullptr, 2, nullptr, 2, 0.0f, nullptr, 2),
                      Catch::Matchers::Contains("oneDNN's bfloat16 products are unavailable: " + why));
    return;  // built without oneDNN, no AVX512_BF16, or capped at AVX2
  }
  CHECK(why.empty());
  std::mt19937 rng(1205);
  const std::uint64_t calls0 = blas::bf16_calls(blas::Bf16Kernel::onednn);
  // The padded cases: C's rows not dense (oneDNN writes a dense copy), A and B padded.
  const int n = check_odd_shapes(onednn, {1, 7, 13, 129}, {1, 13, 300}, rng);
  for (int t = 0; t < 4; ++t) check_kernel(onednn, 37, 45, 263, t & 1, t & 2, 1.0f, 1.0f, 5, rng);
  // Large enough to be split over the pool by rows, B rounded by chunks too; and one row.
  check_kernel(onednn, 300, 129, 257, false, true, 1.0f, 0.0f, 0, rng);
  check_kernel(onednn, 300, 257, 129, true, false, 1.0f, 1.0f, 0, rng);
  check_kernel(onednn, 1, 513, 64, false, false, 1.0f, 0.0f, 0, rng);
  CHECK(blas::bf16_calls(blas::Bf16Kernel::onednn) - calls0 == std::uint64_t(n + 4 + 3));
  // The implementation oneDNN ran for the calibration's shape is the one it reports; AMX is
  // what makes it worth choosing (where the CPU has it and the OS grants it).
  std::vector<float> A(512 * 256, 0.5f), B(256 * 768, 0.25f), C(512 * 768);
  onednn(false, false, 512, 768, 256, 1.0f, A.data(), 256, B.data(), 768, 0.0f, C.data(), 768);
  INFO("oneDNN implementation " << blas::bf16::onednn_impl());
  CHECK(C[0] == 32.0f);  // 256 x 0.5 x 0.25, exact
  CHECK(C[512 * 768 - 1] == 32.0f);
  CHECK(blas::bf16::onednn_last_impl() == blas::bf16::onednn_impl());  // this thread's block ran it
  CHECK(blas::bf16::onednn_impl().rfind("brg:", 0) == 0);
  CHECK(blas::bf16::onednn_impl().find("bf16") != std::string::npos);
}

TEST_CASE("bf16 products split over the pool match float64 of the rounded inputs", "[ops][matmul_bf16]") {
  if (!blas::bf16::cpu_supported()) return;  // gemm_bf16 needs the instructions (callers check bf16_available)
  std::mt19937 rng(1202);
  // xgrad's kernel, whichever gemm_bf16 would choose (oneDNN's split is checked above)
  const auto split = [](auto&&... args) { blas::gemm_bf16_on(blas::Bf16Kernel::xgrad, args...); };
  check_kernel(split, 300, 129, 257, false, true, 1.0f, 0.0f, 0, rng);  // row blocks over the pool
  check_kernel(split, 7, 1023, 129, true, false, 1.0f, 1.0f, 2, rng);    // column blocks
  check_kernel(split, 1, 513, 64, false, false, 1.0f, 0.0f, 0, rng);     // one row: no matrix-vector shortcut
}

TEST_CASE("bf16 products with a long K run as two halves of K with the same bits for any thread count",
          "[ops][matmul_bf16]") {
  if (!blas::bf16::cpu_supported()) return;  // gemm_bf16 needs the instructions (callers check bf16_available)
  const xgt::ThreadCount restore;
  std::mt19937 rng(1208);
  const auto xgrad = [](auto&&... args) { blas::gemm_bf16_on(blas::Bf16Kernel::xgrad, args...); };
  // Against float64 of the rounded inputs: a weight gradient's shape (A transposed), column and
  // row blocks of C, beta, padded leading dimensions, halves of K that are not whole K blocks
  // (1030: 514 and 516).
  const std::uint64_t halves0 = blas::bf16_k_halves_calls();
  check_kernel(xgrad, 70, 90, 700, true, false, -0.75f, 0.5f, 3, rng);
  check_kernel(xgrad, 150, 40, 1030, false, true, 1.0f, 0.0f, 0, rng);
  CHECK(blas::bf16_k_halves_calls() - halves0 == 2);
  // Below the rule (K under twice M or N, or under 512) C's blocks as before.
  check_kernel(xgrad, 300, 90, 599, true, false, 1.0f, 0.0f, 0, rng);
  check_kernel(xgrad, 60, 60, 500, true, false, 1.0f, 0.0f, 0, rng);
  CHECK(blas::bf16_k_halves_calls() - halves0 == 2);
  // The same bits with 1, 2 and 3 threads (the halves are fixed; C's blocks are independent).
  const std::size_t M = 96, N = 200, K = 1200;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> A(K * M), B(K * N), C0(M * N);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  for (float& v : C0) v = dist(rng);
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    std::vector<float> C(C0);
    const std::uint64_t before = blas::bf16_k_halves_calls();
    xgrad(true, false, M, N, K, 0.5f, A.data(), M, B.data(), N, 0.25f, C.data(), N);
    CHECK(blas::bf16_k_halves_calls() - before == 1);
    if (first.empty()) {
      first = C;
      continue;
    }
    std::size_t differ = 0;
    for (std::size_t i = 0; i < C.size(); ++i)
      if (bits_of(C[i]) != bits_of(first[i]) && differ++ < 3)
        UNSCOPED_INFO(threads << " threads: C[" << i << "] = " << std::setprecision(9) << C[i] << ", 1 thread "
                              << first[i]);
    CHECK(differ == 0);
  }
}

TEST_CASE("bf16 products count inside the GEMM doorway of the step profile", "[ops][matmul_bf16]") {
  if (!blas::bf16::cpu_supported()) return;  // xgrad's kernel needs the instructions
  struct Profiled {
    Profiled() {
      detail::set_profiling(true);
      detail::reset_profile();
    }
    ~Profiled() { detail::set_profiling(false); }
  } profiled;
  std::vector<float> A(64 * 48, 0.5f), B(48 * 40, 0.25f), C(64 * 40);
  blas::gemm_bf16_on(blas::Bf16Kernel::xgrad, false, false, 64, 40, 48, 1.0f, A.data(), 48, B.data(), 40, 0.0f,
                     C.data(), 40);
  CHECK(C[0] == 6.0f);  // 48 x 0.5 x 0.25, exact
  CHECK(detail::gemm_profile_calls() == 1);
  CHECK(detail::gemm_profile_ms() > 0.0);
}

TEST_CASE("matmul in bf16 is within the bf16 bound of float64 forward and backward", "[ops][matmul_bf16][gemm_paths]") {
  const std::string reason = bfloat16_matmul_unavailable_reason();
  // Without the instructions that is the reason whatever the cap; with them, a cap at avx2 is.
  if (!blas::bf16::cpu_supported())
    CHECK(reason == "this CPU has no AVX512_BF16 instructions");
  else if (xisa_avx2())
    CHECK(reason.find("capped at avx2") != std::string::npos);
  CHECK(reason.empty() == blas::bf16_available());
  // Plain, transposed and batched (head matmul: [B, H, T, d] x [B, H, d, T]) products.
  struct Case {
    Shape a, b;
    bool ta, tb;
  };
  const std::vector<Case> cases = {{{13, 129}, {129, 7}, false, false},
                                   {{2, 3, 7, 16}, {2, 3, 13, 16}, false, true},
                                   {{127, 5}, {127, 9}, true, false},
                                   {{4, 9, 33}, {33, 12}, false, false}};
  Generator g(1203);
  for (const Case& c : cases) {
    const Array a64 = rnd(c.a, g), b64 = rnd(c.b, g);
    const ops::MatmulOptions o{c.ta, c.tb};
    Tensor a(a64, true), b(b64, true);
    Tensor out = ops::matmul(a, b, o);
    const Array gout = rnd(out.shape(), g);
    out.backward(gout);

    Tensor a32(a64.astype(DType::float32), true), b32(b64.astype(DType::float32), true);
    const std::uint64_t calls0 = blas::bf16_calls();
    Array f32_out;
    {
      MatmulDtypeScope scope(MatmulDtype::bfloat16);
      CHECK(matmul_dtype() == MatmulDtype::bfloat16);
      Tensor out32 = ops::matmul(a32, b32, o);
      out32.backward(gout.astype(DType::float32));
      f32_out = out32.value();
    }
    CHECK(matmul_dtype() == MatmulDtype::float32);  // the scope restored it
    const std::uint64_t calls = blas::bf16_calls() - calls0;
    if (blas::bf16_available()) {
      CHECK(calls >= 3);  // forward, a's and b's gradient (one per batch element when batched)
    } else {
      CHECK(calls == 0);  // float32 instead, as if the switch were off
      Tensor a2(a64.astype(DType::float32), true), b2(b64.astype(DType::float32), true);
      const Array plain = ops::matmul(a2, b2, o).value();
      XGT_CHECK_SAME(plain, f32_out);  // the same float32 call on the same operands
    }
    // Each entry: |x - x64| <= (2u + u^2 + (K + 2) 2^-24) sum_k |.||.| over its dot product:
    // the magnitudes are the same products on |a|, |b|, |g| in float64.
    const auto bound = [&](const Tensor& l, const Tensor& r, bool tl, bool tr, std::size_t K) {
      const Array m = ops::matmul(Tensor(ops::abs(Tensor(l.value())).value()),
                                  Tensor(ops::abs(Tensor(r.value())).value()), ops::MatmulOptions{tl, tr})
                          .value();
      return std::make_pair(m, 2 * kU + kU * kU + double(K + 2) * kU32);
    };
    const auto within = [&](const Array& got32, const Array& want, const std::pair<Array, double>& mb,
                            const char* what) {
      const std::vector<double> x = got32.astype(DType::float64).to_vector(), y = want.to_vector(),
                                m = mb.first.to_vector();
      REQUIRE(x.size() == y.size());
      REQUIRE(m.size() == y.size());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < x.size(); ++i)
        if (!(std::fabs(x[i] - y[i]) <= mb.second * m[i] + 1e-30)) ++bad;
      INFO(what << " of a " << shape_str(c.a) << " x b " << shape_str(c.b));
      CHECK(bad == 0);
    };
    const std::size_t K = c.ta ? c.a[c.a.size() - 2] : c.a.back();
    const std::size_t N = c.tb ? c.b[c.b.size() - 2] : c.b.back();
    const std::size_t rows = out.value().size() / N;  // all rows of C: the most terms b's gradient sums
    // A bound's magnitudes summed over the batch axes an operand was broadcast along.
    const auto to_shape = [](std::pair<Array, double> mb, const Shape& s) {
      while (mb.first.shape().size() > s.size()) mb.first = ops::sum(Tensor(mb.first), {0}).value();
      return mb;
    };
    Tensor ga(gout), ta64(a64), tb64(b64);
    within(f32_out, out.value(), bound(ta64, tb64, c.ta, c.tb, K), "forward");
    // a_bar = G op(B)^T, or op(B) G^T when a is transposed: N terms.
    within(a32.grad(), a.grad(),
           to_shape(c.ta ? bound(tb64, ga, c.tb, true, N) : bound(ga, tb64, false, !c.tb, N), c.a), "a's gradient");
    // b_bar = op(A)^T G, or G^T op(A) when b is transposed: M terms per batch element.
    within(b32.grad(), b.grad(),
           to_shape(c.tb ? bound(ga, ta64, true, c.ta, rows) : bound(ta64, ga, !c.ta, false, rows), c.b),
           "b's gradient");
  }
}

TEST_CASE("bf16 products are chosen by the measured speed of the CPU's dot products unless forced",
          "[ops][matmul_bf16][gemm_paths]") {
  const std::string reason = bfloat16_matmul_unavailable_reason(), forced = bf16_forced();
  if (!blas::bf16::cpu_supported()) {
    CHECK(blas::bf16::measured_speedup() == 0.0);
    CHECK(reason == "this CPU has no AVX512_BF16 instructions");
    return;
  }
  if (xisa_avx2()) {
    CHECK(reason.find("capped at avx2") != std::string::npos);
    if (forced == "onednn")  // forced where oneDNN has no bfloat16 matmul: the choice names why
      CHECK_THROWS_WITH(blas::bf16_kernel(),
                        Catch::Matchers::Contains("XGRAD_BF16_GEMM") &&
                            Catch::Matchers::Contains(
                                "oneDNN's bfloat16 products are unavailable: the kernels are capped at avx2"));
    return;
  }
  const bool amx = blas::bf16::onednn_supported() && blas::bf16::onednn_uses_amx();
  INFO("oneDNN's bf16 implementation '" << blas::bf16::onednn_impl() << "', kernel "
                                        << blas::bf16_kernel_name(blas::bf16_kernel()) << " ("
                                        << blas::bf16_kernel_reason() << ")");
  if (forced == "on") {
    CHECK(reason.empty());  // a kernel runs: the other cases of this run check its calls
    CHECK((blas::bf16_kernel() == blas::Bf16Kernel::onednn) == amx);  // oneDNN where it has AMX
    return;
  }
  if (forced == "xgrad" || forced == "onednn") {
    CHECK(reason.empty());
    CHECK(blas::bf16_kernel() == (forced == "xgrad" ? blas::Bf16Kernel::xgrad : blas::Bf16Kernel::onednn));
    return;
  }
  if (forced == "off") {
    CHECK(reason == blas::forced_kernel("XGRAD_BF16_GEMM", "bf16_gemm").setting());
    return;
  }
  // auto: the decision follows the calibrated ratios, oneDNN's AMX products first where oneDNN
  // has them, then xgrad's dot products. detail::calibrated gives every caller in a process the
  // value the decision used (measured here or read from the calibration cache), so the checks
  // need no band around the threshold.
  const auto ratio = [](const char* name, double (*measure)()) { return detail::calibrated(name, measure).value; };
  CHECK(blas::bf16::measured_speedup() > 0.0);  // the measurement itself runs on this CPU
  if (amx) {
    const double ro = ratio("bf16_gemm_onednn_amx", blas::bf16::onednn_measured_speedup);
    INFO("calibrated oneDNN bf16 product / fp32 product speed-up " << ro);
    CHECK(ro > 0.0);
    if (ro >= blas::bf16::kMinSpeedup) {
      CHECK(reason.empty());
      CHECK(blas::bf16_kernel() == blas::Bf16Kernel::onednn);
      CHECK(blas::bf16_kernel_reason().find("AMX products measured at") != std::string::npos);
      return;
    }
  }
  const double r = ratio("bf16_gemm_dot", blas::bf16::measured_speedup);
  INFO("calibrated bf16/fp32 speed-up " << r << ", reason '" << reason << "'");
  CHECK(r > 0.0);
  if (r < blas::bf16::kMinSpeedup) {
    CHECK(reason.find("measured at") != std::string::npos);
  } else {
    CHECK(reason.empty());
    CHECK(blas::bf16_kernel() == blas::Bf16Kernel::xgrad);
  }
}

TEST_CASE("the bf16 decision from given calibration ratios names the measurement on both sides of the threshold",
          "[ops][matmul_bf16][gemm_paths]") {
  // The calibration's answer depends on the CPU (and on a sanitizer build's slow-down): the
  // decision itself is given both sides here, whatever this CPU measures.
  const double lo = 1.0, hi = 1.5;  // either side of kMinSpeedup (1.25)
  REQUIRE(lo < blas::bf16::kMinSpeedup);
  REQUIRE(hi > blas::bf16::kMinSpeedup);
  const blas::Bf16Choice slow = blas::bf16_decision(false, 0.0, lo);
  CHECK(slow.unavailable.find("bfloat16 dot products measured at 1.00x the float32 FMA rate") == 0);
  CHECK(slow.unavailable.find("float32 products are faster") != std::string::npos);
  const blas::Bf16Choice fast = blas::bf16_decision(false, 0.0, hi);
  CHECK(fast.unavailable.empty());
  CHECK(fast.kernel == blas::Bf16Kernel::xgrad);
  CHECK(fast.reason == "bfloat16 dot products measured at 1.50x float32 FMAs");
  const blas::Bf16Choice amx_fast = blas::bf16_decision(true, hi, lo);
  CHECK(amx_fast.unavailable.empty());
  CHECK(amx_fast.kernel == blas::Bf16Kernel::onednn);
  CHECK(amx_fast.reason == "AMX products measured at 1.50x float32");
  const blas::Bf16Choice amx_slow_dot_fast = blas::bf16_decision(true, lo, hi);
  CHECK(amx_slow_dot_fast.unavailable.empty());
  CHECK(amx_slow_dot_fast.kernel == blas::Bf16Kernel::xgrad);
  CHECK(amx_slow_dot_fast.reason == "bfloat16 dot products measured at 1.50x float32 FMAs");
  const blas::Bf16Choice both_slow = blas::bf16_decision(true, lo, lo);
  CHECK(both_slow.unavailable.find("oneDNN's AMX products measured at 1.00x the float32 product rate, "
                                   "bfloat16 dot products measured at 1.00x") == 0);
  // exactly at the threshold: bfloat16 runs
  CHECK(blas::bf16_decision(false, 0.0, blas::bf16::kMinSpeedup).unavailable.empty());
}

TEST_CASE("the bf16 switch leaves float64 matmuls bit-identical", "[ops][matmul_bf16]") {
  Generator g(1204);
  const Array a = rnd({17, 33}, g), b = rnd({33, 9}, g);
  const Array off = ops::matmul(Tensor(a), Tensor(b)).value();
  const std::uint64_t calls0 = blas::bf16_calls();
  MatmulDtypeScope scope(MatmulDtype::bfloat16);
  XGT_CHECK_SAME(ops::matmul(Tensor(a), Tensor(b)).value(), off);  // the same float64 call
  CHECK(blas::bf16_calls() == calls0);
}

TEST_CASE("a GPT and a Llama step in bf16 give float32's loss and gradients within a few bf16 roundings",
          "[ops][matmul_bf16]") {
  // The whole model through whichever bf16 kernel this process runs (ctest runs this file under
  // XGRAD_BF16_GEMM=xgrad, =onednn, =on, =off and auto): each parameter's gradient within 2% of
  // float32's in norm (bf16's unit roundoff is 2^-8 = 0.4%, a few products deep; 0.7% measured
  // on both kernels), the loss within 0.5%; where bf16 products do not run, float32's bits.
  // Heads of width 16 and 32: at 32 the fused attention's products run on AMX tiles where this
  // process chose them (nn::bfloat16_attention_kernels(); its products are counted).
  for (nn::Architecture arch : {nn::Architecture::gpt, nn::Architecture::llama})
    for (std::size_t heads : {std::size_t(4), std::size_t(2)}) {
      nn::TransformerConfig c = tiny_model(arch, 2);
      c.V_vocab = 37;
      c.context = 32;
      c.d_model = 64;
      c.H_q = heads;
      c.d_ff = 256;
      c.dtype = DType::float32;
      Generator init(1206);
      nn::GPT model(c, init);
      std::mt19937 rng(1207);
      std::vector<std::int64_t> ids(4 * 32), next(4 * 32);
      for (auto& v : ids) v = static_cast<std::int64_t>(rng() % 37);
      for (auto& v : next) v = static_cast<std::int64_t>(rng() % 37);
      const IndexArray tokens({4, 32}, ids), targets({4, 32}, next);
      const auto grads = [&](double& loss) {
        for (Tensor& p : model.parameters()) p.zero_grad();
        Tensor L = model.loss(tokens, targets);
        L.backward();
        loss = L.item();
        std::vector<Array> g;
        for (const Tensor& p : model.parameters()) g.push_back(p.grad().clone());
        return g;
      };
      double loss32 = 0, loss16 = 0;
      const std::vector<Array> g32 = grads(loss32);
      // (the attention's choice first: its calibration runs tile products of its own)
      const bool amx_attention = blas::bf16_available() && nn::tile::bf16_choice().use() && c.d_model / heads % 32 == 0;
      const std::uint64_t calls0 = blas::bf16_calls(), tiles0 = blas::amx::calls();
      std::vector<Array> g16;
      {
        MatmulDtypeScope scope(MatmulDtype::bfloat16);
        g16 = grads(loss16);
      }
      const std::uint64_t calls = blas::bf16_calls() - calls0, tiles = blas::amx::calls() - tiles0;
      INFO((arch == nn::Architecture::gpt ? "gpt" : "llama")
           << " with " << heads << " heads: loss float32 " << sci(loss32) << ", bf16 " << sci(loss16)
           << ", bf16 products " << calls << " (" << bfloat16_gemm_kernels() << "), attention tile products " << tiles
           << " ("
           << nn::bfloat16_attention_kernels() << ")");
      CHECK((tiles > 0) == amx_attention);
      if (!blas::bf16_available()) {
        CHECK(calls == 0);
        CHECK(loss16 == loss32);
        for (std::size_t i = 0; i < g32.size(); ++i) XGT_CHECK_SAME(g16[i], g32[i]);
        continue;
      }
      CHECK(calls >= 3 * 2 * 3);  // three products per matmul, at least three matmuls per layer
      CHECK(std::fabs(loss16 - loss32) <= 5e-3 * std::fabs(loss32));
      const auto norm = [](const Array& a) {
        double s = 0;
        for (std::size_t i = 0; i < a.size(); ++i) s += a.flat(i) * a.flat(i);
        return std::sqrt(s);
      };
      const auto names = model.named_parameters();
      for (std::size_t i = 0; i < g32.size(); ++i) {
        Array d = g16[i].clone();
        for (std::size_t k = 0; k < d.size(); ++k) d.set_flat(k, g16[i].flat(k) - g32[i].flat(k));
        INFO(names[i].first << ": |g16 - g32| " << sci(norm(d)) << ", |g32| " << sci(norm(g32[i])));
        CHECK(norm(d) <= 0.02 * norm(g32[i]) + 1e-12);
      }
    }
}
