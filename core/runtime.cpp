#include "core/runtime.hpp"

#include <malloc.h>

#include <string>

#include "core/error.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace xg {

void set_num_threads(int n) {
  if (n < 1) throw ValueError(op_message("set_num_threads", "n must be >= 1, got " + std::to_string(n)));
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
}

int num_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_blas_threads(int n) { set_num_threads(n); }

void tune_allocator_for_training() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace xg
