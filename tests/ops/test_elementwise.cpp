// Binary elementwise ops (ops/elementwise.hpp): forward values with broadcasting and size-1 axes,
// scalar operands, dtypes, where. The unary ops: tests/ops/test_unary.cpp. Their gradient checks
// live in checks/op_checks.cpp ("ops/add-broadcasting", ...) and run as test cases of their own
// (tests/checks/test_builtin_checks.cpp).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("add: values broadcast like NumPy", "[ops][elementwise]") {
  const Tensor a(Array::of({{1.0, 2.0, 3.0}})), b(Array::from_vector({2, 1}, {10.0, 20.0}, DType::float64));
  const Tensor c = a + b;
  CHECK(c.shape() == Shape{2, 3});
  CHECK(c.value().to_vector() == std::vector<double>{11, 12, 13, 21, 22, 23});
}

TEST_CASE("scalar operators: x*2 1-x 2/x and -x", "[ops][elementwise]") {
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
// The first flat index at which a and b differ in their bits (a sign of zero included), with both
// values at full precision; empty when every bit agrees. float64 holds every float32 exactly.
std::string first_bit_difference(const Array& a, const Array& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  if (x.size() != y.size()) return "sizes " + std::to_string(x.size()) + " and " + std::to_string(y.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    std::uint64_t bx = 0, by = 0;
    std::memcpy(&bx, &x[i], sizeof bx);
    std::memcpy(&by, &y[i], sizeof by);
    if (bx != by) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "index %zu: %.17g against %.17g", i, x[i], y[i]);
      return buf;
    }
  }
  return "";
}
}  // namespace

TEST_CASE("a tensor and a number: the values and gradients of the binary op against scalar_like",
          "[ops][elementwise]") {
  // x (op) s is recorded as one op with one input; x (op) scalar_like(x, s) as a 0-d tensor and a
  // broadcast binary op. Both must give the same bits, forward and backward, in both dtypes.
  Generator gen(71);
  using Form = Tensor (*)(const Tensor&, double);
  using Binary = Tensor (*)(const Tensor&, const Tensor&);
  struct Case {
    const char* name;
    Form with_number;
    Binary binary;
    bool number_first;
  };
  const Case cases[] = {
      {"x + s", [](const Tensor& x, double s) { return x + s; }, &ops::add, false},
      {"x - s", [](const Tensor& x, double s) { return x - s; }, &ops::sub, false},
      {"x * s", [](const Tensor& x, double s) { return x * s; }, &ops::mul, false},
      {"x / s", [](const Tensor& x, double s) { return x / s; }, &ops::div, false},
      {"s + x", [](const Tensor& x, double s) { return s + x; }, &ops::add, true},
      {"s * x", [](const Tensor& x, double s) { return s * x; }, &ops::mul, true},
  };
  for (const DType dt : {DType::float32, DType::float64})
    for (const Shape& shape : {Shape{}, Shape{7}, Shape{3, 5}})
      for (const double s : {0.1, -3.7, 1e-8, 2.0})
        for (const Case& c : cases) {
          INFO(c.name << " with s = " << s << ", " << dtype_name(dt) << ", shape " << shape_str(shape));
          const Array xv = rnd(shape, gen).astype(dt);
          const Array wv = rnd(shape, gen).astype(dt);
          Tape tape;
          Tensor x1(xv, true), x2(xv, true);
          const Tensor w(wv);
          const Tensor y1 = c.with_number(x1, s);
          REQUIRE(tape.size() == 1);  // one op, of one input
          CHECK(tape.inputs_at(0) == 1);
          const Tensor k = ops::scalar_like(x2, s);
          const Tensor y2 = c.number_first ? c.binary(k, x2) : c.binary(x2, k);
          REQUIRE(tape.size() == 2);  // the binary op, of two inputs (the constant one of them)
          CHECK(tape.inputs_at(1) == 2);
          CHECK(tape.op_at(0) == tape.op_at(1));
          CHECK(y1.dtype() == dt);
          CHECK(y1.shape() == shape);
          CHECK(first_bit_difference(y1.value(), y2.value()) == "");
          BackwardOptions keep;
          keep.retain_graph = true;  // y2's nodes are on the same tape
          backward(ops::sum(y1 * w), Array(), keep);
          ops::sum(y2 * w).backward();
          REQUIRE(x1.has_grad());
          REQUIRE(x2.has_grad());
          CHECK(first_bit_difference(x1.grad(), x2.grad()) == "");
        }
}

TEST_CASE("a tensor and a number: 0/0 and an undefined tensor are errors naming the op", "[ops][elementwise]") {
  // The first element is 1/0 = inf: the 0/0 after it is found all the same, by both forms.
  const Tensor x(Array::of({1.0, 0.0, -2.0}));
  CHECK_THROWS_WITH(x / 0.0, Catch::Contains("[div] 0/0 at output flat index 1") &&
                                 Catch::Contains("divided by a number that is 0 in float64"));
  // 1e-50 is 0 in float32, as scalar_like makes it: the same refusal.
  const Tensor x32(Array::of({0.0, 1.0}, DType::float32));
  CHECK_THROWS_WITH(x32 / 1e-50, Catch::Contains("[div] 0/0 at output flat index 0") &&
                                     Catch::Contains("divided by a number that is 0 in float32"));
  CHECK_THROWS_WITH(x32 / ops::scalar_like(x32, 1e-50), Catch::Contains("[div] 0/0 at output flat index 0"));
  CHECK_THROWS_WITH(x / ops::scalar_like(x, 0.0), Catch::Contains("[div] 0/0 at output flat index 1"));
  const Tensor nonzero(Array::of({1.0, -2.0}));
  const std::vector<double> inf = (nonzero / 0.0).value().to_vector();  // as the binary op: IEEE
  CHECK(inf == std::vector<double>{INFINITY, -INFINITY});
  const Tensor undefined;
  CHECK_THROWS_WITH(undefined * 2.0, Catch::Contains("[mul] a is an undefined Tensor"));
  CHECK_THROWS_WITH(3.0 + undefined, Catch::Contains("[add] a is an undefined Tensor"));
  CHECK_THROWS_WITH(undefined - 1.0, Catch::Contains("[sub] a is an undefined Tensor"));
  CHECK_THROWS_WITH(undefined / 1.0, Catch::Contains("[div] a is an undefined Tensor"));
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
