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
// The ISA ceiling in effect: the CPU's widest ("avx512", "avx2" or "none") capped by
// set_max_isa() / XGRAD_ISA, whichever library runs the GEMMs (the fused attention's own tile
// kernels choose by it, nn/detail/flash_tile.hpp).
std::string isa_ceiling();
// The CPU's widest FMA vector ISA: "avx512", "avx2" or "none" (cpuid, at run time).
std::string cpu_isa();
// Ceiling for the float32 kernels: "avx2" or "avx512" (the default: the CPU's widest). The
// environment variable XGRAD_ISA sets it too (read at the first float32 GEMM). oneDNN fixes its
// ISA at its first use: afterwards a different ceiling throws Error.
void set_max_isa(const std::string& isa);
// float32 GEMM calls (matrix-vector ones included) that ran on each backend so far, process-wide.
std::uint64_t sgemm_calls(Backend b);

// OpenBLAS's own thread count: always 1 (set before the first GEMM). xgrad splits work itself.
int num_threads();

}  // namespace xg::blas
