#include "core/runtime.hpp"

#include <malloc.h>

#include <string>

#include "core/error.hpp"

#include "core/parallel.hpp"

namespace xg::detail {
void set_pool_threads(int n);
int configured_pool_threads();
}  // namespace xg::detail

namespace xg {

void set_num_threads(int n) {
  if (n < 1) throw ValueError(op_message("set_num_threads", "n must be >= 1, got " + std::to_string(n)));
  detail::set_pool_threads(n);
}

int num_threads() { return detail::configured_pool_threads(); }

void set_blas_threads(int n) { set_num_threads(n); }

void tune_allocator_for_training() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace xg
