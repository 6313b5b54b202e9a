/// \file
/// Internal: the one thread pool. xgrad's own loops (elementwise kernels, reductions, the fused
/// attention blocks, the splitting of large GEMMs) run on it; OpenBLAS is kept at one thread
/// (core/blas.cpp), so two pools never spin against each other on the same cores.
///
/// Workers spin for a few tens of microseconds after a job (the next op usually follows at
/// once), then sleep on a condition variable: on a loaded or oversubscribed machine (ctest -j,
/// other programs) a waiting thread never burns a core that the thread it waits for needs.
/// A job's chunks are cut into one contiguous range per thread (the caller's first): each thread
/// runs its own range from the front, then takes the chunks not yet started from the back of
/// the others'. The same partition from one op to the next keeps a thread on the rows it wrote
/// itself, and the calling thread never waits for a sleeping, descheduled or slower worker to
/// start or finish work it could do itself.
///
/// parallel_for splits [0, n) into contiguous chunks, kChunksPerThread per thread where the
/// grain allows, with a partition that depends only on n, the grain and the thread count:
/// results are bit-identical run to run for a fixed thread count (docs/performance.md says what
/// changes with the count). On a shared 2-core host the second thread runs a chunk 5-20% slower
/// than the caller or starts it late (bench/NOTES.md): with several chunks a thread, the caller
/// takes the other's last ones instead of waiting for them.
#pragma once

#include <cstddef>
#include <functional>

namespace xg::detail {

/// Threads a parallel_for may use now (1 inside a parallel_for, or while another thread
/// holds the pool).
int pool_threads();

/// True on a thread while it runs a chunk of a parallel_for / run_chunks.
bool in_parallel_region();

/// Chunks per thread parallel_for cuts a range into (each at least `grain` long).
constexpr std::size_t kChunksPerThread = 4;

/// Number of chunks parallel_for(n, grain, ..., per_thread) uses: 1 under two grains or on one
/// thread, else min(per_thread * threads, n / grain).
std::size_t parallel_chunks(std::size_t n, std::size_t grain, std::size_t per_thread = kChunksPerThread);

/// Runs job(c) for c in [0, chunks) on the pool (chunk 0 first, on the calling thread; see the
/// file comment for who runs the others) and waits. An exception thrown by a chunk is rethrown
/// on the caller (the lowest chunk's). Inside a chunk, or on one thread, the chunks run in order
/// on the caller. Any number of chunks: with more than the threads, the thread ahead takes more.
void run_chunks(std::size_t chunks, const std::function<void(std::size_t)>& job);

/// f(begin, end, chunk) for each chunk of [0, n) (parallel_chunks(n, grain, per_thread) of
/// them); chunks run in parallel. per_thread 1 where each chunk keeps a large partial result
/// (a chunk's share of a sum over rows that the caller then adds up).
template <class F>
void parallel_for(std::size_t n, std::size_t grain, F&& f, std::size_t per_thread = kChunksPerThread) {
  // A range under two grains is one chunk: decided here, without a call (tiny ops stay cheap).
  const std::size_t chunks = grain == 0 || n < 2 * grain ? 1 : parallel_chunks(n, grain, per_thread);
  if (chunks <= 1) {
    if (n > 0) f(std::size_t{0}, n, std::size_t{0});
    return;
  }
  run_chunks(chunks, [&](std::size_t c) { f(n * c / chunks, n * (c + 1) / chunks, c); });
}

}  // namespace xg::detail
