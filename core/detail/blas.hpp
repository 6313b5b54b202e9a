// Internal: the only doorway to OpenBLAS. core/blas.cpp is the one translation unit that
// includes OpenBLAS's <cblas.h> (it clashes with xtensor-blas's xflens declarations).
// Row-major GEMM: C = alpha * op(A) op(B) + beta * C, op = transpose when the flag is set.
#pragma once

#include <cstddef>

namespace xg::blas {

void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha,
          const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
          std::size_t ldc);
void gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, double alpha,
          const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta,
          double* C, std::size_t ldc);

// OpenBLAS's own thread count: always 1 (set before the first GEMM). xgrad splits work itself.
int num_threads();

}  // namespace xg::blas
