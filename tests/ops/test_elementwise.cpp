// Binary elementwise ops (ops/elementwise.hpp): forward values with broadcasting and size-1 axes,
// scalar operands, dtypes, where. The unary ops: tests/ops/test_unary.cpp. Their gradient checks
// live in checks/op_checks.cpp ("ops/add-broadcasting", ...) and run as test cases of their own
// (tests/checks/test_builtin_checks.cpp).
#include <cmath>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("add: values broadcast like NumPy", "[ops][elementwise]") {
  const Tensor a(Array::of({{1.0, 2.0, 3.0}})), b(Array::from_vector({2, 1}, {10.0, 20.0}, DType::float64));
  const Tensor c = a + b;
  CHECK(c.shape() == Shape{2, 3});
  CHECK(c.value().to_vector() == std::vector<double>{11, 12, 13, 21, 22, 23});
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

TEST_CASE("where: selects values and gradients and NaN in the other branch never leaks",
          "[ops][elementwise]") {
  Tensor a(Array::of({1.0, NAN}), true);
  Tensor b(Array::of({5.0, 6.0}), true);
  const BoolArray pick_a({2}, {1, 0});
  Tensor y = ops::where(pick_a, a, b);
  CHECK(y.value().to_vector() == std::vector<double>{1.0, 6.0});
  ops::sum(y * y).backward();
  CHECK(a.grad().to_vector() == std::vector<double>{2.0, 0.0});
  CHECK(b.grad().to_vector() == std::vector<double>{0.0, 12.0});
}
