// libtorch reference for bench_op_overhead: the same chain of k ops on one element, forward
// and backward, on libtorch's autograd.
#include "bench/torch/torch_common.hpp"

namespace {

void run(const bench::OpOverheadFlags& f) {
  bench::print_header("torch_bench_op_overhead", "libtorch", f);
  torch::Tensor x = torch::ones({1}).requires_grad_();
  double grad = 0;
  const auto chain = [&] {
    x.mutable_grad().reset();
    torch::Tensor y = x;
    for (std::size_t i = 0; i < f.k; ++i) y = i % 2 == 0 ? y * 0.999 : y + 0.001;
    y.backward();
    grad = x.grad().item<double>();
  };
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, chain);
  bench::report_op_overhead(ms, f.k, grad);
}

}  // namespace

int main(int argc, char** argv) {
  bench::OpOverheadFlags f;
  return bench::run_program(
      "torch_bench_op_overhead", "Autograd overhead per op: a chain of k ops on one element, libtorch reference", argc,
      argv, f, [](const bench::OpOverheadFlags& flags) { bench::torchref::without_backtrace([&] { run(flags); }); });
}
