// The float32 kernels of core/detail/fused_kernels.hpp, built for AVX-512, AVX2 + FMA and the
// x86-64 baseline in one translation unit (this file is compiled for the baseline; see
// CMakeLists.txt), the build chosen at run time from cpuid and the ISA ceiling.
#include <xgrad/core/detail/fused_kernels.hpp>

#include <atomic>
#include <cmath>
#include <string>

#include <xgrad/core/error.hpp>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/isa_target.hpp>

namespace xg::fused {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define XG_FUSED_MULTI_ISA 1
XG_TARGET_BEGIN(XG_ISA_AVX512)
namespace avx512 {
#include "detail/fused_kernels.inc"
}  // namespace avx512
XG_TARGET_END()
XG_TARGET_BEGIN(XG_ISA_AVX2)
namespace avx2 {
#include "detail/fused_kernels.inc"
}  // namespace avx2
XG_TARGET_END()
#endif

namespace base {
#include "detail/fused_kernels.inc"
}  // namespace base

namespace {

enum class Isa { avx512, avx2, base };

std::atomic<int> g_forced{-1};  // force_kernel_isa: an Isa, or -1

Isa isa() {
  const int f = g_forced.load(std::memory_order_relaxed);
  if (f >= 0) return static_cast<Isa>(f);
#ifdef XG_FUSED_MULTI_ISA
  const std::string c = blas::isa_ceiling();  // cpuid, capped by set_max_isa / XGRAD_ISA
  if (c == "avx512") return Isa::avx512;
  if (c == "avx2") return Isa::avx2;
#endif
  return Isa::base;
}

}  // namespace

#ifdef XG_FUSED_MULTI_ISA
#define XG_DISPATCH(call)      \
  switch (isa()) {             \
    case Isa::avx512:          \
      return avx512::call;     \
    case Isa::avx2:            \
      return avx2::call;       \
    default:                   \
      return base::call;       \
  }
#else
#define XG_DISPATCH(call) return base::call;
#endif

void force_kernel_isa(const std::string& name) {
  if (name.empty()) {
    g_forced = -1;
    return;
  }
  const std::string cpu = blas::cpu_isa();
  Isa want;
  if (name == "avx512" && cpu == "avx512")
    want = Isa::avx512;
  else if (name == "avx2" && (cpu == "avx512" || cpu == "avx2"))
    want = Isa::avx2;
  else if (name == "sse2")
    want = Isa::base;
  else
    throw ValueError(op_message("force_kernel_isa", "'" + name + "' is not one of this CPU's builds (cpu: " + cpu + ")"));
#ifndef XG_FUSED_MULTI_ISA
  want = Isa::base;
#endif
  g_forced = static_cast<int>(want);
}

const char* kernel_isa() {
  switch (isa()) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    default:
      return "sse2";
  }
}

void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* stats,
                        std::size_t rows, std::size_t D, float eps) {
  XG_DISPATCH(layer_norm_forward(x, gamma, beta, y, stats, rows, D, eps))
}

void layer_norm_backward(const float* x, const float* gamma, const float* gy, const float* stats, float* dx,
                         float* dgamma_beta, std::size_t rows, std::size_t D) {
  XG_DISPATCH(layer_norm_backward(x, gamma, gy, stats, dx, dgamma_beta, rows, D))
}

void adam_update(const float* p, const float* g, float* m, float* v, float* out, std::size_t n,
                 const AdamScalars& s) {
  XG_DISPATCH(adam_update(p, g, m, v, out, n, s))
}

}  // namespace xg::fused
