/// \file
/// Process-wide settings. The defaults are the fast ones: nothing here needs to be called for
/// xgrad to run at full speed (docs/performance.md).
#pragma once

#include <cstddef>
#include <string>

namespace xg {

/// Sets the number `n` of xgrad's worker threads (one pool, core/parallel.hpp). Default: one
/// per core. Every parallel loop and every split GEMM uses this pool; OpenBLAS itself always
/// runs single-threaded inside it.
/// n >= 1 (ValueError otherwise). Results are bit-identical run to run for a fixed n.
void set_num_threads(int n);
/// The number of worker threads set_num_threads() configured (default: one per core).
int num_threads();

/// Ceiling for the vector instructions of the float32 matrix-product kernels (and of xgrad's
/// float64 kernel, read at the first float64 matmul): "avx2" or
/// "avx512". Default: the widest the CPU has (found at run time, whatever the build flags);
/// the environment variable XGRAD_ISA sets the same. Call it before the first float32 matmul:
/// the kernels (oneDNN's) fix their ISA then, and a different ceiling afterwards throws Error.
/// An unknown name throws ValueError. docs/performance.md, "GEMM".
void set_max_isa(const std::string& isa);
/// What float32 matrix products run on, e.g. "oneDNN avx512", "oneDNN avx2" or "OpenBLAS".
std::string float32_gemm_kernels();
/// What float64 matrix products run on: "xgrad avx512", "xgrad avx2" (xgrad's own kernel) or
/// "OpenBLAS", and why, e.g. "xgrad avx512 (OpenBLAS core Prescott has no AVX2 or AVX-512
/// dgemm kernels)". Chosen at the first float64 matmul: the own kernel where OpenBLAS runs a core
/// without AVX2/AVX-512 dgemm kernels and the CPU has AVX2 + FMA, at the ISA ceiling above, and
/// the faster of the two (measured once per CPU, the calibration cache) where both have AVX-512;
/// XGRAD_FLOAT64_GEMM=xgrad|openblas|auto (or XGRAD_KERNELS=float64_gemm=...) forces it
/// (docs/performance.md, "GEMM").
std::string float64_gemm_kernels();
/// What float32 matrix-vector products (one row or one column: batch-1 decoding) run on:
/// "xgrad avx512", "xgrad avx2", "xgrad scalar" (xgrad's own kernel) or "OpenBLAS" (its
/// sgemv), and why; chosen at the first such product: OpenBLAS where its core is an AVX2 one
/// (Haswell, Zen) or the CPU lacks AVX2 + FMA, xgrad's kernel otherwise;
/// XGRAD_FLOAT32_GEMV=xgrad|openblas|auto (or XGRAD_KERNELS=float32_gemv=...) forces it
/// (docs/performance.md, "GEMM").
std::string float32_gemv_kernels();
/// What bfloat16 products (xg::set_matmul_dtype) run on and why, e.g. "oneDNN
/// brg:avx512_core_amx_bf16 (measured at 3.41x float32)" (AMX tiles), "xgrad avx512_bf16
/// (bfloat16 dot products measured at 1.98x float32 FMAs)", or "none (<why not>)" where
/// `--dtype bfloat16` computes in float32. Chosen at the first request by a short calibration;
/// XGRAD_BF16_GEMM=auto|on|off|xgrad|onednn (or XGRAD_KERNELS=bf16_gemm=...) forces it
/// (docs/performance.md, "bfloat16").
std::string bfloat16_gemm_kernels();
/// The calibration cache: the file where the speed ratios behind the kernel choices above are
/// kept once measured, per CPU and build of xgrad, so that every process on this machine chooses
/// the same kernels (docs/performance.md, "Calibration cache"). XGRAD_CACHE_DIR/calibration-v1.txt,
/// else $XDG_CACHE_HOME/xgrad/..., else $HOME/.cache/xgrad/...; "" where XGRAD_CACHE_DIR=off
/// (every process measures again). Deleting the file makes the next process measure again.
std::string calibration_cache_path();
/// OpenBLAS's core: the kernels it runs on this CPU (openblas_get_corename()), e.g. "Haswell",
/// "SkylakeX" or "Prescott", its SSE3 fallback for a CPU model it does not know.
std::string openblas_core();
/// OpenBLAS's build configuration (openblas_get_config()), e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH ...".
std::string openblas_config();

/// Kept for programs written against earlier versions: same as set_num_threads(n).
void set_blas_threads(int n);

/// Array storage: blocks of 64 KiB and more are cached on free and reused (core/allocator.hpp),
/// so a training loop does not page-fault its working set in again every step. The cache
/// holds at most `bytes` (default: a quarter of physical memory; 0 caches nothing).
void set_memory_cache_limit(std::size_t bytes);
/// Returns every cached block to the system now.
void release_cached_memory();
/// Huge pages for large blocks, default on. Blocks of 2 MiB and more are mapped on their own at
/// a 2 MiB boundary and, while this is on, advised as transparent huge pages (madvise
/// MADV_HUGEPAGE) before their first touch: a product that streams a large matrix once, as
/// every decoding step does with the weights, then runs without a TLB miss or a prefetcher stop
/// at every 4 KiB (docs/performance.md, "Huge pages"). The kernel decides: where transparent
/// huge pages are "never" (/sys/kernel/mm/transparent_hugepage/enabled) the advice changes
/// nothing. Applies to blocks mapped from then on; a cached block keeps the advice it was mapped
/// with. Builds with AddressSanitizer take every block from malloc and advise nothing. The
/// environment variable XGRAD_HUGE_PAGES=off (or 0) turns it off, =on (or 1) on; another value
/// is a ValueError naming it, thrown by the first block of 2 MiB or by huge_pages(), until
/// set_huge_pages decides.
void set_huge_pages(bool on);
/// Whether set_huge_pages (or XGRAD_HUGE_PAGES) has huge pages on; ValueError as above.
bool huge_pages();
/// Counters of the caching allocator behind Array storage (memory_stats()).
struct MemoryStats {
  std::size_t in_use = 0;   ///< Bytes of large blocks held by live arrays.
  std::size_t peak = 0;     ///< The most in_use has been.
  std::size_t cached = 0;   ///< Bytes kept for reuse.
  std::size_t limit = 0;    ///< The cache's bound.
};
/// The caching allocator's counters now.
MemoryStats memory_stats();

/// Earlier versions tuned glibc malloc here. Array storage now comes from xgrad's own caching
/// allocator (core/allocator.hpp), which keeps freed blocks for reuse by default; this call is
/// a no-op kept for source compatibility.
void tune_allocator_for_training();

}  // namespace xg
