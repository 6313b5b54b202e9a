#include "core/runtime.hpp"

#include <malloc.h>

#include "core/blas.hpp"

namespace xg {

void tune_allocator_for_training() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
}

void set_blas_threads(int n) { blas::set_num_threads(n); }

}  // namespace xg
