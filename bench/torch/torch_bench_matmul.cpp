// libtorch reference for bench_matmul: torch::mm of two n x n float32 matrices, beside raw
// cblas_sgemm with OpenBLAS's own threads set to --threads.
#include "bench/openblas.hpp"
#include "bench/torch/torch_common.hpp"

namespace {

void run(const bench::MatmulFlags& f, const bench::torchref::ThreadFlags& tf) {
  bench::print_header("torch_bench_matmul", "libtorch", f);
  bench::torchref::set_threads(f.threads, tf);
  torch::manual_seed(0);
  const auto n = static_cast<std::int64_t>(f.n);
  const torch::Tensor A = torch::randn({n, n}), B = torch::randn({n, n});
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, [&] { torch::mm(A, B); });
  const std::vector<double> raw_ms =
      bench::time_raw_sgemm(f.n, A.data_ptr<float>(), B.data_ptr<float>(), f.warmup, f.reps, f.threads);
  bench::report_matmul("libtorch", f.n, f.threads, ms, raw_ms);
}

}  // namespace

int main(int argc, char** argv) {
  bench::MatmulFlags f;
  return bench::torchref::run_program(
      "torch_bench_matmul", "n x n float32 matmul through torch::mm, beside raw OpenBLAS sgemm", argc, argv, f, run);
}
