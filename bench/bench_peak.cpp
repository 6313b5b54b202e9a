// The machine's floating-point peak (issue 21): fp32 fused multiply-adds with the widest
// vectors the CPU has (AVX-512 where avx512f, else AVX2 + FMA, chosen at run time from cpuid),
// on one thread and on all of xgrad's pool threads, and the bf16 dot-product peak (vdpbf16ps)
// where the CPU has avx512_bf16. The other bench programs measure the same briefly and print
// their GFLOP/s as a share of it (docs/performance.md).
#include <CLI/CLI.hpp>
#include <string>

#include "bench/common.hpp"
#include "bench/peak.hpp"
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/runtime.hpp>

using namespace xg;

namespace {

struct PeakFlags {
  int threads = 2;
  double seconds = 0.2;
  std::string isa = "auto";
};

void run(const PeakFlags& f) {
  set_num_threads(f.threads);
  const std::string isa = f.isa == "auto" ? std::string() : f.isa;
  if (isa == "avx512" && bench::widest_isa() != "avx512")
    throw bench::UsageError("--isa avx512: this CPU has no avx512f");
  if (isa == "avx2" && bench::widest_isa() == "scalar") throw bench::UsageError("--isa avx2: this CPU has no AVX2/FMA");
  const bench::RunThreads pool = [](std::size_t n, const std::function<void(std::size_t)>& job) {
    detail::run_chunks(n, job);
  };
  bench::print_line("bench_peak: widest vectors " + bench::widest_isa() + ", avx512_bf16 " +
                    (bench::has_avx512_bf16() ? "yes" : "no") + ", xgrad threads " + std::to_string(f.threads) +
                    ", " + bench::fmt(f.seconds, 2) + " s per slice");
  bench::print_library_lines();
  const bench::Peak one = bench::measure_peak(1, f.seconds, pool, isa);
  const bench::Peak all = bench::measure_peak(f.threads, f.seconds, pool, isa);
  bench::print_line("fp32 FMA (" + one.isa + ") 1 thread: " + bench::fmt(one.fp32_gflops, 1) + " GFLOP/s");
  bench::print_line("fp32 FMA (" + all.isa + ") " + std::to_string(f.threads) +
                    " threads: " + bench::fmt(all.fp32_gflops, 1) + " GFLOP/s");
  if (all.bf16_gflops > 0) {
    bench::print_line("bf16 dot product (vdpbf16ps) 1 thread: " + bench::fmt(one.bf16_gflops, 1) + " GFLOP/s");
    bench::print_line("bf16 dot product (vdpbf16ps) " + std::to_string(f.threads) +
                      " threads: " + bench::fmt(all.bf16_gflops, 1) + " GFLOP/s");
  } else {
    bench::print_line("bf16 dot product: this CPU has no avx512_bf16");
  }
  bench::print_result("peak_fp32_gflops", all.fp32_gflops, "GFLOP/s");
}

}  // namespace

int main(int argc, char** argv) {
  PeakFlags f;
  return bench::run_program(
      "bench_peak", "fp32 FMA and bf16 dot-product peak of this CPU, 1 thread and all threads", argc, argv,
      [&f](CLI::App& app) {
        app.add_option("--threads", f.threads, "worker threads (xgrad's pool)")
            ->check(CLI::PositiveNumber)
            ->capture_default_str();
        app.add_option("--seconds", f.seconds, "length of each timed slice (the best of 3 counts)")
            ->check(CLI::Range(0.001, 60.0))
            ->capture_default_str();
        app.add_option("--isa", f.isa, "vector width: auto (the widest), avx512 or avx2")
            ->check(CLI::IsMember({"auto", "avx512", "avx2"}))
            ->capture_default_str();
      },
      [&f] { run(f); });
}
