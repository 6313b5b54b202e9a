// Internal: the one thread pool. xgrad's own loops (elementwise kernels, reductions, the fused
// attention tiles, the splitting of large GEMMs) run on OpenMP's threads; OpenBLAS is kept at
// one thread (core/blas.cpp), so two pools never spin against each other on the same cores.
//
// parallel_for splits [0, n) into contiguous chunks, one per thread, with a partition that
// depends only on n, the grain and the thread count: results are bit-identical run to run
// for a fixed thread count (docs/performance.md says what changes with the count).
#pragma once

#include <algorithm>
#include <cstddef>
#include <exception>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace xg::detail {

// Threads a parallel_for may use (1 without OpenMP or inside a parallel region).
inline int pool_threads() {
#ifdef _OPENMP
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}

// Number of chunks parallel_for(n, grain) uses.
inline std::size_t parallel_chunks(std::size_t n, std::size_t grain) {
  const std::size_t nt = static_cast<std::size_t>(pool_threads());
  if (nt <= 1 || grain == 0 || n < 2 * grain) return 1;
  return std::min(nt, n / grain);
}

// f(begin, end, chunk) for each chunk of [0, n); chunks run in parallel. An exception thrown
// by any chunk is rethrown on the calling thread (the first chunk's, by index).
template <class F> void parallel_for(std::size_t n, std::size_t grain, F&& f) {
  const std::size_t chunks = parallel_chunks(n, grain);
  if (chunks <= 1) {
    if (n > 0) f(std::size_t{0}, n, std::size_t{0});
    return;
  }
#ifdef _OPENMP
  std::vector<std::exception_ptr> errors(chunks);
#pragma omp parallel num_threads(static_cast<int>(chunks))
  {
    const std::size_t c = static_cast<std::size_t>(omp_get_thread_num());
    if (c < chunks) {
      try {
        f(n * c / chunks, n * (c + 1) / chunks, c);
      } catch (...) {
        errors[c] = std::current_exception();
      }
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
#endif
}

}  // namespace xg::detail
