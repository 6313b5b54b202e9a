// xgrad's own float64 GEMM kernel (core/detail/dgemm.hpp), built for AVX-512 and for AVX2 + FMA
// in one translation unit compiled for the x86-64 baseline (CMakeLists.txt), each build under its
// target pragma, the ISA chosen by the caller (core/blas.cpp) at run time.
#include <xgrad/core/detail/dgemm.hpp>

#include <algorithm>
#include <string>

#include <xgrad/core/detail/aligned_vector.hpp>
#include <xgrad/core/error.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define XG_DGEMM_X86 1
#include <immintrin.h>

#include <xgrad/core/detail/isa_target.hpp>
#else
#define XG_DGEMM_X86 0
#endif

namespace xg::blas::f64 {

#if XG_DGEMM_X86
XG_TARGET_BEGIN(XG_ISA_AVX512)
namespace avx512 {
namespace {
using Vec = __m512d;
constexpr std::size_t kW = 8, kMR = 8, kNV = 3;
inline Vec load(const double* p) { return _mm512_loadu_pd(p); }
inline void store(double* p, Vec v) { _mm512_storeu_pd(p, v); }
inline Vec set1(double x) { return _mm512_set1_pd(x); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_pd(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm512_mul_pd(a, b); }
inline Vec add(Vec a, Vec b) { return _mm512_add_pd(a, b); }
inline Vec zero() { return _mm512_setzero_pd(); }
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12's _mm512_undefined_pd inside the shuffles
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
// dst[p ldd + i] = src[i lds + p] for i, p < 8: an 8 x 8 block transposed in registers (pairs of
// rows interleaved, then 128-bit lanes gathered in two rounds), for the packing.
inline void transpose_block(const double* src, std::size_t lds, double* dst, std::size_t ldd) {
  Vec r[8], t[8];
  for (std::size_t i = 0; i < 8; ++i) r[i] = load(src + i * lds);
  for (std::size_t i = 0; i < 8; i += 2) {
    t[i] = _mm512_unpacklo_pd(r[i], r[i + 1]);      // lanes: (row i, i+1) at p = 0, 2, 4, 6
    t[i + 1] = _mm512_unpackhi_pd(r[i], r[i + 1]);  // p = 1, 3, 5, 7
  }
  for (std::size_t odd = 0; odd < 2; ++odd) {
    const Vec s0 = _mm512_shuffle_f64x2(t[odd], t[2 + odd], 0x44);  // p, p+2 of rows 0-1 and 2-3
    const Vec s1 = _mm512_shuffle_f64x2(t[odd], t[2 + odd], 0xEE);  // p+4, p+6
    const Vec s2 = _mm512_shuffle_f64x2(t[4 + odd], t[6 + odd], 0x44);
    const Vec s3 = _mm512_shuffle_f64x2(t[4 + odd], t[6 + odd], 0xEE);
    store(dst + (0 + odd) * ldd, _mm512_shuffle_f64x2(s0, s2, 0x88));
    store(dst + (2 + odd) * ldd, _mm512_shuffle_f64x2(s0, s2, 0xDD));
    store(dst + (4 + odd) * ldd, _mm512_shuffle_f64x2(s1, s3, 0x88));
    store(dst + (6 + odd) * ldd, _mm512_shuffle_f64x2(s1, s3, 0xDD));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include "detail/dgemm.inc"
}  // namespace
}  // namespace avx512
XG_TARGET_END()
XG_TARGET_BEGIN(XG_ISA_AVX2)
namespace avx2 {
namespace {
using Vec = __m256d;
constexpr std::size_t kW = 4, kMR = 6, kNV = 2;
inline Vec load(const double* p) { return _mm256_loadu_pd(p); }
inline void store(double* p, Vec v) { _mm256_storeu_pd(p, v); }
inline Vec set1(double x) { return _mm256_set1_pd(x); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_pd(a, b, c); }
inline Vec mul(Vec a, Vec b) { return _mm256_mul_pd(a, b); }
inline Vec add(Vec a, Vec b) { return _mm256_add_pd(a, b); }
inline Vec zero() { return _mm256_setzero_pd(); }
// dst[p ldd + i] = src[i lds + p] for i, p < 4: a 4 x 4 block transposed in registers.
inline void transpose_block(const double* src, std::size_t lds, double* dst, std::size_t ldd) {
  const Vec r0 = load(src), r1 = load(src + lds), r2 = load(src + 2 * lds), r3 = load(src + 3 * lds);
  const Vec t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);  // rows 0-1 at p = 0, 2 / 1, 3
  const Vec t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
  store(dst, _mm256_permute2f128_pd(t0, t2, 0x20));
  store(dst + ldd, _mm256_permute2f128_pd(t1, t3, 0x20));
  store(dst + 2 * ldd, _mm256_permute2f128_pd(t0, t2, 0x31));
  store(dst + 3 * ldd, _mm256_permute2f128_pd(t1, t3, 0x31));
}
#include "detail/dgemm.inc"
}  // namespace
}  // namespace avx2
XG_TARGET_END()
#endif

namespace {
bool detect(Isa isa) {
#if XG_DGEMM_X86
  if (isa == Isa::avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  (void)isa;
  return false;
#endif
}
}  // namespace

bool cpu_supported(Isa isa) {
  static const bool avx512 = detect(Isa::avx512), avx2 = detect(Isa::avx2);  // cpuid once
  return isa == Isa::avx512 ? avx512 : avx2;
}

void gemm_block(Isa isa, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha, const double* A,
                std::size_t lda, const double* B, std::size_t ldb, double beta, double* C, std::size_t ldc) {
  if (!cpu_supported(isa))
    throw Error(op_message("blas::dgemm", std::string("this CPU has no ") +
                                              (isa == Isa::avx512 ? "AVX-512 (F, BW, VL, DQ)" : "AVX2 + FMA") +
                                              " instructions for xgrad's float64 kernel"));
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta C (beta 0: zeros, C never read)
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0 ? 0.0 : beta * C[i * ldc + j];
    return;
  }
#if XG_DGEMM_X86
  if (isa == Isa::avx512)
    avx512::gemm_block(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    avx2::gemm_block(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
  (void)ta, (void)tb, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
#endif
}

}  // namespace xg::blas::f64
