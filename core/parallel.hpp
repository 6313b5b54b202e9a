/// \file
/// Internal: the one thread pool. xgrad's own loops (elementwise kernels, reductions, the fused
/// attention blocks, the splitting of large GEMMs) run on it; OpenBLAS is kept at one thread
/// (core/blas.cpp), so two pools never spin against each other on the same cores.
///
/// Workers spin for a few tens of microseconds after a job (the next op usually follows at
/// once), then sleep on a condition variable: on a loaded or oversubscribed machine (ctest -j,
/// other programs) a waiting thread never burns a core that the thread it waits for needs.
/// The calling thread runs chunk 0, then any chunk no worker has started yet (chunks are
/// claimed from one counter), so it never waits for a sleeping or descheduled worker to begin.
///
/// parallel_for splits [0, n) into contiguous chunks, one per thread, with a partition that
/// depends only on n, the grain and the thread count: results are bit-identical run to run
/// for a fixed thread count (docs/performance.md says what changes with the count).
#pragma once

#include <cstddef>
#include <functional>

namespace xg::detail {

/// Threads a parallel_for may use now (1 inside a parallel_for, or while another thread
/// holds the pool).
int pool_threads();

/// True on a thread while it runs a chunk of a parallel_for / run_chunks.
bool in_parallel_region();

/// Number of chunks parallel_for(n, grain) uses.
std::size_t parallel_chunks(std::size_t n, std::size_t grain);

/// Runs job(c) for c in [0, chunks) on the pool (chunk 0 on the calling thread; any other chunk
/// on a worker or, if no worker has started it, on the calling thread too) and waits. An
/// exception thrown by a chunk is rethrown on the caller (the lowest chunk's).
void run_chunks(std::size_t chunks, const std::function<void(std::size_t)>& job);

/// run_chunks with any number of chunks (more than the threads: the threads claim them one at a
/// time, so a thread that runs faster, or starts sooner, takes more of them). For work whose
/// chunks are independent and whose results do not depend on which thread runs a chunk.
void run_chunks_balanced(std::size_t chunks, const std::function<void(std::size_t)>& job);

/// f(begin, end, chunk) for each chunk of [0, n); chunks run in parallel.
template <class F> void parallel_for(std::size_t n, std::size_t grain, F&& f) {
  // A range under two grains is one chunk: decided here, without a call (tiny ops stay cheap).
  const std::size_t chunks = grain == 0 || n < 2 * grain ? 1 : parallel_chunks(n, grain);
  if (chunks <= 1) {
    if (n > 0) f(std::size_t{0}, n, std::size_t{0});
    return;
  }
  run_chunks(chunks, [&](std::size_t c) { f(n * c / chunks, n * (c + 1) / chunks, c); });
}

}  // namespace xg::detail
