// Internal: the only doorway to the BLAS libraries. core/blas.cpp is the one translation unit
// that includes OpenBLAS's <cblas.h> (it clashes with xtensor-blas's xflens declarations) and
// oneDNN's <dnnl.h>.
// Row-major GEMM: C = alpha * op(A) op(B) + beta * C, op = transpose when the flag is set.
//
// float32 runs on oneDNN's dnnl_sgemm where xgrad was built with it (XGRAD_WITH_ONEDNN) and the
// CPU has AVX2 or AVX-512: oneDNN picks its kernels from cpuid at run time, up to the ISA
// ceiling set_max_isa() / XGRAD_ISA sets. float32 without oneDNN and the float32 matrix-vector
// products (one row or one column of C) run on OpenBLAS.
// float64 runs on xgrad's own kernel (core/detail/dgemm.hpp, AVX-512 or AVX2 up to the ceiling)
// or on OpenBLAS's dgemm, chosen once at the first float64 GEMM (dgemm_kernel()): the own
// kernel where OpenBLAS runs a core without AVX2/AVX-512 dgemm kernels (openblas_corename():
// anything but Haswell, Zen, SkylakeX, Cooperlake, SapphireRapids -- e.g. Prescott, its fallback
// for a CPU model it does not know) or only AVX2 ones on an AVX-512 CPU, and the CPU has AVX2 +
// FMA; the faster of the two, measured, where both have AVX-512 kernels (f64_measured_speedup
// below); OpenBLAS otherwise. The environment variable XGRAD_FLOAT64_GEMM=xgrad|openblas|auto
// forces it.
// Every library runs single-threaded inside xgrad's one pool (core/parallel.hpp);
// bench/NOTES.md has the measurements behind the choice (docs/performance.md, "GEMM", the rule).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace xg::blas {

void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
          const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
          std::size_t ldc);
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, double alpha,
          const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta,
          double* C, std::size_t ldc);

// The float32 GEMM backends. gemm(float) uses sgemm_backend(); sgemm_on() runs a chosen one
// with the same splitting over the pool (benchmarks and the tests of each path).
enum class Backend { openblas, onednn };
Backend sgemm_backend();
const char* backend_name(Backend b);
// Runs the float32 GEMM on `b`; throws Error if xgrad was built without it (onednn_available()).
void sgemm_on(Backend b, bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
              const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
              std::size_t ldc);
bool onednn_available();

// The vector ISA of the float32 GEMM kernels: "avx512", "avx2" (oneDNN's effective ISA, which
// is the CPU's widest up to the ceiling), or "openblas" when float32 runs on OpenBLAS.
std::string sgemm_isa();
// A kernel choice forced from the environment: by its own variable (XGRAD_FLOAT64_GEMM,
// XGRAD_FLOAT32_GEMV, XGRAD_BF16_GEMM, XGRAD_BF16_ATTENTION) or by its entry in XGRAD_KERNELS,
// which sets any of them in one variable: comma-separated name=value pairs with the names
// float64_gemm, float32_gemv, bf16_gemm and bf16_attention ("bf16_gemm=off,float32_gemv=xgrad").
// value "" when neither sets it; source names where it came from ("XGRAD_BF16_GEMM" or
// "XGRAD_KERNELS bf16_gemm"), for messages; setting() is "source=value". XGRAD_KERNELS with an
// unknown name, an entry that is not name=value, a name twice, or a value that differs from the
// one the name's own variable sets throws ValueError naming it. (Values are checked by the
// choice that reads them.)
struct ForcedKernel {
  std::string value, source;
  std::string setting() const { return source + "=" + value; }
};
ForcedKernel forced_kernel(const char* variable, const char* name);

// The CPU's widest FMA vector ISA: "avx512", "avx2" or "none" (cpuid, at run time).
std::string cpu_isa();
// Ceiling for the float32 kernels: "avx2" or "avx512" (the default: the CPU's widest). The
// environment variable XGRAD_ISA sets it too (read at the first float32 GEMM). oneDNN fixes its
// ISA at its first use: afterwards a different ceiling throws Error.
void set_max_isa(const std::string& isa);
// The vector ISA xgrad's own float32 kernels may use (core/detail/fused_kernels.hpp, the fused
// attention's tiles in nn/detail/flash_tile.hpp): cpu_isa() capped by set_max_isa() / XGRAD_ISA,
// whichever library runs the GEMMs, without fixing oneDNN's ISA. "avx512", "avx2" or "none".
std::string isa_ceiling();
// float32 GEMM calls (matrix-vector ones included) that ran on each backend so far, process-wide.
std::uint64_t sgemm_calls(Backend b);
// float32 GEMM calls split along K (C small beside K: the weight gradients of small layers; the
// partial products added in chunk order), process-wide.
std::uint64_t k_split_calls();
// float32 GEMM calls on oneDNN's AVX-512 kernels computed as their transpose (op(A) = A^T,
// op(B) = B, C at least twice as tall as wide, K at least 2 M, from 1M flops: C^T = B^T A, then
// transposed into C; a layer's weight gradient x^T dY where the layer narrows), process-wide.
std::uint64_t transposed_calls();

// bfloat16 products (xg::set_matmul_dtype): C = alpha op(A) op(B) + beta C with A and B
// rounded to bfloat16 and float32 accumulation (core/detail/bf16_gemm.hpp), split over the pool
// like the float32 GEMM. Only where bf16_available(): the CPU has AVX512_BF16, the ISA ceiling
// (XGRAD_ISA, set_max_isa) is avx512 and a kernel measured faster than float32 (or
// XGRAD_BF16_GEMM forces one); otherwise the reason, "" when available.
// Two kernels: xgrad's own (VDPBF16PS) and oneDNN's matmul primitive, which runs on AMX tiles
// where the CPU has them. bf16_kernel() is the one gemm_bf16 runs, chosen once per process:
// oneDNN where it runs on AMX and measured at least bf16::kMinSpeedup times float32, else
// xgrad's where its dot products measured so; XGRAD_BF16_GEMM=auto|on|off|xgrad|onednn.
enum class Bf16Kernel { xgrad = 0, onednn = 1 };
void gemm_bf16(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
               const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
               std::size_t ldc);
void gemm_bf16_on(Bf16Kernel k, bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
                  const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
                  std::size_t ldc);
// The decision from the calibrations' ratios (bfloat16 product rate / float32's; `amx`: oneDNN
// runs on AMX tiles here): the auto branch of the choice, apart so tests can give it both sides
// of the threshold on any CPU.
struct Bf16Choice {
  std::string unavailable;  // "" when bfloat16 products run, else why they do not
  Bf16Kernel kernel = Bf16Kernel::xgrad;
  std::string reason;       // why this kernel
};
Bf16Choice bf16_decision(bool amx, double onednn_speedup, double dot_speedup);
bool bf16_available();
std::string bf16_unavailable_reason();
Bf16Kernel bf16_kernel();          // meaningful where bf16_available()
std::string bf16_kernel_reason();  // why that kernel, one phrase
const char* bf16_kernel_name(Bf16Kernel k);  // "xgrad avx512_bf16" or "oneDNN"
// gemm_bf16 calls so far, process-wide: all, and per kernel.
std::uint64_t bf16_calls();
std::uint64_t bf16_calls(Bf16Kernel k);
// xgrad's bfloat16 products run as two fixed halves of K (K at least 512 and twice both M and
// N, 2 M N K at least the split threshold of 2^20 flops: weight gradients; the bits do not
// depend on the thread count), process-wide.
std::uint64_t bf16_k_halves_calls();

// The float64 GEMM kernels. gemm(double) runs dgemm_kernel(); dgemm_on() runs a chosen one with
// the same splitting over the pool (benchmarks and the tests of each path). The own kernel
// takes every shape (matrix-vector products too) and its bits do not depend on the thread count
// or the ISA (core/detail/dgemm.hpp); OpenBLAS's are fixed for a given thread count only.
enum class F64Kernel { openblas, xgrad_avx2, xgrad_avx512 };
// Chosen at the first call (rule above); XGRAD_FLOAT64_GEMM with another value than xgrad,
// openblas or auto throws ValueError, =xgrad on a CPU without AVX2 + FMA throws Error.
F64Kernel dgemm_kernel();
// Why dgemm_kernel() was chosen, one phrase (e.g. "OpenBLAS core Prescott has no AVX2 or
// AVX-512 dgemm kernels").
std::string dgemm_reason();
// On an AVX-512 CPU whose OpenBLAS core has AVX-512 dgemm kernels (SkylakeX, Cooperlake,
// SapphireRapids) the choice is measured: xgrad's AVX-512 kernel against OpenBLAS's dgemm on one
// thread, a 256 x 256 x 256 product each (f64_measured_speedup: OpenBLAS's time over xgrad's),
// once per CPU and build (the calibration cache, "float64_gemm_xgrad_avx512"); xgrad's kernel
// where the ratio is at least kF64MinSpeedup. f64_calibrated_speedup() is the ratio the choice
// used, 0 where the rule needed none.
constexpr double kF64MinSpeedup = 1.0;
double f64_measured_speedup();
double f64_calibrated_speedup();
const char* f64_kernel_name(F64Kernel k);  // "OpenBLAS", "xgrad avx2", "xgrad avx512"
bool f64_kernel_available(F64Kernel k);    // the CPU has its instructions
// Runs the float64 GEMM on `k`; throws Error if !f64_kernel_available(k).
void dgemm_on(F64Kernel k, bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, double alpha,
              const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta, double* C,
              std::size_t ldc);
// float64 GEMM calls (through gemm(double) or dgemm_on) that ran on each kernel so far.
std::uint64_t dgemm_calls(F64Kernel k);

// The float32 matrix-vector products (one row or one column of C, K > 0: batch-1 decoding's
// products): xgrad's own kernel (core/detail/sgemv.hpp: AVX-512, AVX2 + FMA, or a scalar
// fallback) or OpenBLAS's sgemv, chosen once at the first such product: OpenBLAS where the CPU
// has no AVX2 + FMA, or OpenBLAS runs one of its AVX2 cores (Haswell, Zen) on an AVX-512 CPU
// (measured faster on AMD Zen 5); the own kernel at the ISA ceiling otherwise (on AVX2 CPUs its
// streamed form, measured faster on AMD Zen 1). XGRAD_FLOAT32_GEMV=xgrad|openblas|auto
// forces it (xgrad on a CPU without AVX2 + FMA: the scalar fallback). gemm(float) sends every
// matrix-vector product to sgemv_kernel(). The own kernel's products are split over the pool
// from 64K flops: by output blocks, and those of the rows form (W [K, N]) also into their two
// halves of K; an entry's bits depend on K alone (not on the thread count, the split or the
// ISA); OpenBLAS's (sgemm_on's splitting, from 1M flops) on the thread count.
enum class GemvKernel { openblas, xgrad_scalar, xgrad_avx2, xgrad_avx512 };
// Chosen at the first call; XGRAD_FLOAT32_GEMV with another value than xgrad, openblas or auto
// throws ValueError.
GemvKernel sgemv_kernel();
std::string sgemv_reason();  // why, one phrase
const char* gemv_kernel_name(GemvKernel k);  // "OpenBLAS", "xgrad scalar", "xgrad avx2", "xgrad avx512"
bool gemv_kernel_available(GemvKernel k);    // the CPU has its instructions
// The matrix-vector product C = alpha op(A) op(B) + beta C (M = 1 or N = 1, not both, K > 0:
// ValueError otherwise) on `k` (Error if !gemv_kernel_available(k)); openblas is the doorway's
// old path (OpenBLAS's sgemv split over the pool, as sgemm_on(Backend::openblas)).
void sgemv_on(GemvKernel k, bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
              const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
              std::size_t ldc);
// Matrix-vector products (gemm or sgemv_on) that ran on each kernel so far, process-wide.
std::uint64_t sgemv_calls(GemvKernel k);
// Own-kernel pool hand-offs that ran products of the rows form (W [K, N]) as two halves of K on
// two threads each (core/detail/sgemv.hpp), so far, process-wide.
std::uint64_t gemv_rows_halves_calls();
// y_i [N_i] = x [K] W_i for weights W_i [K, N_i] (row-major, contiguous) sharing x, on
// sgemv_kernel(): with the own kernel as one pool hand-off (the halves of K of all products, and
// their outputs, dealt to the chunks together; each y_i bit for bit what gemm(1, N_i, K)
// gives), else one product after the other (decoding's gate and up projections of a SwiGLU
// feed-forward).
struct RowProduct {
  const float* W;
  std::size_t N;
  float* y;
};
void row_products(const float* x, std::size_t K, const RowProduct* ps, std::size_t count);
std::uint64_t row_products_calls();  // row_products calls so far, process-wide

// What OpenBLAS says of itself: openblas_get_corename() (the kernels it runs on this CPU) and
// openblas_get_config().
std::string openblas_corename();
std::string openblas_config();

// OpenBLAS's own thread count: always 1 (set before the first GEMM). xgrad splits work itself.
int num_threads();

}  // namespace xg::blas
