#include <xgrad/core/detail/vmath.hpp>

#include <cmath>

#if defined(__AVX2__) && defined(__x86_64__) && defined(__GLIBC__)
#include <immintrin.h>
#define XG_LIBMVEC 1
// glibc's vector ABI names (x86_64, AVX2, 8 lanes); declared here because <math.h> exposes
// them only under -ffast-math, which xgrad does not use (it must keep NaN and inf semantics).
extern "C" {
__m256 _ZGVdN8v_expf(__m256);
__m256 _ZGVdN8v_erff(__m256);
}
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
#else
template <float (*S)(float)> void apply1(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = S(x[i]);
}
#endif
float expf_(float v) { return std::exp(v); }
float erff_(float v) { return std::erf(v); }
}  // namespace

#ifdef XG_LIBMVEC
void exp(const float* x, float* y, std::size_t n) { apply8<_ZGVdN8v_expf, expf_>(x, y, n); }
void erf(const float* x, float* y, std::size_t n) { apply8<_ZGVdN8v_erff, erff_>(x, y, n); }
#else
void exp(const float* x, float* y, std::size_t n) { apply1<expf_>(x, y, n); }
void erf(const float* x, float* y, std::size_t n) { apply1<erff_>(x, y, n); }
#endif

void exp(const double* x, double* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}
void erf(const double* x, double* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = std::erf(x[i]);
}

}  // namespace xg::vmath
