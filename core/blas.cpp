#include <xgrad/core/blas.hpp>

#include <cblas.h>

#include <algorithm>
#include <mutex>

#include <xgrad/core/parallel.hpp>

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

void raw(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
         std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}
void raw(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha, const double* A,
         std::size_t lda, const double* B, std::size_t ldb, double beta, double* C, std::size_t ldc) {
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}

// Splits C into row blocks (or column blocks when C is wide and short) across the pool, each
// one single-threaded GEMM. Each block of C is computed by exactly the same BLAS call for a
// given thread count: bit-identical run to run. Small products and calls from inside a pool
// chunk (the fused attention blocks) run as one call.
constexpr double kSplitFlops = 1 << 20;
constexpr std::size_t kAlignRows = 16;

template <class T>
void split_gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  single_threaded();
  const double flops = 2.0 * double(M) * double(N) * double(K);
  const std::size_t threads = flops < kSplitFlops ? 1 : static_cast<std::size_t>(detail::pool_threads());
  const bool by_rows = M >= N;
  const std::size_t extent = by_rows ? M : N;
  const std::size_t blocks = (extent + kAlignRows - 1) / kAlignRows;
  const std::size_t chunks = std::min(threads, blocks);
  if (chunks <= 1) {
    raw(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  detail::run_chunks(chunks, [&](std::size_t c) {
    const std::size_t b0 = blocks * c / chunks, b1 = blocks * (c + 1) / chunks;
    const std::size_t lo = b0 * kAlignRows, hi = std::min(extent, b1 * kAlignRows);
    if (lo >= hi) return;
    if (by_rows)  // rows lo..hi of C = rows of op(A)
      raw(ta, tb, hi - lo, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    else  // columns lo..hi of C = columns of op(B)
      raw(ta, tb, M, hi - lo, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
  });
}

}  // namespace

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
          const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
          std::size_t ldc) {
  split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha,
          const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta,
          double* C, std::size_t ldc) {
  split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

int num_threads() {
  single_threaded();
  return openblas_get_num_threads();
}

}  // namespace xg::blas
