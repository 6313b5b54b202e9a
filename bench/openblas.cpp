#include "bench/openblas.hpp"

#include <cblas.h>

namespace bench {

void set_openblas_threads(int n) { openblas_set_num_threads(n); }
int openblas_threads() { return openblas_get_num_threads(); }

void raw_sgemm(std::size_t n, const float* A, const float* B, float* C) {
  const auto N = static_cast<blasint>(n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, A, N, B, N, 0.0f, C, N);
}

}  // namespace bench
