// Small bfloat16 products on AMX tiles and with AVX512_BF16 dot products on the same layouts
// (core/detail/amx_gemm.hpp), against a float64 product of the bfloat16-rounded inputs: only
// float32 accumulation error is allowed, so a product that did not round its inputs, or read a
// tile at the wrong place, fails. Where this machine cannot run one of them the test checks that
// it refuses with the reason.
#include "tests/support/helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <random>
#include <utility>
#include <vector>

#include <xgrad/core/detail/amx_gemm.hpp>
#include <xgrad/core/detail/bf16_gemm.hpp>
#include <xgrad/core/error.hpp>

using namespace xg;

namespace {

// C = a~ b~ through blas::amx::product with A read at (a_rs, a_cs) and C rows ldc apart, against
// float64: each entry within (K + 2) 2^-24 sum |a~||b~|; C's padding columns untouched.
void check_product(std::size_t M, std::size_t N, std::size_t K, char layout, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  // layout 'r': A [M, K] rows (a_rs = K + 3: padded); 't': A stored [K, M] (a_rs = 1); 's': both
  // strides above 1 (every other entry of a [M, 2K] array)
  std::size_t a_rs = K + 3, a_cs = 1, a_size = M * (K + 3);
  if (layout == 't') {
    a_rs = 1;
    a_cs = M + 1;
    a_size = K * (M + 1);
  } else if (layout == 's') {
    a_rs = 2 * K;
    a_cs = 2;
    a_size = M * 2 * K;
  }
  const std::size_t ldb = N + 5, ldc = N + 7;
  std::vector<float> A(a_size + 1), B(K * ldb + 1), C(M * ldc + 1, 7.0f);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  const std::uint64_t before = blas::amx::calls();
  blas::amx::product(M, N, K, A.data(), a_rs, a_cs, B.data(), ldb, C.data(), ldc);
  CHECK(blas::amx::calls() == before + 1);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < M; ++i) {
    for (std::size_t j = 0; j < N; ++j) {
      double ref = 0, mag = 0;
      for (std::size_t k = 0; k < K; ++k) {
        const double a = blas::bf16::round(A[i * a_rs + k * a_cs]), b = blas::bf16::round(B[k * ldb + j]);
        ref += a * b;
        mag += std::fabs(a * b);
      }
      const double got = C[i * ldc + j], bound = (K + 2) * std::ldexp(1.0, -24) * mag;
      if (!(std::fabs(got - ref) <= bound) && bad++ < 3)
        UNSCOPED_INFO("C[" << i << "][" << j << "] = " << std::setprecision(17) << got
                           << ", float64 of the rounded inputs " << ref << ", bound " << bound);
    }
    for (std::size_t j = N; j < ldc && i * ldc + j < C.size(); ++j)
      if (C[i * ldc + j] != 7.0f && bad++ < 3) UNSCOPED_INFO("padding C[" << i << "][" << j << "] written");
  }
  INFO("M " << M << " N " << N << " K " << K << " layout " << layout);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("amx product: float64 of the bfloat16-rounded inputs on odd shapes and every A layout", "[amx]") {
  const std::string why = blas::amx::unavailable_reason();
  if (!why.empty()) {
    WARN("AMX bfloat16 tiles unavailable here: " << why);
    float a = 1, b = 1, c = 0;
    CHECK_THROWS_AS(blas::amx::product(1, 1, 1, &a, 1, 1, &b, 1, &c, 1), Error);
    return;
  }
  std::mt19937 rng(41);
  const std::size_t shapes[][3] = {{1, 1, 1},   {5, 17, 3},   {16, 16, 32}, {32, 32, 64}, {33, 48, 70},
                                   {128, 64, 64}, {37, 80, 129}, {64, 16, 200}, {17, 31, 33}};
  for (const auto& s : shapes)
    for (const char layout : {'r', 't', 's'}) check_product(s[0], s[1], s[2], layout, rng);
}

TEST_CASE("amx product: an entry's bits do not depend on M or N or where it lies", "[amx]") {
  if (!blas::amx::available()) return;  // (the test above states why)
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t M = 64, N = 64, K = 70;
  std::vector<float> A(M * K), B(K * N), full(M * N), part(17 * 32);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  blas::amx::product(M, N, K, A.data(), K, 1, B.data(), N, full.data(), N);
  // rows 5..21, columns 16..47: a 17 x 32 product of the same rows and columns
  blas::amx::product(17, 32, K, A.data() + 5 * K, K, 1, B.data() + 16, N, part.data(), 32);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < 17; ++i)
    for (std::size_t j = 0; j < 32; ++j)
      if (std::memcmp(&part[i * 32 + j], &full[(5 + i) * N + 16 + j], sizeof(float)) != 0 && differ++ == 0)
        UNSCOPED_INFO("entry (" << 5 + i << ", " << 16 + j << "): " << std::setprecision(9) << part[i * 32 + j]
                                << " against " << full[(5 + i) * N + 16 + j]);
  CHECK(differ == 0);
}

TEST_CASE("amx product: K 0 gives zeros and M 0 writes nothing", "[amx]") {
  if (!blas::amx::available()) return;
  std::vector<float> A(4, 1.0f), B(4, 1.0f), C(6, 3.0f);
  blas::amx::product(2, 3, 0, A.data(), 2, 1, B.data(), 3, C.data(), 3);
  for (const float c : C) CHECK(c == 0.0f);
  C.assign(6, 3.0f);
  blas::amx::product(0, 3, 2, A.data(), 2, 1, B.data(), 3, C.data(), 3);
  for (const float c : C) CHECK(c == 3.0f);
}

TEST_CASE("amx round_b_transposed: the words round_b gives for the transposed matrix", "[amx]") {
  if (!blas::bf16::cpu_supported()) return;  // (the rounding needs AVX512_BF16 only)
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const auto& [K, N] : std::vector<std::pair<std::size_t, std::size_t>>{{32, 16}, {70, 45}, {5, 3}, {64, 130}}) {
    INFO("K " << K << " N " << N);
    const std::size_t kw = (K + 31) / 32 * 16, Np = (N + 15) / 16 * 16;
    std::vector<float> B(K * N), Bt(N * K);
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t j = 0; j < N; ++j) Bt[j * K + k] = B[k * N + j] = dist(rng);
    std::vector<std::uint32_t> want(kw * Np, 1u), got(kw * Np, 2u);
    blas::amx::round_b(K, N, B.data(), N, want.data(), Np);
    blas::amx::round_b_transposed(K, N, Bt.data(), K, got.data(), Np);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < want.size(); ++i) differ += want[i] != got[i];
    CHECK(differ == 0);
  }
}

namespace {

// C (+)= a~ b~ through round_a, round_b and blas::amx::dot_tiles (or tiles), C rows ldc apart
// with sentinels beyond N and below M, against float64: each entry within (K + 3) 2^-24 (|c0| +
// sum |a~||b~|); returns C and each entry's bound (0 outside the product).
struct DotResult {
  std::vector<float> C;
  std::vector<double> bound;
};
DotResult check_dot(std::size_t M, std::size_t N, std::size_t K, bool accumulate, bool amx, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t kw = (K + 31) / 32 * 16, Mp = (M + 15) / 16 * 16, Np = (N + 15) / 16 * 16;
  const std::size_t lda = K + 3, ldb = N + 5, ldc = N + 7, words_a = kw + 16, words_b = Np + 16;
  std::vector<float> A(M * lda), B(K * ldb), C((M + 2) * ldc, 7.0f);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  for (std::size_t i = 0; i < M; ++i)
    for (std::size_t j = 0; j < N; ++j) C[i * ldc + j] = dist(rng);
  const std::vector<float> C0(C);
  std::vector<std::uint32_t> a(Mp * words_a, 0xdeadbeefu), b(kw * words_b, 0xdeadbeefu);
  blas::amx::round_a(M, K, 1.0f, A.data(), lda, 1, a.data(), words_a);
  blas::amx::round_b(K, N, B.data(), ldb, b.data(), words_b);
  const std::uint64_t before = blas::amx::calls();
  if (amx)
    blas::amx::tiles(M, N, kw, a.data(), words_a, b.data(), words_b, C.data(), ldc, accumulate);
  else
    blas::amx::dot_tiles(M, N, kw, a.data(), words_a, b.data(), words_b, C.data(), ldc, accumulate);
  CHECK(blas::amx::calls() == before + 1);
  std::size_t bad = 0;
  std::vector<double> bounds(C.size(), 0.0);
  for (std::size_t i = 0; i < M + 2; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (i >= M || j >= N) {
        if (got != 7.0f && bad++ < 3) UNSCOPED_INFO("C[" << i << "][" << j << "] outside the product written");
        continue;
      }
      double ref = accumulate ? C0[i * ldc + j] : 0.0, mag = std::fabs(ref);
      for (std::size_t k = 0; k < K; ++k) {
        const double x = blas::bf16::round(A[i * lda + k]) * double(blas::bf16::round(B[k * ldb + j]));
        ref += x;
        mag += std::fabs(x);
      }
      const double bound = (K + 3) * std::ldexp(1.0, -24) * mag;
      bounds[i * ldc + j] = bound;
      if (!(std::fabs(got - ref) <= bound) && bad++ < 3)
        UNSCOPED_INFO("C[" << i << "][" << j << "] = " << std::setprecision(17) << got
                           << ", float64 of the rounded inputs " << ref << ", bound " << bound);
    }
  INFO("M " << M << " N " << N << " K " << K << (accumulate ? " accumulating" : "") << (amx ? " on AMX" : " dot"));
  CHECK(bad == 0);
  return {C, bounds};
}

}  // namespace

TEST_CASE("dot_tiles: float64 of the bfloat16-rounded inputs on odd shapes with and without accumulate",
          "[amx]") {
  const std::string why = blas::amx::dot_unavailable_reason();
  if (!blas::bf16::cpu_supported()) {
    WARN("AVX512_BF16 dot products unavailable here: " << why);
    std::uint32_t a = 0, b = 0;
    float c = 0;
    CHECK_THROWS_AS(blas::amx::dot_tiles(1, 1, 16, &a, 16, &b, 16, &c, 1, false), Error);
    return;
  }
  std::mt19937 rng(43);
  // every register block (N up to 16, 32, 48, 64 and past 64) with row tails, K 0 and odd K
  const std::size_t shapes[][3] = {{1, 1, 1},    {5, 17, 3},   {16, 16, 32}, {33, 48, 70}, {128, 64, 64},
                                   {37, 80, 129}, {64, 16, 200}, {17, 31, 33}, {9, 130, 64}, {20, 40, 0}};
  for (const auto& s : shapes)
    for (const bool acc : {false, true}) check_dot(s[0], s[1], s[2], acc, false, rng);
}

TEST_CASE("dot_tiles: an entry's bits do not depend on M or N or where it lies", "[amx]") {
  if (!blas::bf16::cpu_supported()) return;  // (the test above states why)
  std::mt19937 rng(6);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::size_t M = 64, N = 80, K = 70, kw = 48;
  std::vector<float> A(M * K), B(K * N), full(M * N), part(17 * 40);
  for (float& v : A) v = dist(rng);
  for (float& v : B) v = dist(rng);
  std::vector<std::uint32_t> a(M * kw), b(kw * N);
  blas::amx::round_a(M, K, 1.0f, A.data(), K, 1, a.data(), kw);
  blas::amx::round_b(K, N, B.data(), N, b.data(), N);
  blas::amx::dot_tiles(M, N, kw, a.data(), kw, b.data(), N, full.data(), N, false);
  // rows 5..21, columns 16..55: another register block (N 40: 3 vectors of 8 rows, not 4 of 4)
  blas::amx::dot_tiles(17, 40, kw, a.data() + 5 * kw, kw, b.data() + 16, N, part.data(), 40, false);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < 17; ++i)
    for (std::size_t j = 0; j < 40; ++j)
      if (std::memcmp(&part[i * 40 + j], &full[(5 + i) * N + 16 + j], sizeof(float)) != 0 && differ++ == 0)
        UNSCOPED_INFO("entry (" << 5 + i << ", " << 16 + j << "): " << std::setprecision(9) << part[i * 40 + j]
                                << " against " << full[(5 + i) * N + 16 + j]);
  CHECK(differ == 0);
}

TEST_CASE("dot_tiles and AMX tiles: the same products within float32 summation of each other", "[amx]") {
  if (!blas::amx::available()) return;  // (AMX: the first test states why not)
  std::mt19937 rng(8);
  for (const bool acc : {false, true}) {
    std::mt19937 same = rng;
    const DotResult dot = check_dot(33, 48, 70, acc, false, rng);  // (each checks its call ran)
    const DotResult amx = check_dot(33, 48, 70, acc, true, same);  // the same inputs
    // each within its bound of float64, so within twice that of each other
    std::size_t apart = 0;
    for (std::size_t i = 0; i < dot.C.size(); ++i)
      if (!(std::fabs(double(dot.C[i]) - amx.C[i]) <= 2 * dot.bound[i]) && apart++ == 0)
        UNSCOPED_INFO("entry " << i << ": " << std::setprecision(9) << dot.C[i] << " against " << amx.C[i]);
    CHECK(apart == 0);
  }
}
