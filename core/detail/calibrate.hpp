// Internal: the timing behind the kernel choices made by measured capability (the bfloat16
// products on oneDNN, core/bf16_onednn.cpp; the fused attention's AMX tiles, nn/flash_tile.cpp).
#pragma once

#include <algorithm>
#include <chrono>

namespace xg::detail {

// How many times faster `candidate` runs than `base` on the calling thread: each run once to
// warm up, then three alternating rounds, each the fastest of `reps` runs of either; the fastest
// round of each counts (a busy machine only slows a round down). Returns base / candidate.
template <class Base, class Candidate> double measured_speedup(Base&& base, Candidate&& candidate, int reps) {
  const auto fastest = [reps](auto& f) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  base();
  candidate();
  double t_base = 1e30, t_candidate = 1e30;
  for (int round = 0; round < 3; ++round) {
    t_base = std::min(t_base, fastest(base));
    t_candidate = std::min(t_candidate, fastest(candidate));
  }
  return t_candidate > 0 ? t_base / t_candidate : 0.0;
}

}  // namespace xg::detail
