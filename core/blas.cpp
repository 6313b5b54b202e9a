#include "core/blas.hpp"

#include <cblas.h>

#include <mutex>

namespace xg::blas {

namespace {
CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }
blasint bi(std::size_t v) { return static_cast<blasint>(v); }
// OpenBLAS runs single-threaded: parallelism comes from xgrad's one pool (core/parallel.hpp),
// which splits large GEMMs itself. Two pools on the same cores spin against each other.
void single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}
}  // namespace

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
          const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
          std::size_t ldc) {
  single_threaded();
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha,
          const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta,
          double* C, std::size_t ldc) {
  single_threaded();
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}

int num_threads() {
  single_threaded();
  return openblas_get_num_threads();
}

}  // namespace xg::blas
