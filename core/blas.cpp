#include "core/blas.hpp"

#include <cblas.h>

namespace xg::blas {

namespace {
CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }
blasint bi(std::size_t v) { return static_cast<blasint>(v); }
}  // namespace

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
          const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
          std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha,
          const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta,
          double* C, std::size_t ldc) {
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}

void set_num_threads(int n) { openblas_set_num_threads(n); }
int num_threads() { return openblas_get_num_threads(); }

}  // namespace xg::blas
