// Internal: vectorised elementwise math over contiguous buffers. float32, when the build targets
// AVX2: glibc's vector math library (libmvec: 8 lanes of AVX2, < 4 ulp), with exp on libmvec's
// 16 lanes of AVX-512 (the same bits at 1.5x the throughput) and erf on xgrad's own 16-lane
// kernel (core/vmath.cpp: at most 1.08 ulp, 1.95x the speed) when the build targets AVX-512; the
// scalar libm functions otherwise. float64 always uses the scalar libm functions (exactly what
// the gradient checks compare against).
#pragma once

#include <cstddef>

namespace xg::vmath {

void exp(const float* x, float* y, std::size_t n);   // y = e^x (x == y allowed)
void exp(const double* x, double* y, std::size_t n);
void erf(const float* x, float* y, std::size_t n);
void erf(const double* x, double* y, std::size_t n);

// Tests: the float32 exp on `lanes` lanes (16: libmvec's AVX-512 kernel where built, 8: its
// AVX2 kernel where built, anything else: scalar libm), and how many lanes exp() uses (1, 8, 16).
void exp_lanes(const float* x, float* y, std::size_t n, int lanes);
int exp_lane_count();
// Tests: the float32 erf on `lanes` lanes (16: xgrad's AVX-512 kernel where built, 8: libmvec's
// AVX2 kernel where built, anything else: scalar libm), and how many lanes erf() uses.
void erf_lanes(const float* x, float* y, std::size_t n, int lanes);
int erf_lane_count();

}  // namespace xg::vmath
