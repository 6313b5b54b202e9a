// n x n float32 matrix product through xgrad's matmul op, forward only (issue 8,
// "Benchmarks"), and beside it one raw cblas_sgemm call on the same matrices with
// OpenBLAS's own threads set to --threads: the ceiling xgrad's op is measured against.
#include <vector>

#include "bench/common.hpp"
#include "bench/openblas.hpp"
#include "core/runtime.hpp"
#include "core/tensor.hpp"
#include "ops/matmul.hpp"

using namespace xg;

namespace {

void run(const bench::MatmulFlags& f) {
  set_num_threads(f.threads);
  bench::print_line("bench_matmul (xgrad): n " + std::to_string(f.n) + ", float32, threads " +
                    std::to_string(f.threads));
  Generator gen(0);
  const Tensor A = randn({f.n, f.n}, gen);
  const Tensor B = randn({f.n, f.n}, gen);
  const double n = static_cast<double>(f.n);
  const double gflop = 2.0 * n * n * n * 1e-9;
  const auto gflops = [gflop](const std::vector<double>& ms) {
    std::vector<double> out;
    for (double t : ms) out.push_back(gflop / (t * 1e-3));
    return out;
  };

  const std::vector<double> xg_ms = bench::time_reps(f.warmup, f.reps, [&] { ops::matmul(A, B); });

  // xgrad keeps OpenBLAS at one thread and splits GEMMs over its own pool; the raw call gets
  // OpenBLAS's own threads instead, then the setting is put back.
  const int blas_before = bench::openblas_threads();
  bench::set_openblas_threads(f.threads);
  std::vector<float> C(f.n * f.n);
  const std::vector<double> raw_ms = bench::time_reps(
      f.warmup, f.reps, [&] { bench::raw_sgemm(f.n, A.value().data<float>(), B.value().data<float>(), C.data()); });
  bench::set_openblas_threads(blas_before);

  const std::vector<double> xg_gflops = gflops(xg_ms), raw_gflops = gflops(raw_ms);
  bench::print_summary("xgrad matmul", xg_ms, "ms");
  bench::print_summary("xgrad matmul", xg_gflops, "GFLOPS");
  bench::print_summary("raw cblas_sgemm (OpenBLAS threads " + std::to_string(f.threads) + ")", raw_gflops,
                       "GFLOPS");
  const double xg_median = bench::summarize(xg_gflops).median, raw_median = bench::summarize(raw_gflops).median;
  bench::print_line("raw sgemm GFLOPS: " + bench::fmt(raw_median, 2));
  bench::print_line("ratio xgrad / raw sgemm: " + bench::fmt(xg_median / raw_median, 3));
  bench::print_peak_rss();
  bench::print_result("matmul_gflops", xg_median, "GFLOPS");
}

}  // namespace

int main(int argc, char** argv) {
  bench::MatmulFlags f;
  return bench::run_program(
      "bench_matmul", "n x n float32 matmul through xgrad's op, beside raw OpenBLAS sgemm", argc, argv,
      [&](CLI::App& app) { bench::add_flags(app, f); }, [&] { run(f); });
}
