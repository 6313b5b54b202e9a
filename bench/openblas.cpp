#include "bench/openblas.hpp"

#include <cblas.h>

#include "bench/common.hpp"

namespace bench {

void set_openblas_threads(int n) { openblas_set_num_threads(n); }
int openblas_threads() { return openblas_get_num_threads(); }

std::string openblas_core() {
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

std::string openblas_config() {
  const char* c = openblas_get_config();
  return c ? c : "unknown";
}

std::vector<double> time_raw_sgemm(std::size_t n, const float* A, const float* B, std::size_t warmup, std::size_t reps,
                                   int threads) {
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  std::vector<float> C(n * n);
  const auto N = static_cast<blasint>(n);
  const std::vector<double> ms = time_reps(warmup, reps, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, A, N, B, N, 0.0f, C.data(), N);
  });
  openblas_set_num_threads(before);
  return ms;
}

void raw_sgemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t lda,
               const float* B, std::size_t ldb, float* C, std::size_t ldc) {
  const auto i = [](std::size_t v) { return static_cast<blasint>(v); };
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, i(M), i(N),
              i(K), 1.0f, A, i(lda), B, i(ldb), 0.0f, C, i(ldc));
}

}  // namespace bench
