// The CPU's floating-point peak, measured (issue 21, docs/performance.md "Peak and % of peak"):
// a loop of independent fused multiply-adds with the widest vectors the CPU has (AVX-512 where
// avx512f, else AVX2 + FMA; chosen at run time from cpuid), and the bf16 dot-product peak
// (vdpbf16ps) where avx512_bf16 exists. Every bench program measures it briefly in the same run
// and prints its own achieved GFLOP/s as a share of it. Includes neither xgrad nor libtorch.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace bench {

// Runs job(c) for c in [0, threads) at the same time and waits; the default (empty) runs them on
// std::threads. xgrad's programs pass xgrad's own pool (core/parallel.hpp).
using RunThreads = std::function<void(std::size_t threads, const std::function<void(std::size_t)>& job)>;

struct Peak {
  std::string isa;          // "avx512" or "avx2" (or "scalar" on a CPU without FMA)
  double fp32_gflops = 0;   // fused multiply-adds, all `threads` threads together
  double bf16_gflops = 0;   // vdpbf16ps; 0 where the CPU lacks avx512_bf16
  int threads = 1;
};

// The widest fp32 FMA vector ISA of this CPU: "avx512", "avx2" or "scalar".
std::string widest_isa();
bool has_avx512_bf16();

// Measures for about `seconds` per figure (the best of a few slices, so a descheduled slice does
// not count). `isa` empty: the widest; "avx2" forces the 256-bit kernel.
Peak measure_peak(int threads, double seconds = 0.05, const RunThreads& run = {}, const std::string& isa = {});

// The peak for the share of a timed piece of work: `before` (measure_peak before the work) and a
// second measurement now, on the same threads and vectors, the larger of each figure kept. A
// host that takes a core away for a second or more makes one measurement low (the KVM guests of
// docs/performance.md: the two-thread peak at half, and a share printed at 158%); it seldom does
// so at both ends of the work. Prints a line saying so when the two fp32 figures differ by more
// than 15%.
Peak peak_around(const Peak& before, const RunThreads& run = {});

// GB/s of reading `bytes` (whole 64-byte lines) split over `threads` threads at once, the speed
// that bounds work which reads each of those bytes once (decoding reads every weight once a
// token): a buffer of that size on 2 MiB pages where the kernel allows (as xgrad's packed
// parameters), written once, then read with the widest vector loads, each thread its own
// contiguous part; calibrated to about `seconds` a slice, the best of 3 slices. 0 for a size
// under one line per thread.
double measure_read_bandwidth(int threads, std::size_t bytes, double seconds = 0.05, const RunThreads& run = {});

// "peak (fp32 FMA, avx512, 2 threads, measured now): X GFLOP/s" and then
// "achieved: Y GFLOP/s = Z% of peak" for `achieved_gflops`.
void print_peak_share(const Peak& peak, double achieved_gflops);
// Measures the peak briefly (0.05 s slices) on `before`'s threads and vectors, keeps the larger
// of it and `before` (peak_around) and prints both lines.
void print_peak_share_around(const Peak& before, double achieved_gflops, const RunThreads& run = {});

}  // namespace bench
