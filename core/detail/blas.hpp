// Internal: the only doorway to the BLAS libraries. core/blas.cpp is the one translation unit
// that includes OpenBLAS's <cblas.h> (it clashes with xtensor-blas's xflens declarations) and
// oneDNN's <dnnl.h>.
// Row-major GEMM: C = alpha * op(A) op(B) + beta * C, op = transpose when the flag is set.
//
// float32 runs on oneDNN's dnnl_sgemm where xgrad was built with it (XGRAD_WITH_ONEDNN) and the
// CPU has AVX2 or AVX-512: oneDNN picks its kernels from cpuid at run time, up to the ISA
// ceiling set_max_isa() / XGRAD_ISA sets. Everything else runs on OpenBLAS: float64 always (the
// gradient checks' results stay what they were), float32 without oneDNN, and the matrix-vector
// products (one row or one column of C). Both libraries run single-threaded inside xgrad's one
// pool (core/parallel.hpp); docs/performance.md has the measurements behind the choice.
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

// bfloat16 products (xg::set_matmul_dtype): C = alpha op(A) op(B) + beta C with A and B
// rounded to bfloat16 and float32 accumulation (core/detail/bf16_gemm.hpp), split over the pool
// like the float32 GEMM. Only where bf16_available(): the CPU has AVX512_BF16 and the ISA
// ceiling (XGRAD_ISA, set_max_isa) is avx512; otherwise the reason, "" when available.
void gemm_bf16(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
               const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
               std::size_t ldc);
bool bf16_available();
std::string bf16_unavailable_reason();
// gemm_bf16 calls so far, process-wide.
std::uint64_t bf16_calls();

// OpenBLAS's own thread count: always 1 (set before the first GEMM). xgrad splits work itself.
int num_threads();

}  // namespace xg::blas
