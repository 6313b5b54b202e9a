// The xgrad program. Subcommands grow with the project; for now `demo` (the default) builds
// a small graph, runs backward and prints the gradients the engine computed, checked
// against central finite differences.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "xgrad.hpp"

namespace {

int demo() {
  using namespace xg;
  // y = sum(softmax(x W) * t): a tiny "attention-like" graph with matmul and softmax.
  Tensor x(Array::of({{1.0, 0.0}, {0.0, 1.0}, {1.0, 1.0}}), true);
  Tensor W(Array::of({{0.5, -1.0, 2.0}, {1.5, 0.25, -0.5}}), true);
  const Array t = Array::of({{1.0, 0.0, 0.0}, {0.0, 1.0, 0.0}, {0.0, 0.0, 1.0}});
  Tensor y = ops::sum(ops::softmax(ops::matmul(x, W), -1) * Tensor(t));
  y.backward();
  std::cout << "y = sum(softmax(x W) * t) = " << y.item() << "\n";
  std::cout << "dy/dx =\n" << x.grad().str() << "\n";
  std::cout << "dy/dW =\n" << W.grad().str() << "\n";

  const GradcheckReport r = gradcheck(
      [&](const std::vector<Tensor>& in) {
        return ops::sum(ops::softmax(ops::matmul(in[0], in[1]), -1) * Tensor(t));
      },
      {x.value(), W.value()}, {}, {"x", "W"});
  std::cout << r.summary() << "\n";
  return r.passed ? 0 : 1;
}

void usage() {
  std::cout << "usage: xgrad [demo]\n"
               "  demo   build a small graph, run backward, print gradients (default)\n";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "demo";
  try {
    if (cmd == "demo") return demo();
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      usage();
      return 0;
    }
    std::cerr << "xgrad: unknown command '" << cmd << "'\n";
    usage();
    return 2;
  } catch (const xg::Error& e) {
    std::cerr << "xgrad: " << e.what() << "\n";
    return 1;
  }
}
