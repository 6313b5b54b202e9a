// Per-op overhead of the tape (issue 8, "Benchmarks"): a chain of k ops on a 1-element
// tensor, x = x * c and x = x + c alternating, forward and backward; the time per op is the
// time of one chain divided by k. The arithmetic is negligible: this is the cost of
// creating, recording and differentiating an op.
#include "bench/common.hpp"
#include "core/tensor.hpp"
#include "ops/elementwise.hpp"

using namespace xg;

namespace {

void run(const bench::OpOverheadFlags& f) {
  bench::print_line("bench_op_overhead (xgrad): k " + std::to_string(f.k) + " ops on a 1-element float32 tensor, " +
                    "x * c and x + c alternating, forward + backward");
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
  const std::vector<double> us_per_op = bench::scaled(ms, 1000.0 / static_cast<double>(f.k));
  bench::print_line("d chain / d x = " + bench::fmt(grad, 6));
  bench::print_summary("chain fwd+bwd", ms, "ms");
  bench::print_summary("per op fwd+bwd", us_per_op, "us");
  bench::print_peak_rss();
  bench::print_result("op_overhead_us", bench::summarize(us_per_op).median, "us");
}

}  // namespace

int main(int argc, char** argv) {
  bench::OpOverheadFlags f;
  return bench::run_program(
      "bench_op_overhead", "Tape overhead per op: a chain of k ops on one element, forward + backward, xgrad", argc,
      argv, [&](CLI::App& app) { bench::add_flags(app, f); }, [&] { run(f); });
}
