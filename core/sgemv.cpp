// xgrad's own float32 matrix-vector kernel (core/detail/sgemv.hpp), built for AVX-512 and for
// AVX2 + FMA in one translation unit compiled for the x86-64 baseline (CMakeLists.txt), each
// build under its target pragma, plus a scalar fallback computing the same fma chains; the ISA
// is chosen by the caller (core/blas.cpp) at run time.
#include <xgrad/core/detail/sgemv.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <xgrad/core/error.hpp>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define XG_SGEMV_X86 1
#include <immintrin.h>

#include <xgrad/core/detail/isa_target.hpp>
#else
#define XG_SGEMV_X86 0
#endif

namespace xg::blas::f32v {

#if XG_SGEMV_X86
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's own _mm512_castps512_ps256 reads an "undefined" vector it then warns about (GCC bug
// 105593): a false positive of the header, not of this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
XG_TARGET_BEGIN(XG_ISA_AVX512)
namespace avx512 {
namespace {
using Vec = __m512;
using Mask = __mmask16;
constexpr std::size_t kW = 16;
constexpr bool kStreamed = false;  // the panel forms (core/detail/sgemv.inc)
inline Mask make_mask(std::size_t r) { return static_cast<Mask>((1u << r) - 1u); }
inline Vec load(const float* p) { return _mm512_loadu_ps(p); }
inline Vec load_mask(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
inline void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec set1(float x) { return _mm512_set1_ps(x); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec zero() { return _mm512_setzero_ps(); }
using L16 = __m512;
inline L16 zero16() { return _mm512_setzero_ps(); }
inline L16 load16(const float* p) { return _mm512_loadu_ps(p); }
inline Mask mask16(std::size_t r) { return make_mask(r); }
inline L16 load16_mask(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
inline L16 fma16(L16 a, L16 b, L16 c) { return _mm512_fmadd_ps(a, b, c); }
inline float reduce8(__m256 a) {  // lanes l + l+4, then + 2 apart, then + 1 apart
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
inline float reduce16(L16 v) {
  return reduce8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#include "detail/sgemv.inc"
}  // namespace
}  // namespace avx512
XG_TARGET_END()
XG_TARGET_BEGIN(XG_ISA_AVX2)
namespace avx2 {
namespace {
using Vec = __m256;
using Mask = __m256i;
constexpr std::size_t kW = 8;
constexpr bool kStreamed = true;  // the streamed forms (core/detail/sgemv.inc)
inline Mask make_mask(std::size_t r) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(r)), lane);  // lane < r: all ones
}
inline Vec load(const float* p) { return _mm256_loadu_ps(p); }
inline Vec load_mask(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
inline void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec set1(float x) { return _mm256_set1_ps(x); }
inline Vec fmadd(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec zero() { return _mm256_setzero_ps(); }
struct L16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
};
struct Mask16 {
  Mask lo, hi;
};
inline L16 zero16() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline L16 load16(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Mask16 mask16(std::size_t r) { return {make_mask(std::min<std::size_t>(r, 8)), make_mask(r > 8 ? r - 8 : 0)}; }
inline L16 load16_mask(const float* p, const Mask16& m) {
  return {_mm256_maskload_ps(p, m.lo), _mm256_maskload_ps(p + 8, m.hi)};
}
inline L16 fma16(L16 a, L16 b, L16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline float reduce16(L16 v) {
  const __m256 a = _mm256_add_ps(v.lo, v.hi);  // lanes l + l+8
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
#include "detail/sgemv.inc"
}  // namespace
}  // namespace avx2
XG_TARGET_END()
#endif

namespace scalar {
namespace {
// The same chains one entry at a time (std::fma: the fused operation, in software where the
// baseline has no FMA instruction).
inline float finish(float s, float alpha, float beta, const float* y) {
  return beta == 0.0f ? alpha * s : std::fma(beta, *y, alpha * s);
}

void rows_part(std::size_t k0, std::size_t k1, std::size_t lo, std::size_t hi, const float* x, const float* W,
               std::size_t ldw, float* out) {
  for (std::size_t j = lo; j < hi; ++j) {
    float s = 0.0f;
    for (std::size_t k = k0; k < k1; ++k) s = std::fma(x[k], W[k * ldw + j], s);
    out[j - lo] = s;
  }
}

void rows(std::size_t K, std::size_t lo, std::size_t hi, float alpha, const float* x, const float* W,
          std::size_t ldw, float beta, float* y, std::size_t incy) {
  const std::size_t h = K / 2;
  for (std::size_t j = lo; j < hi; ++j) {
    float a = 0.0f, b = 0.0f;
    rows_part(0, h, j, j + 1, x, W, ldw, &a);
    rows_part(h, K, j, j + 1, x, W, ldw, &b);
    y[j * incy] = finish(a + b, alpha, beta, y + j * incy);
  }
}

void dots(std::size_t K, std::size_t lo, std::size_t hi, float alpha, const float* x, const float* W,
          std::size_t ldw, float beta, float* y, std::size_t incy) {
  const std::size_t steps = (K + 15) / 16;
  for (std::size_t j = lo; j < hi; ++j) {
    const float* w = W + j * ldw;
    float p[16] = {};
    for (std::size_t g = 0; g < steps; ++g)
      for (std::size_t l = 0; l < 16; ++l) {
        const std::size_t k = 16 * g + l;
        p[l] = k < K ? std::fma(w[k], x[k], p[l]) : std::fma(0.0f, 0.0f, p[l]);
      }
    for (std::size_t half = 8; half >= 1; half /= 2)
      for (std::size_t l = 0; l < half; ++l) p[l] = p[l] + p[l + half];
    y[j * incy] = finish(p[0], alpha, beta, y + j * incy);
  }
}
}  // namespace
}  // namespace scalar

namespace {
bool detect(Isa isa) {
  if (isa == Isa::scalar) return true;
#if XG_SGEMV_X86
  if (isa == Isa::avx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

void check(Isa isa) {
  if (!cpu_supported(isa))
    throw Error(op_message("blas::sgemv", std::string("this CPU has no ") +
                                              (isa == Isa::avx512 ? "AVX-512 (F, BW, VL, DQ)" : "AVX2 + FMA") +
                                              " instructions for xgrad's float32 matrix-vector kernel"));
}
}  // namespace

bool cpu_supported(Isa isa) {
  static const bool avx512 = detect(Isa::avx512), avx2 = detect(Isa::avx2);  // cpuid once
  return isa == Isa::scalar || (isa == Isa::avx512 ? avx512 : avx2);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    default: return "scalar";
  }
}

void rows(Isa isa, std::size_t K, std::size_t lo, std::size_t hi, float alpha, const float* x, const float* W,
          std::size_t ldw, float beta, float* y, std::size_t incy) {
  check(isa);
  if (lo >= hi) return;
#if XG_SGEMV_X86
  if (isa == Isa::avx512) return avx512::rows(K, lo, hi, alpha, x, W, ldw, beta, y, incy);
  if (isa == Isa::avx2) return avx2::rows(K, lo, hi, alpha, x, W, ldw, beta, y, incy);
#endif
  scalar::rows(K, lo, hi, alpha, x, W, ldw, beta, y, incy);
}

void rows_part(Isa isa, std::size_t k0, std::size_t k1, std::size_t lo, std::size_t hi, const float* x,
               const float* W, std::size_t ldw, float* out) {
  check(isa);
  if (lo >= hi) return;
#if XG_SGEMV_X86
  if (isa == Isa::avx512) return avx512::rows_part(k0, k1, lo, hi, x, W, ldw, out);
  if (isa == Isa::avx2) return avx2::rows_part(k0, k1, lo, hi, x, W, ldw, out);
#endif
  scalar::rows_part(k0, k1, lo, hi, x, W, ldw, out);
}

void dots(Isa isa, std::size_t K, std::size_t lo, std::size_t hi, float alpha, const float* x, const float* W,
          std::size_t ldw, float beta, float* y, std::size_t incy) {
  check(isa);
  if (lo >= hi) return;
#if XG_SGEMV_X86
  if (isa == Isa::avx512) return avx512::dots(K, lo, hi, alpha, x, W, ldw, beta, y, incy);
  if (isa == Isa::avx2) return avx2::dots(K, lo, hi, alpha, x, W, ldw, beta, y, incy);
#endif
  scalar::dots(K, lo, hi, alpha, x, W, ldw, beta, y, incy);
}

}  // namespace xg::blas::f32v
