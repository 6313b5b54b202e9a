#include <xgrad/core/detail/blas.hpp>

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

// Products below this many flops run as one call (splitting costs more than it saves).
constexpr double kSplitFlops = 1 << 20;

void raw_gemv(bool trans, std::size_t M, std::size_t N, float alpha, const float* A, std::size_t lda, const float* x,
              std::size_t incx, float beta, float* y, std::size_t incy) {
  cblas_sgemv(CblasRowMajor, tr(trans), bi(M), bi(N), alpha, A, bi(lda), x, bi(incx), beta, y, bi(incy));
}
void raw_gemv(bool trans, std::size_t M, std::size_t N, double alpha, const double* A, std::size_t lda,
              const double* x, std::size_t incx, double beta, double* y, std::size_t incy) {
  cblas_dgemv(CblasRowMajor, tr(trans), bi(M), bi(N), alpha, A, bi(lda), x, bi(incx), beta, y, bi(incy));
}

// y (n entries, stride incy) = alpha * op(A) x + beta * y for A row-major [rows, cols] (op(A) is
// [n, k]), split into blocks of y across the pool when large. A GEMM with one row or one column
// of C is this matrix-vector product (batch-1 decoding: one token's row times each weight):
// OpenBLAS's sgemm would pack the whole matrix on every call, sgemv streams it once. Each
// entry of y is computed by the same kernel call for a given thread count (bit-identical run
// to run). beta 0 never reads y (it is zeroed first: C may hold anything).
constexpr std::size_t kAlignGemv = 64;
// Splitting from the GEMM's threshold (1M flops, a 2 MiB float32 matrix): splitting the
// smaller per-layer products of a stories15M decoding step too (from 64K flops) was not faster
// on 2 cores in alternating runs (each split is a hand-off to a worker, about 30 per token).
constexpr double kSplitGemvFlops = kSplitFlops;

template <class T>
void split_gemv(bool trans, std::size_t rows, std::size_t cols, T alpha, const T* A, std::size_t lda, const T* x,
                std::size_t incx, T beta, T* y, std::size_t incy) {
  const std::size_t n = trans ? cols : rows, k = trans ? rows : cols;
  if (beta == T(0))
    for (std::size_t i = 0; i < n; ++i) y[i * incy] = T(0);
  const double flops = 2.0 * double(n) * double(k);
  const std::size_t threads = flops < kSplitGemvFlops ? 1 : static_cast<std::size_t>(detail::pool_threads());
  const std::size_t blocks = (n + kAlignGemv - 1) / kAlignGemv;
  const std::size_t chunks = std::min(threads, blocks);
  if (chunks <= 1) {
    raw_gemv(trans, rows, cols, alpha, A, lda, x, incx, beta, y, incy);
    return;
  }
  detail::run_chunks(chunks, [&](std::size_t c) {
    const std::size_t lo = blocks * c / chunks * kAlignGemv, hi = std::min(n, blocks * (c + 1) / chunks * kAlignGemv);
    if (lo >= hi) return;
    if (trans)  // entries lo..hi of y: columns lo..hi of A
      raw_gemv(true, rows, hi - lo, alpha, A + lo, lda, x, incx, beta, y + lo * incy, incy);
    else  // rows lo..hi of A
      raw_gemv(false, hi - lo, cols, alpha, A + lo * lda, lda, x, incx, beta, y + lo * incy, incy);
  });
}

// Splits C into row blocks (or column blocks when C is wide and short) across the pool, each
// one single-threaded GEMM. Each block of C is computed by exactly the same BLAS call for a
// given thread count: bit-identical run to run. Small products and calls from inside a pool
// chunk (the fused attention blocks) run as one call.
constexpr std::size_t kAlignRows = 16;

template <class T>
void split_gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  single_threaded();
  if (M == 1 && N > 1 && K > 0) {  // C [1, N] = row x of op(A) times op(B) [K, N]
    const std::size_t incx = ta ? lda : 1;
    if (tb)  // B is [N, K]: C^T = B x
      split_gemv(false, N, K, alpha, B, ldb, A, incx, beta, C, 1);
    else  // B is [K, N]: C^T = B^T x
      split_gemv(true, K, N, alpha, B, ldb, A, incx, beta, C, 1);
    return;
  }
  if (N == 1 && M > 1 && K > 0) {  // C [M, 1] = op(A) [M, K] times the column op(B)
    const std::size_t incx = tb ? 1 : ldb;
    if (ta)  // A is [K, M]
      split_gemv(true, K, M, alpha, A, lda, B, incx, beta, C, ldc);
    else
      split_gemv(false, M, K, alpha, A, lda, B, incx, beta, C, ldc);
    return;
  }
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
