// xgrad's own float64 GEMM kernel (core/detail/dgemm.hpp), built for AVX-512 and for AVX2 + FMA
// in one translation unit compiled for the x86-64 baseline (CMakeLists.txt), each build under its
// target pragma, the ISA chosen by the caller (core/blas.cpp) at run time.
#include <xgrad/core/detail/dgemm.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

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
