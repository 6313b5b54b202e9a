// Float32 (--dtype float64: float64) matrix product through xgrad's matmul op, forward only (issue 8, "Benchmarks"), and
// beside it, on the same matrices in the same run: each float32 GEMM backend of xgrad's BLAS
// doorway (core/detail/blas.hpp: OpenBLAS and oneDNN, single-threaded inside xgrad's pool), and one
// raw cblas_sgemm call with OpenBLAS's own threads set to --threads. Square n x n by default;
// --m and --k give [m, k] x [k, n] (the tall-skinny projections). GFLOP/s are 2 m n k / time,
// also shown as a share of the fp32 FMA peak measured in the same run (bench/peak.hpp).
// --dtype bfloat16: the products of xg::set_matmul_dtype's bfloat16 mode (inputs rounded to
// bfloat16, float32 accumulation) on each bfloat16 kernel beside the float32 product of the same
// operands, in alternating rounds, with --transpose-a / --transpose-b (the shapes of a backward
// pass) and --cold (operands and results rotate through copies larger than the last-level cache,
// as a training step's fresh activations are).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <vector>

#include "bench/common.hpp"
#include "bench/openblas.hpp"
#include "bench/xgrad_pool.hpp"
#include <xgrad/core/detail/bf16_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/ops/matmul.hpp>

using namespace xg;

namespace {

struct Extra {
  std::optional<std::size_t> m, k;
  bool ta = false, tb = false, cold = false;  // --dtype bfloat16 only
};

std::vector<double> gflops(const std::vector<double>& ms, double flop) {
  std::vector<double> out;
  for (double v : ms) out.push_back(flop * 1e-9 / (v * 1e-3));
  return out;
}

// --dtype float64: the op on float64 tensors, then each float64 kernel of the doorway
// (blas::dgemm_on: xgrad's own AVX-512 and AVX2 kernels where the CPU has them, OpenBLAS's
// dgemm) on the same matrices, in rounds that alternate the kernels (medians over all rounds),
// each as a share of the float64 FMA peak (half the fp32 peak measured in the same run).
void run_f64(const bench::MatmulFlags& f, const Extra& x) {
  const std::size_t M = x.m.value_or(f.n), K = x.k.value_or(f.n), N = f.n;
  if (M == N && K == N)
    bench::print_header("bench_matmul", "xgrad", f);
  else
    bench::print_line("bench_matmul (xgrad): [" + std::to_string(M) + ", " + std::to_string(K) + "] x [" +
                      std::to_string(K) + ", " + std::to_string(N) + "], float64, threads " +
                      std::to_string(f.threads));
  if (M != N || K != N) bench::print_library_lines();
  Generator gen(0);
  const Tensor A = randn({M, K}, gen, DType::float64);
  const Tensor B = randn({K, N}, gen, DType::float64);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  const bench::RunThreads pool = bench::xgrad_pool();
  const bench::Peak peak_before = bench::measure_peak(f.threads, 0.05, pool);  // and after (peak_around)
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
       std::chrono::steady_clock::now() < until;)
    ops::matmul(A, B);
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, [&] { ops::matmul(A, B); });
  std::vector<double> C(M * N);
  const double* a = A.value().data<double>();
  const double* b = B.value().data<double>();
  std::vector<blas::F64Kernel> kernels;
  for (blas::F64Kernel k : {blas::F64Kernel::xgrad_avx512, blas::F64Kernel::xgrad_avx2, blas::F64Kernel::openblas})
    if (blas::f64_kernel_available(k)) kernels.push_back(k);
  std::vector<std::vector<double>> t(kernels.size());
  const std::size_t rounds = 3;
  for (std::size_t r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      const std::vector<double> s = bench::time_reps(f.warmup, (f.reps + rounds - 1) / rounds, [&] {
        blas::dgemm_on(kernels[i], false, false, M, N, K, 1.0, a, K, b, N, 0.0, C.data(), N);
      });
      t[i].insert(t[i].end(), s.begin(), s.end());
    }
  const bench::Peak peak = bench::peak_around(peak_before, pool);
  const double f64_peak = peak.fp32_gflops / 2;
  bench::print_line("peak (fp64 FMA = half the fp32 one, " + peak.isa + ", " + std::to_string(peak.threads) +
                    " threads, measured now): " + bench::fmt(f64_peak, 1) + " GFLOP/s");
  std::vector<double> medians;
  for (std::size_t i = 0; i < kernels.size(); ++i) {
    const double med = bench::summarize(gflops(t[i], flop)).median;
    medians.push_back(med);
    bench::print_summary(std::string("doorway ") + blas::f64_kernel_name(kernels[i]) + " (xgrad pool)",
                         gflops(t[i], flop), "GFLOPS");
    bench::print_line(std::string("  ") + blas::f64_kernel_name(kernels[i]) + ": " + bench::fmt(100 * med / f64_peak, 1) +
                      "% of the fp64 peak");
  }
  if (kernels.back() == blas::F64Kernel::openblas && kernels.size() > 1)
    bench::print_line(std::string("ratio ") + blas::f64_kernel_name(kernels[0]) + " / OpenBLAS: " +
                      bench::fmt(medians[0] / medians.back(), 2));
  const double achieved = bench::summarize(gflops(ms, flop)).median;
  bench::print_summary("xgrad matmul float64", ms, "ms");
  bench::print_summary("xgrad matmul float64", gflops(ms, flop), "GFLOPS");
  bench::print_line("achieved: " + bench::fmt(achieved, 1) + " GFLOP/s = " + bench::fmt(100 * achieved / f64_peak, 1) +
                    "% of the fp64 peak");
  bench::print_peak_rss();
  bench::print_result("matmul_gflops", achieved, "GFLOPS");
}

// Copies of an operand: one, or with `cold` enough that cycling through them (with the other
// operand's and the result's, `total_floats` a set) covers 64 MiB or 4 times the last-level
// cache, whichever is more, at most 64 sets (a product small enough to need more stays in cache
// anyway; the cap keeps a large L3 from asking for thousands of tiny copies).
std::vector<std::vector<float>> copies(const std::vector<float>& v, std::size_t total_floats, bool cold) {
  std::size_t n = 1;
  if (cold) {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const std::size_t bytes = std::max<std::size_t>(std::size_t{64} << 20, 4 * std::size_t(l3 > 0 ? l3 : 0));
    n = std::min<std::size_t>(64, std::max<std::size_t>(2, bytes / std::max<std::size_t>(1, total_floats * sizeof(float)) + 1));
  }
  return std::vector<std::vector<float>>(n, v);
}

// --dtype bfloat16: C = op(A) op(B) on each bfloat16 kernel (xgrad's, and oneDNN's where this
// build has it) and in float32 (the doorway's float32 GEMM) on the same operands, in rounds that
// alternate them (medians over all rounds); the bfloat16 kernels as a share of the vdpbf16ps peak
// and as a speed-up over float32.
void run_bf16(const bench::MatmulFlags& f, const Extra& x) {
  const std::size_t M = x.m.value_or(f.n), K = x.k.value_or(f.n), N = f.n;
  if (!blas::bf16::cpu_supported())
    throw Error("--dtype bfloat16: this CPU has no AVX512_BF16 instructions");
  bench::print_line("bench_matmul (xgrad): op(A) [" + std::to_string(M) + ", " + std::to_string(K) + "] x op(B) [" +
                    std::to_string(K) + ", " + std::to_string(N) + "], A " + (x.ta ? "transposed" : "as is") +
                    ", B " + (x.tb ? "transposed" : "as is") + ", bfloat16 products, threads " +
                    std::to_string(f.threads) + (x.cold ? ", cold operands" : ""));
  bench::print_library_lines();
  Generator gen(0);
  const Tensor At = randn({M * K}, gen), Bt = randn({K * N}, gen);
  const std::vector<float> a0(At.value().data<float>(), At.value().data<float>() + M * K);
  const std::vector<float> b0(Bt.value().data<float>(), Bt.value().data<float>() + K * N);
  const std::size_t total = M * K + K * N + M * N;
  const auto as = copies(a0, total, x.cold), bs = copies(b0, total, x.cold);
  auto cs = copies(std::vector<float>(M * N), total, x.cold);
  const std::size_t lda = x.ta ? M : K, ldb = x.tb ? K : N;
  std::size_t turn = 0;
  using Gemm = std::function<void(const float*, const float*, float*)>;
  struct Kernel {
    std::string name;
    Gemm run;
    std::vector<double> ms;
  };
  std::vector<Kernel> kernels;
  kernels.push_back({"xgrad avx512_bf16", [&](const float* a, const float* b, float* c) {
    blas::gemm_bf16_on(blas::Bf16Kernel::xgrad, x.ta, x.tb, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, c, N);
  }, {}});
  if (blas::bf16::onednn_supported())
    kernels.push_back({"oneDNN bfloat16", [&](const float* a, const float* b, float* c) {
      blas::gemm_bf16_on(blas::Bf16Kernel::onednn, x.ta, x.tb, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, c, N);
    }, {}});
  kernels.push_back({"float32 (" + float32_gemm_kernels() + ")", [&](const float* a, const float* b, float* c) {
    blas::gemm(x.ta, x.tb, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, c, N);
  }, {}});
  const auto call = [&](Kernel& k) {
    const std::size_t i = turn++;
    k.run(as[i % as.size()].data(), bs[i % bs.size()].data(), cs[i % cs.size()].data());
  };
  const bench::RunThreads pool = bench::xgrad_pool();
  const bench::Peak peak_before = bench::measure_peak(f.threads, 0.05, pool);  // and after (peak_around)
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
       std::chrono::steady_clock::now() < until;)
    for (Kernel& k : kernels) call(k);
  const std::size_t rounds = 3;
  for (std::size_t r = 0; r < rounds; ++r)
    for (std::size_t j = 0; j < kernels.size(); ++j) {
      Kernel& k = kernels[(j + r) % kernels.size()];  // each round starts with another kernel
      const std::vector<double> t = bench::time_reps(f.warmup, (f.reps + rounds - 1) / rounds, [&] { call(k); });
      k.ms.insert(k.ms.end(), t.begin(), t.end());
    }
  const double flop = 2.0 * double(M) * double(N) * double(K);
  const bench::Peak peak = bench::peak_around(peak_before, pool);
  bench::print_line("peak (vdpbf16ps, " + std::to_string(peak.threads) + " threads, measured now): " +
                    bench::fmt(peak.bf16_gflops, 1) + " GFLOP/s; fp32 FMA " + bench::fmt(peak.fp32_gflops, 1) +
                    " GFLOP/s");
  const double f32 = bench::summarize(gflops(kernels.back().ms, flop)).median;
  for (Kernel& k : kernels) {
    const double med = bench::summarize(gflops(k.ms, flop)).median;
    bench::print_summary(k.name, gflops(k.ms, flop), "GFLOPS");
    if (&k != &kernels.back())
      bench::print_line("  " + k.name + ": " + bench::fmt(100 * med / peak.bf16_gflops, 1) +
                        "% of the vdpbf16ps peak, " + bench::fmt(med / f32, 2) + "x float32");
    else
      bench::print_line("  float32: " + bench::fmt(100 * med / peak.fp32_gflops, 1) + "% of the fp32 peak");
  }
  bench::print_peak_rss();
  bench::print_result("matmul_bf16_speedup", bench::summarize(gflops(kernels.front().ms, flop)).median / f32, "x");
}

void run(const bench::MatmulFlags& f, const Extra& x) {
  set_num_threads(f.threads);
  if (f.dtype != "bfloat16" && (x.ta || x.tb || x.cold))
    throw bench::UsageError("--transpose-a, --transpose-b and --cold go with --dtype bfloat16");
  if (f.dtype == "float64") {
    run_f64(f, x);
    return;
  }
  if (f.dtype == "bfloat16") {
    run_bf16(f, x);
    return;
  }
  const std::size_t M = x.m.value_or(f.n), K = x.k.value_or(f.n), N = f.n;
  const bool square = M == N && K == N;
  if (square)
    bench::print_header("bench_matmul", "xgrad", f);
  else
    bench::print_line("bench_matmul (xgrad): [" + std::to_string(M) + ", " + std::to_string(K) + "] x [" +
                      std::to_string(K) + ", " + std::to_string(N) + "], float32, threads " +
                      std::to_string(f.threads));
  if (!square) bench::print_library_lines();
  bench::print_line("float32 GEMM kernels: " + float32_gemm_kernels() + " (CPU: " + blas::cpu_isa() + ")");
  Generator gen(0);
  const Tensor A = randn({M, K}, gen);
  const Tensor B = randn({K, N}, gen);
  const double flop = 2.0 * double(M) * double(N) * double(K);
  const bench::RunThreads pool = bench::xgrad_pool();
  // The peak of the vectors the GEMM kernels use (XGRAD_ISA=avx2 on an AVX-512 CPU: the AVX2
  // peak), before the timed products and again after them (bench/peak.hpp, peak_around).
  const bench::Peak peak_before =
      bench::measure_peak(f.threads, 0.05, pool, blas::sgemm_isa() == "avx2" ? "avx2" : "");
  // The first few hundred milliseconds of products run slower (oneDNN's first calls for a shape
  // and ISA, the clock coming up): without this the op, timed first, paid for it alone (under
  // XGRAD_ISA=avx2, 133 against the doorway's 177 GFLOP/s, the same calls). Untimed, by time.
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
       std::chrono::steady_clock::now() < until;)
    ops::matmul(A, B);
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, [&] { ops::matmul(A, B); });
  // Each backend of the doorway on the same matrices (as the op calls it, minus the op).
  std::vector<float> C(M * N);
  const float* a = A.value().data<float>();
  const float* b = B.value().data<float>();
  std::vector<blas::Backend> backends{blas::Backend::openblas};
  if (blas::onednn_available()) backends.push_back(blas::Backend::onednn);
  for (blas::Backend be : backends) {
    const std::vector<double> t = bench::time_reps(f.warmup, f.reps, [&] {
      blas::sgemm_on(be, false, false, M, N, K, 1.0f, a, K, b, N, 0.0f, C.data(), N);
    });
    bench::print_summary(std::string("doorway ") + blas::backend_name(be) + " (xgrad pool)", gflops(t, flop),
                         "GFLOPS");
  }
  if (blas::bf16_available()) {  // bfloat16 inputs, float32 accumulation (xg::set_matmul_dtype)
    const std::vector<double> t = bench::time_reps(f.warmup, f.reps, [&] {
      blas::gemm_bf16(false, false, M, N, K, 1.0f, a, K, b, N, 0.0f, C.data(), N);
    });
    bench::print_summary("doorway bfloat16 (xgrad pool)", gflops(t, flop), "GFLOPS");
  }
  const bench::Peak peak = bench::peak_around(peak_before, pool);
  const double achieved = bench::summarize(gflops(ms, flop)).median;
  bench::print_peak_share(peak, achieved);
  if (square) {
    // xgrad keeps OpenBLAS at one thread and splits GEMMs over its own pool; the raw call runs
    // on OpenBLAS's own threads instead.
    const std::vector<double> raw_ms = bench::time_raw_sgemm(f.n, a, b, f.warmup, f.reps, f.threads);
    bench::report_matmul("xgrad", f.n, f.threads, ms, raw_ms);
  } else {
    bench::print_summary("xgrad matmul", ms, "ms");
    bench::print_summary("xgrad matmul", gflops(ms, flop), "GFLOPS");
    bench::print_peak_rss();
    bench::print_result("matmul_gflops", achieved, "GFLOPS");
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::MatmulFlags f;
  Extra x;
  return bench::run_program(
      "bench_matmul", "float32 (or float64) matmul through xgrad's op and each GEMM backend, beside raw OpenBLAS", argc,
      argv,
      [&](CLI::App& app) {
        bench::add_flags(app, f);
        app.add_option_function<std::size_t>(
               "--m", [&x](const std::size_t& v) { x.m = v; }, "rows of the left matrix (default: n)")
            ->check(CLI::PositiveNumber);
        app.add_option_function<std::size_t>(
               "--k", [&x](const std::size_t& v) { x.k = v; }, "inner dimension (default: n)")
            ->check(CLI::PositiveNumber);
        app.add_option("--dtype", f.dtype,
                       "float32 (the op, each float32 backend, raw sgemm), float64 (the op, each float64 kernel) or "
                       "bfloat16 (each bfloat16 kernel beside float32)")
            ->check(CLI::IsMember({"float32", "float64", "bfloat16"}))
            ->capture_default_str();
        app.add_flag("--transpose-a", x.ta, "bfloat16: A is stored [k, m] (a weight gradient's X^T)");
        app.add_flag("--transpose-b", x.tb, "bfloat16: B is stored [n, k] (an input gradient's W^T)");
        app.add_flag("--cold", x.cold,
                     "bfloat16: operands and results rotate through copies larger than the last-level cache (64 MiB "
                     "or 4 times the L3, at most 64 copies)");
      },
      [&] { run(f, x); });
}
