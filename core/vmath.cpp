#include <xgrad/core/detail/vmath.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX2__) && defined(__x86_64__) && defined(__GLIBC__)
#include <immintrin.h>
#define XG_LIBMVEC 1
// glibc's vector ABI names (x86_64, AVX2, 8 lanes); declared here because <math.h> exposes
// them only under -ffast-math, which xgrad does not use (it must keep NaN and inf semantics).
extern "C" {
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_erff(__m256);
}
#if defined(__AVX512F__)
// The 16-lane AVX-512 expf: the same algorithm as the 8-lane one (the same bits, which
// tests/core/test_vmath.cpp checks), 1.5x the throughput on an AVX-512 CPU. erf on 16 lanes is
// xgrad's own kernel below (libmvec's 16-lane erff was no faster than its 8-lane one).
#define XG_LIBMVEC_512 1
extern "C" __m512 _ZGVeN16v_expf(__m512);
#endif
#endif

namespace xg::vmath {

namespace {
#ifdef XG_LIBMVEC
template <__m256 (*V)(__m256), float (*S)(float)>
void apply8(const float* x, float* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, V(_mm256_loadu_ps(x + i)));
  if (i < n) {  // the tail through the same vector kernel, so every element rounds alike
    alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (std::size_t k = i; k < n; ++k) buf[k - i] = x[k];
    _mm256_store_ps(buf, V(_mm256_load_ps(buf)));
    for (std::size_t k = i; k < n; ++k) y[k] = buf[k - i];
  }
  (void)S;
}
#ifdef XG_LIBMVEC_512
void exp16(const float* x, float* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _ZGVeN16v_expf(_mm512_loadu_ps(x + i)));
  if (i < n) {  // the tail in one masked vector: every element through the same kernel
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, k, _ZGVeN16v_expf(_mm512_maskz_loadu_ps(k, x + i)));
  }
}
#endif
#else
template <float (*S)(float)> void apply1(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = S(x[i]);
}
#endif
float expf_(float v) { return std::exp(v); }
float erff_(float v) { return std::erf(v); }

#ifdef XG_LIBMVEC_512
// erf on 16 lanes, xgrad's own kernel: |x| in 16 intervals of width 1/4 over [0, 4] (above,
// erf rounds to 1: |x| is clamped to 4), on each a polynomial of degree 6 in t = |x| - i/4,
// its coefficients picked per lane by VPERMPS from one register a power; the sign of x put
// back. The first interval writes erf(x) = x + x r(x) (r from kErfC[1..6]: the small term
// rounds, x is exact), so tiny arguments keep their relative precision; the others c0 + t (c1 +
// t (... + t c6)). The coefficients are xgrad's own fit, tools/fit_erf.py (reweighted least
// squares of the error of erf itself: relative in the first interval, absolute in the others;
// the ctest tools_fit_erf_table runs it again and compares the polynomials, not the digits: the
// highest coefficients' last digits move with the CPU's LAPACK kernels, the polynomials by 1e-5
// ulp at most). Against double erf over all 2^32 float32 inputs: at most 1.08 ulp (libmvec's
// 8-lane erff: 1.93), 1.95x libmvec's speed; NaN stays NaN, erf(+-inf) = +-1, erf(-0) = -0 (bench/NOTES.md, "An own erf").
alignas(64) constexpr float kErfC[7][16] = {
    {
     0.000000000e+00f, 2.763263881e-01f, 5.204998851e-01f, 7.111556530e-01f,
     8.427007794e-01f, 9.229001403e-01f, 9.661051631e-01f, 9.866716862e-01f,
     9.953222871e-01f, 9.985373020e-01f, 9.995930195e-01f, 9.998993874e-01f,
     9.999778867e-01f, 9.999957085e-01f, 9.999992847e-01f, 9.999998808e-01f},
    {
     1.283791661e-01f, 1.060014129e+00f, 8.787825108e-01f, 6.429310441e-01f,
     4.151074588e-01f, 2.365211248e-01f, 1.189303100e-01f, 5.277501047e-02f,
     2.066699043e-02f, 7.142318878e-03f, 2.178282244e-03f, 5.862757098e-04f,
     1.392522536e-04f, 2.918871905e-05f, 5.399331258e-06f, 8.814076864e-07f},
    {
     -8.518850905e-07f, -2.650047243e-01f, -4.393888116e-01f, -4.821948409e-01f,
     -4.151056111e-01f, -2.956515849e-01f, -1.783965677e-01f, -9.235718101e-02f,
     -4.133434221e-02f, -1.607020572e-02f, -5.445585120e-03f, -1.612161868e-03f,
     -4.177076044e-04f, -9.484429029e-05f, -1.889173654e-05f, -3.303757921e-06f},
    {
     -3.760863841e-01f, -3.091403246e-01f, -1.465217620e-01f, 2.670518681e-02f,
     1.383229643e-01f, 1.675395221e-01f, 1.387790889e-01f, 9.018006176e-02f,
     4.823215678e-02f, 2.172440104e-02f, 8.347092196e-03f, 2.757949987e-03f,
     7.878397591e-04f, 1.953167521e-04f, 4.214085129e-05f, 7.929571439e-06f},
    {
     -6.881490699e-04f, 1.265982836e-01f, 1.837189198e-01f, 1.516455710e-01f,
     6.973094493e-02f, -6.187462248e-03f, -4.490546510e-02f, -4.836660251e-02f,
     -3.455453739e-02f, -1.908379421e-02f, -8.588368073e-03f, -3.229838796e-03f,
     -1.029620878e-03f, -2.807459678e-04f, -6.587860844e-05f, -1.336207515e-05f},
    {
     1.182071120e-01f, 8.261168003e-02f, 3.797709709e-03f, -5.888529122e-02f,
     -7.255561650e-02f, -4.715303332e-02f, -1.309889648e-02f, 8.211676031e-03f,
     1.377389021e-02f, 1.068059076e-02f, 5.920577794e-03f, 2.586316317e-03f,
     9.264294640e-04f, 2.778355265e-04f, 7.063816884e-05f, 1.535169758e-05f},
    {
     -1.944428682e-02f, -4.971358925e-02f, -4.111047834e-02f, -1.043192577e-02f,
     1.532581821e-02f, 2.201243676e-02f, 1.439422090e-02f, 4.155143164e-03f,
     -1.772890217e-03f, -3.093408188e-03f, -2.245554235e-03f, -1.144812792e-03f,
     -4.562235845e-04f, -1.483411470e-04f, -4.023819565e-05f, -9.228378076e-06f},
};
alignas(64) constexpr float kErfFirst[16] = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // x + x r(x)

#if defined(__GNUC__) && !defined(__clang__)  // GCC 12's _mm512_undefined_ps inside _mm512_min_ps
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
struct Erf16 {
  __m512 c[7], first;
  Erf16() {
    for (int k = 0; k < 7; ++k) c[k] = _mm512_load_ps(kErfC[k]);
    first = _mm512_load_ps(kErfFirst);
  }
  __m512 operator()(__m512 x) const {
    const __m512i sign = _mm512_set1_epi32(std::numeric_limits<std::int32_t>::min());
    const __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
    const __m512 ac = _mm512_min_ps(_mm512_set1_ps(4.0f), a);  // NaN stays NaN (min returns its second operand)
    const __m512 fl = _mm512_min_ps(_mm512_roundscale_ps(_mm512_mul_ps(ac, _mm512_set1_ps(4.0f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC),
                                    _mm512_set1_ps(15.0f));  // the interval (a NaN gives 15)
    const __m512i i = _mm512_cvttps_epi32(fl);
    const __m512 t = _mm512_fmadd_ps(fl, _mm512_set1_ps(-0.25f), ac);  // exact
    __m512 p = _mm512_permutexvar_ps(i, c[6]);
    for (int k = 5; k >= 1; --k) p = _mm512_fmadd_ps(p, t, _mm512_permutexvar_ps(i, c[k]));
    const __m512 base = _mm512_fmadd_ps(t, _mm512_permutexvar_ps(i, first), _mm512_permutexvar_ps(i, c[0]));
    const __m512 r = _mm512_fmadd_ps(p, t, base);  // >= 0
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), _mm512_and_si512(sign, _mm512_castps_si512(x))));
  }
};

void erf16(const float* x, float* y, std::size_t n) {
  const Erf16 f;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {  // the tail in one masked vector: every element through the same kernel
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, k, f(_mm512_maskz_loadu_ps(k, x + i)));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
}  // namespace

#ifdef XG_LIBMVEC
namespace {
#ifdef XG_LIBMVEC_512
constexpr int kLanes = 16;
#else
constexpr int kLanes = 8;
constexpr void (*exp16)(const float*, float*, std::size_t) = nullptr;  // no 16-lane kernels
constexpr void (*erf16)(const float*, float*, std::size_t) = nullptr;
#endif
// A float32 function on `lanes` lanes: 16 (K16, where built), 8 (libmvec's V8) or scalar libm (S).
template <void (*K16)(const float*, float*, std::size_t), __m256 (*V8)(__m256), float (*S)(float)>
void on_lanes(const float* x, float* y, std::size_t n, int lanes) {
  if constexpr (K16 != nullptr)
    if (lanes == 16) return K16(x, y, n);
  if (lanes == 8) return apply8<V8, S>(x, y, n);
  for (std::size_t i = 0; i < n; ++i) y[i] = S(x[i]);
}
}  // namespace

void exp(const float* x, float* y, std::size_t n) { on_lanes<exp16, _ZGVdN8v_expf, expf_>(x, y, n, kLanes); }
void exp_lanes(const float* x, float* y, std::size_t n, int lanes) {
  on_lanes<exp16, _ZGVdN8v_expf, expf_>(x, y, n, lanes);
}
int exp_lane_count() { return kLanes; }
void erf(const float* x, float* y, std::size_t n) { on_lanes<erf16, _ZGVdN8v_erff, erff_>(x, y, n, kLanes); }
void erf_lanes(const float* x, float* y, std::size_t n, int lanes) {
  on_lanes<erf16, _ZGVdN8v_erff, erff_>(x, y, n, lanes);
}
int erf_lane_count() { return kLanes; }
#else
void exp(const float* x, float* y, std::size_t n) { apply1<expf_>(x, y, n); }
void exp_lanes(const float* x, float* y, std::size_t n, int) { apply1<expf_>(x, y, n); }
int exp_lane_count() { return 1; }
void erf(const float* x, float* y, std::size_t n) { apply1<erff_>(x, y, n); }
void erf_lanes(const float* x, float* y, std::size_t n, int) { apply1<erff_>(x, y, n); }
int erf_lane_count() { return 1; }
#endif

void exp(const double* x, double* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}
void erf(const double* x, double* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
}

}  // namespace xg::vmath
