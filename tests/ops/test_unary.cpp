// Unary elementwise ops (ops/unary.hpp): forward values against the standard library, edge
// values, the derivative conventions at the kinks. Their gradient checks live in
// checks/op_checks.cpp ("ops/exp", ...) and run as test cases of their own
// (tests/checks/test_builtin_checks.cpp); swiglu: tests/ops/test_swiglu.cpp.
#include <cmath>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("unary ops: forward values match the standard library", "[ops][unary]") {
  const Array xa = Array::of({-1.5, -0.2, 0.3, 2.0});
  const Tensor x(xa);
  const auto v = xa.to_vector();
  auto expect = [&](const Tensor& y, double (*f)(double)) {
    for (std::size_t i = 0; i < v.size(); ++i) CHECK(y.value().flat(i) == Approx(f(v[i])).margin(1e-15));
  };
  expect(ops::exp(x), [](double a) { return std::exp(a); });
  expect(ops::tanh(x), [](double a) { return std::tanh(a); });
  expect(ops::abs(x), [](double a) { return std::fabs(a); });
  expect(ops::sigmoid(x), [](double a) { return 1.0 / (1.0 + std::exp(-a)); });
  expect(ops::relu(x), [](double a) { return a > 0 ? a : 0.0; });
  expect(ops::gelu(x), [](double a) { return 0.5 * a * (1 + std::erf(a / std::sqrt(2.0))); });
  expect(ops::gelu(x, ops::GeluApprox::tanh), [](double a) {
    return 0.5 * a * (1 + std::tanh(std::sqrt(2 / M_PI) * (a + 0.044715 * a * a * a)));
  });
  expect(ops::clamp(x, -1.0, 1.0), [](double a) { return std::min(1.0, std::max(-1.0, a)); });
  expect(ops::pow(x, 3.0), [](double a) { return a * a * a; });
  const Tensor p(Array::of({0.5, 2.0, 9.0}));
  CHECK(ops::log(p).value().flat(1) == Approx(std::log(2.0)));
  CHECK(ops::sqrt(p).value().flat(2) == 3.0);
}

TEST_CASE("sigmoid: stays finite and exact at large |x|", "[ops][unary]") {
  const Tensor x(Array::of({-800.0, 800.0}));
  const auto y = ops::sigmoid(x).value().to_vector();
  CHECK(y[0] == 0.0);
  CHECK(y[1] == 1.0);
}

TEST_CASE("relu abs and clamp: derivative conventions at the kinks", "[ops][unary]") {
  Tensor x(Array::of({0.0, -1.0, 1.0}), true);
  ops::sum(ops::relu(x)).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{0, 0, 1});  // relu'(0) = 0, as PyTorch
  x.zero_grad();
  ops::sum(ops::abs(x)).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{0, -1, 1});
  x.zero_grad();
  ops::sum(ops::clamp(x, -1.0, 0.5)).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{1, 1, 0});  // bounds inclusive
}
