// The README's fifteen-line program: make leaves, run ops, call backward, print, check.
#include <iostream>

#include <xgrad/xgrad.hpp>
using namespace xg;

int main() {
  set_default_dtype(DType::float64);  // float32 is the default; gradient checks want float64
  Tensor x(Array::of({{1.0, 2.0}, {3.0, 4.0}}), /*requires_grad=*/true);
  Tensor W(Array::of({{0.5, -1.0}, {1.0, 0.25}}), true);
  Tensor y = ops::sum(ops::softmax(ops::matmul(x, W), -1) * x);  // records 4 ops
  y.backward();                                                  // reverse sweep
  std::cout << y.item() << "\n";
  std::cout << W.grad().str() << "\n";
  GradcheckReport r = gradcheck([](const std::vector<Tensor>& in) {
    return ops::softmax(ops::matmul(in[0], in[1]), -1); }, {x.value(), W.value()});
  std::cout << r.summary() << "\n";
  return r.passed ? 0 : 1;
}
