// Direct OpenBLAS calls for the benchmarks: its own thread count and a raw sgemm, the
// baseline bench_matmul compares xgrad's matmul with. Only bench/openblas.cpp includes
// <cblas.h>, so the programs' own translation units never see it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace bench {

void set_openblas_threads(int n);
// openblas_get_corename() (the kernels OpenBLAS runs on this CPU) and openblas_get_config().
std::string openblas_core();
std::string openblas_config();
int openblas_threads();

// Times C = A B for n x n row-major float32 matrices, one cblas_sgemm call per rep, with
// OpenBLAS's own `threads` threads; its thread setting is put back afterwards. Milliseconds.
std::vector<double> time_raw_sgemm(std::size_t n, const float* A, const float* B, std::size_t warmup, std::size_t reps,
                                   int threads);

// One row-major cblas_sgemm call, C = op(A) op(B) (beta 0), on OpenBLAS's current thread count
// (bench_gemm_options, with set_openblas_threads around it).
void raw_sgemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t lda,
               const float* B, std::size_t ldb, float* C, std::size_t ldc);

}  // namespace bench
