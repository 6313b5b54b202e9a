// Internal: vectorised elementwise math over contiguous buffers. float32 uses glibc's vector
// math library (libmvec: 8 lanes of AVX2, < 4 ulp) when the build targets AVX2, and the scalar
// libm functions otherwise; float64 always uses the scalar libm functions (exactly what the
// gradient checks compare against).
#pragma once

#include <cstddef>

namespace xg::vmath {

void exp(const float* x, float* y, std::size_t n);   // y = e^x (x == y allowed)
void exp(const double* x, double* y, std::size_t n);
void erf(const float* x, float* y, std::size_t n);
void erf(const double* x, double* y, std::size_t n);

}  // namespace xg::vmath
