// Bad input: each error names the op, the argument and the shapes or values involved.
#include <limits>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {
Tensor t(const Shape& s, DType d = DType::float64) { return zeros(s, d); }
}  // namespace

TEST_CASE("errors: every binary op names itself and both shapes on a mismatch", "[errors]") {
  const Tensor a = t({2, 3}), b = t({4, 5});
  using Op = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::pair<std::string, Op>> ops = {
      {"add", &ops::add}, {"sub", &ops::sub}, {"mul", &ops::mul}, {"div", &ops::div}};
  for (const auto& [name, op] : ops) {
    CHECK_THROWS_AS(op(a, b), ShapeError);
    CHECK_THROWS_WITH(op(a, b), Catch::Contains("[" + name + "]") && Catch::Contains("a has shape (2, 3)") &&
                                    Catch::Contains("b has shape (4, 5)"));
  }
  CHECK_THROWS_WITH(ops::where(BoolArray::filled({2, 3}, true), a, b), Catch::Contains("[where]"));
  CHECK_THROWS_WITH(ops::mse(a, t({3, 2})), Catch::Contains("[mse]") && Catch::Contains("(3, 2)"));
}

TEST_CASE("errors: matmul inner and batch dimensions", "[errors][matmul]") {
  CHECK_THROWS_AS(ops::matmul(t({2, 3}), t({4, 5})), ShapeError);
  CHECK_THROWS_WITH(ops::matmul(t({2, 3}), t({4, 5})),
                    Catch::Equals("[matmul] inner dimensions differ: a has shape (2, 3), b has shape (4, 5)"));
  CHECK_THROWS_WITH(ops::matmul(t({2, 3}), t({2, 3}), {false, false}), Catch::Contains("inner dimensions"));
  CHECK_NOTHROW(ops::matmul(t({2, 3}), t({2, 3}), {false, true}));
  CHECK_THROWS_WITH(ops::matmul(t({2, 2, 3}), t({3, 3, 4})),
                    Catch::Contains("[matmul] batch dimensions") && Catch::Contains("(2, 2, 3)") &&
                        Catch::Contains("(3, 3, 4)"));
  CHECK_THROWS_WITH(ops::matmul(t({2, 3}), t({3}), {false, true}), Catch::Contains("1-d operand"));
}

TEST_CASE("errors: dtype mismatch names both dtypes", "[errors]") {
  const Tensor a = t({2}, DType::float32), b = t({2}, DType::float64);
  CHECK_THROWS_AS(a + b, DTypeError);
  CHECK_THROWS_WITH(a * b, Catch::Contains("[mul]") && Catch::Contains("float32") && Catch::Contains("float64"));
  CHECK_THROWS_WITH(ops::matmul(t({2, 2}, DType::float32), t({2, 2})), Catch::Contains("[matmul]"));
  CHECK_THROWS_WITH(ops::concat({a, b}, 0), Catch::Contains("[concat]") && Catch::Contains("xs[1]"));
}

TEST_CASE("errors: bad axes name the op and the axis and the rank", "[errors]") {
  const Tensor x = t({2, 3});
  CHECK_THROWS_AS(ops::sum(x, {2}), AxisError);
  CHECK_THROWS_WITH(ops::sum(x, {2}), Catch::Contains("[sum]") && Catch::Contains("axis 2") &&
                                          Catch::Contains("2 dimension(s)"));
  CHECK_THROWS_WITH(ops::mean(x, {0, -2}), Catch::Contains("[mean]") && Catch::Contains("twice"));
  CHECK_THROWS_WITH(ops::softmax(x, -3), Catch::Contains("[softmax]") && Catch::Contains("-3"));
  CHECK_THROWS_WITH(ops::permute(x, {0, 0}), Catch::Contains("[permute]"));
  CHECK_THROWS_WITH(ops::transpose(t({3})), Catch::Contains("[transpose]") && Catch::Contains("(3)"));
  CHECK_THROWS_WITH(ops::squeeze(x, 0), Catch::Contains("[squeeze]") && Catch::Contains("size 2"));
  CHECK_THROWS_WITH(ops::concat({x}, 5), Catch::Contains("[concat]"));
}

TEST_CASE("errors: backward of a non-scalar without a seed and with a wrong seed", "[errors][tape]") {
  Tensor x(Array::of({1.0, 2.0}), true);
  Tensor y = x * 2.0;
  CHECK_THROWS_AS(y.backward(), TapeError);
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("[backward]") && Catch::Contains("(2)") &&
                                      Catch::Contains("seed"));
  CHECK_THROWS_WITH(y.backward(Array::of({1.0, 2.0, 3.0})), Catch::Contains("seed has shape (3)"));
  CHECK_THROWS_AS(Tensor(Array::of({1.0})).backward(), TapeError);  // needs no grad
}

TEST_CASE("errors: backward twice on a consumed tape", "[errors][tape]") {
  Tensor x(Array::of({1.0}), true);
  Tensor y = ops::sum(x * x);
  y.backward();
  CHECK_THROWS_AS(y.backward(), TapeError);
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("consumed"));
}

TEST_CASE("errors: shape ops name the shapes", "[errors]") {
  const Tensor x = t({2, 3});
  CHECK_THROWS_WITH(ops::reshape(x, {4, 2}), Catch::Contains("[reshape]") && Catch::Contains("(2, 3)") &&
                                                 Catch::Contains("(4, 2)"));
  CHECK_THROWS_WITH(ops::reshape(x, {-1, -1}), Catch::Contains("more than one -1"));
  CHECK_THROWS_WITH(ops::broadcast_to(x, {3, 3}), Catch::Contains("[broadcast_to]"));
  CHECK_THROWS_WITH(ops::concat({x, t({3, 2})}, 0), Catch::Contains("xs[1] has shape (3, 2)"));
  CHECK_THROWS_WITH(ops::split(x, {1, 1}, 1), Catch::Contains("[split]") && Catch::Contains("length 3"));
  CHECK_THROWS_WITH(ops::chunk(x, 2, 1), Catch::Contains("[chunk]"));
  CHECK_THROWS_WITH(ops::slice(x, 0, 0, 1, 0), Catch::Contains("step"));
}

TEST_CASE("errors: indices out of range name the position and the value", "[errors]") {
  const Tensor w = t({3, 2});
  CHECK_THROWS_WITH(ops::embedding(w, IndexArray{0, 3}), Catch::Contains("[embedding]") &&
                                                            Catch::Contains("index 3 at position 1"));
  CHECK_THROWS_WITH(ops::index_select(w, 1, IndexArray{-1}), Catch::Contains("[index_select]"));
  CHECK_THROWS_WITH(ops::gather(w, 0, IndexArray{0}), Catch::Contains("same rank"));
  CHECK_THROWS_WITH(ops::cross_entropy(t({2, 3}), IndexArray{0, 5}),
                    Catch::Contains("[cross_entropy]") && Catch::Contains("target 5 at position 1"));
  ops::CrossEntropyOptions o;
  o.ignore_index = 0;
  CHECK_THROWS_WITH(ops::cross_entropy(t({2, 3}), IndexArray{0, 0}, o), Catch::Contains("no target left"));
  CHECK_THROWS_WITH(ops::cross_entropy(t({2, 3}), IndexArray{0}), Catch::Contains("targets have shape (1)"));
}

TEST_CASE("errors: values that would silently become NaN are refused", "[errors]") {
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(ops::softmax(Tensor(Array::of({{0.0, 1.0}, {-inf, -inf}}))),
                    Catch::Contains("[softmax]") && Catch::Contains("row 1") && Catch::Contains("no finite entry"));
  CHECK_THROWS_WITH(ops::log_softmax(Tensor(Array::of({0.0, NAN}))), Catch::Contains("[log_softmax]"));
  CHECK_THROWS_WITH(ops::log(Tensor(Array::of({1.0, -2.0}))), Catch::Contains("[log]") && Catch::Contains("flat index 1"));
  CHECK_THROWS_WITH(ops::sqrt(Tensor(Array::of({-1.0}))), Catch::Contains("[sqrt]"));
  CHECK_THROWS_WITH(ops::pow(Tensor(Array::of({-1.0})), 0.5), Catch::Contains("[pow]"));
  CHECK_THROWS_WITH(ops::div(Tensor(Array::of({0.0})), Tensor(Array::of({0.0}))), Catch::Contains("[div] 0/0"));
  CHECK_THROWS_WITH(ops::add_mask(t({2}), Array::of({0.0, NAN})), Catch::Contains("[add_mask]"));
  Generator g(1);
  CHECK_THROWS_WITH(ops::dropout(t({2}), 1.5, g), Catch::Contains("[dropout]") && Catch::Contains("1.5"));
  CHECK_THROWS_WITH(ops::layer_norm(t({2, 3}), t({2})), Catch::Contains("[layer_norm]") && Catch::Contains("gamma"));
  CHECK_THROWS_WITH(ops::var(t({1, 3}), {0}), Catch::Contains("[var]"));
  CHECK_THROWS_WITH(ops::clamp(t({1}), 1.0, 0.0), Catch::Contains("[clamp]"));
}

TEST_CASE("errors: element counts that overflow / huge slice steps / empty softmax axes", "[errors]") {
  CHECK_THROWS_WITH(Array::zeros({3, std::size_t(0xAAAAAAAAAAAAAAABull)}, DType::float64),
                    Catch::Contains("[shape]") && Catch::Contains("more elements than fit"));
  CHECK(numel({0, std::size_t(-1), std::size_t(-1)}) == 0);  // a zero axis: no overflow, no elements
  const Tensor x(Array::of({0.0, 1.0, 2.0, 3.0, 4.0}));
  CHECK(ops::slice(x, 0, 0, 5, std::numeric_limits<long>::max()).value().to_vector() == std::vector<double>{0});
  CHECK(ops::slice(x, 0, 1, 5, 3).value().to_vector() == std::vector<double>{1, 4});
  CHECK_THROWS_WITH(ops::softmax(Tensor(Array::zeros({2, 0}, DType::float64))),
                    Catch::Contains("[softmax]") && Catch::Contains("length 0"));
  CHECK(ops::softmax(Tensor(Array::zeros({0, 3}, DType::float64))).shape() == Shape{0, 3});  // no rows: fine
}
