// Elementwise ops: forward values and gradchecks with broadcasting and size-1 axes.
#include <cmath>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

using Binary = Tensor (*)(const Tensor&, const Tensor&);

// Shape pairs that exercise NumPy broadcasting: equal, size-1 axes, missing leading axes,
// scalars, and both operands broadcasting at once.
const std::vector<std::pair<Shape, Shape>> kBroadcastPairs = {
    {{2, 3}, {2, 3}}, {{2, 3}, {1, 3}}, {{2, 3}, {3}},   {{4, 1, 3}, {2, 1}},
    {{2, 3}, {}},     {{}, {2, 2}},     {{3, 1}, {1, 4}}, {{1, 2, 1}, {3, 1, 2}},
};

void check_binary(Binary op, bool positive_b = false) {
  Generator g(17);
  for (const auto& [sa, sb] : kBroadcastPairs) {
    DYNAMIC_SECTION("a " << shape_str(sa) << ", b " << shape_str(sb)) {
      const Array a = rnd(sa, g);
      // Divisors kept away from 0 so the quotient's derivative stays moderate.
      const Array b = positive_b ? rnd(sb, g, 0.5, 1.5) : rnd(sb, g);
      require_gradcheck([op](const std::vector<Tensor>& in) { return op(in[0], in[1]); }, {a, b}, {"a", "b"});
    }
  }
}

}  // namespace

TEST_CASE("add: values broadcast like NumPy", "[ops][elementwise]") {
  const Tensor a(Array::of({{1.0, 2.0, 3.0}})), b(Array::from_vector({2, 1}, {10.0, 20.0}, DType::float64));
  const Tensor c = a + b;
  CHECK(c.shape() == Shape{2, 3});
  CHECK(c.value().to_vector() == std::vector<double>{11, 12, 13, 21, 22, 23});
}

TEST_CASE("add: VJP agrees with central differences under broadcasting", "[ops][elementwise][gradcheck]") {
  check_binary(&ops::add);
}
TEST_CASE("sub: VJP agrees with central differences under broadcasting", "[ops][elementwise][gradcheck]") {
  check_binary(&ops::sub);
}
TEST_CASE("mul: VJP agrees with central differences under broadcasting", "[ops][elementwise][gradcheck]") {
  check_binary(&ops::mul);
}
TEST_CASE("div: VJP agrees with central differences under broadcasting", "[ops][elementwise][gradcheck]") {
  check_binary(&ops::div, true);
}

TEST_CASE("scalar operators: x*2, 1-x, 2/x, -x", "[ops][elementwise]") {
  const Tensor x(Array::of({1.0, 4.0}));
  CHECK((x * 2.0).value().to_vector() == std::vector<double>{2, 8});
  CHECK((1.0 - x).value().to_vector() == std::vector<double>{0, -3});
  CHECK((2.0 / x).value().to_vector() == std::vector<double>{2, 0.5});
  CHECK((-x).value().to_vector() == std::vector<double>{-1, -4});
  CHECK((x + 1.0).dtype() == DType::float64);
  const Tensor f(Array::of({1.0}, DType::float32));
  CHECK((f * 3.0).dtype() == DType::float32);
}

namespace {
using Unary = std::function<Tensor(const Tensor&)>;
void check_unary(const Unary& f, const Array& x) {
  require_gradcheck([f](const std::vector<Tensor>& in) { return f(in[0]); }, {x}, {"x"});
}
}  // namespace

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

TEST_CASE("neg, exp, tanh, sigmoid: VJPs agree with central differences", "[ops][unary][gradcheck]") {
  Generator g(23);
  for (const Shape& s : {Shape{}, Shape{1}, Shape{2, 3}, Shape{2, 1, 3}}) {
    const Array x = rnd(s, g, -2.0, 2.0);
    check_unary([](const Tensor& t) { return ops::neg(t); }, x);
    check_unary([](const Tensor& t) { return ops::exp(t); }, x);
    check_unary([](const Tensor& t) { return ops::tanh(t); }, x);
    check_unary([](const Tensor& t) { return ops::sigmoid(t); }, x);
  }
}

TEST_CASE("log, sqrt, pow: VJPs agree with central differences on their domain", "[ops][unary][gradcheck]") {
  Generator g(29);
  const Array pos = rnd({3, 4}, g, 0.3, 2.0);  // away from 0, where log and sqrt blow up
  check_unary([](const Tensor& t) { return ops::log(t); }, pos);
  check_unary([](const Tensor& t) { return ops::sqrt(t); }, pos);
  check_unary([](const Tensor& t) { return ops::pow(t, 2.5); }, pos);
  check_unary([](const Tensor& t) { return ops::pow(t, -1.0); }, pos);
  check_unary([](const Tensor& t) { return ops::pow(t, 3.0); }, rnd({2, 3}, g));  // integer: any sign
}

TEST_CASE("abs, relu, clamp: VJPs agree with central differences away from kinks",
          "[ops][unary][gradcheck]") {
  Generator g(31);
  // Inputs kept at |x| >= 0.1 so no finite-difference step crosses the kink at 0 (abs, relu)
  // or the clamp bounds at +-0.5 (values are drawn away from them below).
  const Array x = rnd_away_from_zero({3, 5}, g, 0.1);
  check_unary([](const Tensor& t) { return ops::abs(t); }, x);
  check_unary([](const Tensor& t) { return ops::relu(t); }, x);
  Array y = x.clone();
  for (std::size_t i = 0; i < y.size(); ++i)
    if (std::fabs(std::fabs(y.flat(i)) - 0.5) < 0.05) y.set_flat(i, y.flat(i) * 0.8);
  check_unary([](const Tensor& t) { return ops::clamp(t, -0.5, 0.5); }, y);
}

TEST_CASE("relu, abs, clamp: derivative conventions at the kinks", "[ops][unary]") {
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

TEST_CASE("gelu (exact and tanh): VJPs agree with central differences", "[ops][unary][gradcheck]") {
  Generator g(37);
  const Array x = rnd({4, 3}, g, -3.0, 3.0);
  check_unary([](const Tensor& t) { return ops::gelu(t); }, x);
  check_unary([](const Tensor& t) { return ops::gelu(t, ops::GeluApprox::tanh); }, x);
}

TEST_CASE("where: selects values and gradients; NaN in the other branch never leaks",
          "[ops][elementwise][gradcheck]") {
  Generator g(41);
  const BoolArray cond({2, 3}, {1, 0, 1, 0, 0, 1});
  require_gradcheck([&](const std::vector<Tensor>& in) { return ops::where(cond, in[0], in[1]); },
                    {rnd({2, 3}, g), rnd({3}, g)}, {"a", "b"});
  Tensor a(Array::of({1.0, NAN}), true);
  Tensor b(Array::of({5.0, 6.0}), true);
  const BoolArray pick_a({2}, {1, 0});
  Tensor y = ops::where(pick_a, a, b);
  CHECK(y.value().to_vector() == std::vector<double>{1.0, 6.0});
  ops::sum(y * y).backward();
  CHECK(a.grad().to_vector() == std::vector<double>{2.0, 0.0});
  CHECK(b.grad().to_vector() == std::vector<double>{0.0, 12.0});
}
