// Internal: float32 kernels of the work between the GEMMs (issue 21, "Elementwise and optimizer
// work"), chosen at run time by the CPU's own feature flags: AVX-512 (F, BW, VL, DQ), else AVX2 +
// FMA, else plain SSE2 code. core/fused_kernels.cpp is compiled for the baseline x86-64 ISA
// whatever -march the rest of xgrad uses, and each kernel is built three times with GCC's / clang's
// target pragmas, so one binary runs on any x86-64 CPU. The ceiling set_max_isa() / XGRAD_ISA
// (core/detail/blas.hpp) caps these kernels too, so the AVX2 path can be tested on an AVX-512 CPU.
//
// Reductions keep 16 partial sums whatever the vector width, added in one fixed order, so the
// AVX-512 and AVX2 builds (both with FMA) give bit-identical results; the SSE2 build (no FMA)
// may round differently in the last bits.
#pragma once

#include <cstddef>
#include <string>

namespace xg::fused {

// "avx512", "avx2" or "sse2": the build of the kernels below that runs.
const char* kernel_isa();
// Tests: run the "avx512", "avx2" or "sse2" build from now on (one the CPU has; ValueError
// otherwise), or "" to choose by cpuid and the ceiling again. Not for concurrent use.
void force_kernel_isa(const std::string& isa);

// LayerNorm over rows of D floats (ops/layer_norm.cpp has the formulas). stats gets (mu, r) per row.
void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* stats,
                        std::size_t rows, std::size_t D, float eps);
// dx (may be null) for rows [0, rows); dgamma_beta (may be null): adds this block's sum of y_bar * xh
// to [0, D) and of y_bar to [D, 2D).
void layer_norm_backward(const float* x, const float* gamma, const float* gy, const float* stats, float* dx,
                         float* dgamma_beta, std::size_t rows, std::size_t D);

// One Adam(W) update of n elements: out = the new parameter (out may equal p), m and v in place.
struct AdamScalars {
  float lr, lr_wd, wd, beta1, one_minus_beta1, beta2, one_minus_beta2, c1, c2, eps;
  bool decoupled;
};
void adam_update(const float* p, const float* g, float* m, float* v, float* out, std::size_t n,
                 const AdamScalars& s);

}  // namespace xg::fused
