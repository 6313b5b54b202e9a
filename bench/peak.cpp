#include "bench/peak.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include <sys/mman.h>

#include "bench/common.hpp"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define BENCH_X86 1
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector that
// -Wuninitialized then reports inside the header (GCC bug 105593; as in nn/flash_tile.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

namespace bench {

namespace {

#if BENCH_X86
// Independent accumulator chains, more than FMA latency x FMA ports (4 x 2 on current cores), so
// the loop is bound by FMA throughput alone. The multiplier below 1 keeps the values bounded.
constexpr int kChains512 = 16, kChains256 = 12, kChainsBf16 = 16;

__attribute__((target("avx512f"))) float fma_loop_avx512(std::uint64_t iters) {
  __m512 acc[kChains512];
  for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_set1_ps(0.001f * float(k));
  const __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  for (std::uint64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kChains512; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  __m512 s = acc[0];
  for (int k = 1; k < kChains512; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}
constexpr double kFlops512 = kChains512 * 16 * 2;  // per iteration

__attribute__((target("avx2,fma"))) float fma_loop_avx2(std::uint64_t iters) {
  __m256 acc[kChains256];
  for (int k = 0; k < kChains256; ++k) acc[k] = _mm256_set1_ps(0.001f * float(k));
  const __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  for (std::uint64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kChains256; ++k) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
  __m256 s = acc[0];
  for (int k = 1; k < kChains256; ++k) s = _mm256_add_ps(s, acc[k]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}
constexpr double kFlops256 = kChains256 * 8 * 2;

// vdpbf16ps: 16 lanes, each a dot product of 2 bf16 pairs added to an fp32 lane: 64 flops.
__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(std::uint64_t iters) {
  __m512 acc[kChainsBf16];
  for (int k = 0; k < kChainsBf16; ++k) acc[k] = _mm512_set1_ps(0.001f * float(k));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (std::uint64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kChainsBf16; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  __m512 s = acc[0];
  for (int k = 1; k < kChainsBf16; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}
constexpr double kFlopsBf16 = kChainsBf16 * 16 * 4;
#endif

volatile float g_sink = 0;  // keeps the loops' results alive

// The sum of `lines` 64-byte lines of floats at p (aligned to 64): four independent chains of
// vector adds, so the loop is bound by the loads.
#if BENCH_X86
__attribute__((target("avx512f"))) float read_lines_avx512(const float* p, std::size_t lines) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 4 <= lines; i += 4) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + 16 * i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + 16 * i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + 16 * i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + 16 * i + 48));
  }
  for (; i < lines; ++i) a0 = _mm512_add_ps(a0, _mm512_load_ps(p + 16 * i));
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
__attribute__((target("avx2"))) float read_lines_avx2(const float* p, std::size_t lines) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 2 <= lines; i += 2) {  // two lines, four 32-byte loads
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + 16 * i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + 16 * i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + 16 * i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + 16 * i + 24));
  }
  if (i < lines) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + 16 * i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + 16 * i + 8));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float t = 0;
  for (float v : out) t += v;
  return t;
}
#endif
float read_lines_scalar(const float* p, std::size_t lines) {
  float t[16] = {};
  for (std::size_t i = 0; i < lines; ++i)
    for (int k = 0; k < 16; ++k) t[k] += p[16 * i + k];
  float s = 0;
  for (float v : t) s += v;
  return s;
}

void run_std_threads(std::size_t threads, const std::function<void(std::size_t)>& job) {
  std::vector<std::thread> ts;
  for (std::size_t c = 1; c < threads; ++c) ts.emplace_back(job, c);
  job(0);
  for (auto& t : ts) t.join();
}

// GFLOP/s of `loop` (flops_per_iter per iteration) on `threads` threads at once: calibrated to
// about `seconds` per slice, the best of 3 slices.
double measure(float (*loop)(std::uint64_t), double flops_per_iter, int threads, double seconds,
               const RunThreads& run) {
  using clock = std::chrono::steady_clock;
  const auto once = [&](std::uint64_t iters) {
    const auto t0 = clock::now();
    run(static_cast<std::size_t>(threads), [&](std::size_t) { g_sink = g_sink + loop(iters); });
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  std::uint64_t iters = 1 << 14;
  double t = once(iters);
  while (t < seconds / 8 && iters < (std::uint64_t{1} << 40)) {
    iters *= 4;
    t = once(iters);
  }
  iters = std::max<std::uint64_t>(1, static_cast<std::uint64_t>(double(iters) * seconds / std::max(t, 1e-9)));
  double best = 0;
  for (int s = 0; s < 3; ++s) best = std::max(best, flops_per_iter * double(iters) * threads / once(iters) * 1e-9);
  return best;
}

}  // namespace

std::string widest_isa() {
#if BENCH_X86
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#endif
  return "scalar";
}

bool has_avx512_bf16() {
#if BENCH_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__builtin_cpu_supports("avx512f") || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1u;  // CPUID.(EAX=7,ECX=1):EAX[5] AVX512_BF16
#else
  return false;
#endif
}

Peak measure_peak(int threads, double seconds, const RunThreads& run_in, const std::string& isa) {
  const RunThreads run = run_in ? run_in : RunThreads(run_std_threads);
  Peak p;
  p.threads = threads;
  p.isa = isa.empty() ? widest_isa() : isa;
#if BENCH_X86
  if (p.isa == "avx512")
    p.fp32_gflops = measure(fma_loop_avx512, kFlops512, threads, seconds, run);
  else if (p.isa == "avx2")
    p.fp32_gflops = measure(fma_loop_avx2, kFlops256, threads, seconds, run);
  if (has_avx512_bf16()) p.bf16_gflops = measure(dpbf16_loop, kFlopsBf16, threads, seconds, run);
#endif
  return p;
}

double measure_read_bandwidth(int threads, std::size_t bytes, double seconds, const RunThreads& run_in) {
  const RunThreads run = run_in ? run_in : RunThreads(run_std_threads);
  const std::size_t lines = bytes / 64, nt = static_cast<std::size_t>(std::max(threads, 1));
  if (lines < nt) return 0.0;
  constexpr std::size_t kPage = std::size_t{2} << 20;
  const std::size_t alloc = (lines * 64 + kPage - 1) / kPage * kPage;
  std::unique_ptr<float, decltype(&std::free)> buf(static_cast<float*>(std::aligned_alloc(kPage, alloc)), &std::free);
  if (!buf) return 0.0;
  madvise(buf.get(), alloc, MADV_HUGEPAGE);  // a hint; without it, 4 KiB pages
  float* p = buf.get();
  // Each thread writes the part it reads (first touch: its pages where it runs).
  run(nt, [&](std::size_t c) {
    const std::size_t l0 = lines * c / nt, l1 = lines * (c + 1) / nt;
    std::fill(p + 16 * l0, p + 16 * l1, 1.0f);
  });
  float (*reader)(const float*, std::size_t) = read_lines_scalar;
#if BENCH_X86
  const std::string isa = widest_isa();
  if (isa == "avx512") reader = read_lines_avx512;
  else if (isa == "avx2") reader = read_lines_avx2;
#endif
  using clock = std::chrono::steady_clock;
  const auto once = [&](std::size_t passes) {
    const auto t0 = clock::now();
    run(nt, [&](std::size_t c) {
      const std::size_t l0 = lines * c / nt, l1 = lines * (c + 1) / nt;
      float s = 0;
      for (std::size_t r = 0; r < passes; ++r) s += reader(p + 16 * l0, l1 - l0);
      g_sink = g_sink + s;
    });
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  const double t1 = once(1);  // the first pass after the writes, untimed for the result
  const std::size_t passes =
      std::max<std::size_t>(1, static_cast<std::size_t>(seconds / std::max(std::min(t1, once(1)), 1e-9)));
  double best = 0;
  for (int s = 0; s < 3; ++s) best = std::max(best, double(lines) * 64.0 * double(passes) / once(passes) * 1e-9);
  return best;
}

void print_peak_share(const Peak& peak, double achieved_gflops) {
  print_line("peak (fp32 FMA, " + peak.isa + ", " + std::to_string(peak.threads) +
             " threads, measured in this run): " + fmt(peak.fp32_gflops, 1) + " GFLOP/s");
  const double share = peak.fp32_gflops > 0 ? 100.0 * achieved_gflops / peak.fp32_gflops : 0.0;
  print_line("achieved: " + fmt(achieved_gflops, 1) + " GFLOP/s = " + fmt(share, 1) + "% of peak");
}

Peak peak_around(const Peak& before, const RunThreads& run) {
  const Peak now = measure_peak(before.threads, 0.05, run, before.isa);
  const double lo = std::min(before.fp32_gflops, now.fp32_gflops), hi = std::max(before.fp32_gflops, now.fp32_gflops);
  if (lo < 0.85 * hi)
    print_line("peak: " + fmt(before.fp32_gflops, 1) + " GFLOP/s before the timed work, " + fmt(now.fp32_gflops, 1) +
               " after (a core was busy with something else during one of them): the shares use the larger");
  Peak p = before;
  p.fp32_gflops = hi;
  p.bf16_gflops = std::max(before.bf16_gflops, now.bf16_gflops);
  return p;
}

void print_peak_share_around(const Peak& before, double achieved_gflops, const RunThreads& run) {
  print_peak_share(peak_around(before, run), achieved_gflops);
}

}  // namespace bench
