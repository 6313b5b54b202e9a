// Internal: a cheap, opt-in time breakdown of a training step (bench_train_step --profile).
// Off by default; when off every hook is one relaxed atomic load.
//
// - Ops (core/tape.cpp): the forward time of an op is the time on the recording thread since
//   the previous record() or profile_mark() (the op's own work plus any glue before it); the
//   backward time is the time of its VJP plus passing its cotangents on. Keyed by op name.
// - GEMM (core/blas.cpp): wall time inside blas::gemm and blas::gemm_bf16 calls made outside a
//   parallel region (the matmul ops' products; the fused attention's per-block products run
//   inside the pool and count under their op instead).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace xg::detail {

struct OpTime {
  std::string op;
  double forward_ms = 0, backward_ms = 0;
  std::uint64_t forward_calls = 0, backward_calls = 0;
};

void set_profiling(bool on);
// Whether op times are being collected (set_profiling): read on every op, so inline.
extern std::atomic<bool> g_profiling;
inline bool profiling() { return g_profiling.load(std::memory_order_relaxed); }
// Restarts the forward clock of the calling thread (call before a forward pass).
void profile_mark();
// Clears every counter.
void reset_profile();
// Per op name, sorted by forward + backward time, largest first.
std::vector<OpTime> op_profile();
// Milliseconds spent inside blas::gemm (both dtypes) and blas::gemm_bf16 since reset_profile(),
// and the call count.
double gemm_profile_ms();
std::uint64_t gemm_profile_calls();
// Adds a GEMM's duration (core/blas.cpp).
void add_gemm_time(std::uint64_t ns);

}  // namespace xg::detail
