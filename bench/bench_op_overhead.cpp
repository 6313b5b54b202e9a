// Per-op overhead of the tape (issue 8, "Benchmarks"): a chain of k ops on a 1-element
// tensor, x = x * c and x = x + c alternating, forward and backward; the time per op is the
// time of one chain divided by k. The arithmetic is negligible: this is the cost of
// creating, recording and differentiating an op.
#include "bench/common.hpp"
#include <xgrad/core/tensor.hpp>
#include <xgrad/ops/elementwise.hpp>

using namespace xg;

namespace {

void run(const bench::OpOverheadFlags& f) {
  bench::print_header("bench_op_overhead", "xgrad", f);
  Tensor x(Array::full({1}, 1.0, DType::float32), /*requires_grad=*/true);
  double grad = 0;
  const auto chain = [&] {
    x.zero_grad();
    Tensor y = x;
    for (std::size_t i = 0; i < f.k; ++i) y = i % 2 == 0 ? y * 0.999 : y + 0.001;
    y.backward();
    grad = x.grad().item();
  };
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, chain);
  bench::report_op_overhead(ms, f.k, grad);
}

}  // namespace

int main(int argc, char** argv) {
  bench::OpOverheadFlags f;
  return bench::run_program("bench_op_overhead",
                            "Tape overhead per op: a chain of k ops on one element, forward + backward, xgrad", argc,
                            argv, f, run);
}
