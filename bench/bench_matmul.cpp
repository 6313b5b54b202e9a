// n x n float32 matrix product through xgrad's matmul op, forward only (issue 8,
// "Benchmarks"), and beside it one raw cblas_sgemm call on the same matrices with
// OpenBLAS's own threads set to --threads: the ceiling xgrad's op is measured against.
#include <vector>

#include "bench/common.hpp"
#include "bench/openblas.hpp"
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/ops/matmul.hpp>

using namespace xg;

namespace {

void run(const bench::MatmulFlags& f) {
  set_num_threads(f.threads);
  bench::print_header("bench_matmul", "xgrad", f);
  Generator gen(0);
  const Tensor A = randn({f.n, f.n}, gen);
  const Tensor B = randn({f.n, f.n}, gen);
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, [&] { ops::matmul(A, B); });
  // xgrad keeps OpenBLAS at one thread and splits GEMMs over its own pool; the raw call runs
  // on OpenBLAS's own threads instead.
  const std::vector<double> raw_ms =
      bench::time_raw_sgemm(f.n, A.value().data<float>(), B.value().data<float>(), f.warmup, f.reps, f.threads);
  bench::report_matmul("xgrad", f.n, f.threads, ms, raw_ms);
}

}  // namespace

int main(int argc, char** argv) {
  bench::MatmulFlags f;
  return bench::run_program("bench_matmul", "n x n float32 matmul through xgrad's op, beside raw OpenBLAS sgemm", argc,
                            argv, f, run);
}
