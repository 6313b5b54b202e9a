// Reductions: values, keepdims, tie rule, and gradchecks over axis sets.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {
const std::vector<Axes> kAxisSets = {{}, {0}, {-1}, {0, 2}, {1}, {-3, -1}};
}

TEST_CASE("sum/mean: values and shapes with and without keepdims", "[ops][reduce]") {
  const Tensor x(Array::of({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}));
  CHECK(ops::sum(x).item() == 21);
  CHECK(ops::sum(x, {0}).value().to_vector() == std::vector<double>{5, 7, 9});
  CHECK(ops::sum(x, {1}, true).shape() == Shape{2, 1});
  CHECK(ops::mean(x, {-1}).value().to_vector() == std::vector<double>{2, 5});
  CHECK(ops::sum(x, {0, 1}, true).shape() == Shape{1, 1});
  CHECK(ops::max(x, {0}).value().to_vector() == std::vector<double>{4, 5, 6});
  CHECK(ops::var(x, {1}).value().to_vector() == std::vector<double>{1, 1});           // unbiased
  CHECK(ops::var(x, {1}, 0).value().at({0}) == Approx(2.0 / 3.0));                  // population
}

TEST_CASE("max: tie rule splits the gradient equally among maximal elements", "[ops][reduce]") {
  Tensor x(Array::of({{1.0, 3.0, 3.0}, {2.0, 2.0, 2.0}}), true);
  Tensor m = ops::max(x, {1});
  CHECK(m.value().to_vector() == std::vector<double>{3, 2});
  m.backward(Array::of({1.0, 6.0}));
  CHECK(x.grad().to_vector() == std::vector<double>{0, 0.5, 0.5, 2, 2, 2});
}
