// `xgrad demo`: builds a small graph, runs backward, prints the gradients the engine computed
// and checks them against central differences.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/xgrad.hpp>

namespace xg::cli {

namespace {

int run_demo() {
  // y = sum(softmax(x W) * t): a tiny "attention-like" graph with matmul and softmax.
  Tensor x(Array::of({{1.0, 0.0}, {0.0, 1.0}, {1.0, 1.0}}, DType::float64), true);
  Tensor W(Array::of({{0.5, -1.0, 2.0}, {1.5, 0.25, -0.5}}, DType::float64), true);
  const Array t = Array::of({{1.0, 0.0, 0.0}, {0.0, 1.0, 0.0}, {0.0, 0.0, 1.0}}, DType::float64);
  Tensor y = ops::sum(ops::softmax(ops::matmul(x, W), -1) * Tensor(t));
  y.backward();
  std::cout << "y = sum(softmax(x W) * t) = " << y.item() << "\n";
  std::cout << "dy/dx =\n" << x.grad().str() << "\n";
  std::cout << "dy/dW =\n" << W.grad().str() << "\n";

  const GradcheckReport r = gradcheck(
      [&](const std::vector<Tensor>& in) { return ops::sum(ops::softmax(ops::matmul(in[0], in[1]), -1) * Tensor(t)); },
      {x.value(), W.value()}, {}, {"x", "W"});
  std::cout << r.summary() << "\n";
  return r.passed ? 0 : 1;
}

}  // namespace

void add_demo(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("demo", "Build a small graph, run backward, print gradients");
  help_footer(*cmd, "xgrad demo");
  cmd->callback([] {
    const int rc = run_demo();
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xg::cli
