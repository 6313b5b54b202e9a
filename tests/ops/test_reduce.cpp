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

TEST_CASE("sum, mean: VJPs agree with central differences over any axes", "[ops][reduce][gradcheck]") {
  Generator g(43);
  const Array x = rnd({2, 1, 3}, g);
  for (const Axes& ax : kAxisSets)
    for (bool keep : {false, true}) {
      require_gradcheck([&](const std::vector<Tensor>& in) { return ops::sum(in[0], ax, keep); }, {x});
      require_gradcheck([&](const std::vector<Tensor>& in) { return ops::mean(in[0], ax, keep); }, {x});
    }
}

TEST_CASE("var: VJP agrees with central differences (correction 0 and 1)", "[ops][reduce][gradcheck]") {
  Generator g(47);
  const Array x = rnd({3, 4}, g);
  for (const Axes& ax : {Axes{}, Axes{0}, Axes{1}})
    for (int corr : {0, 1})
      require_gradcheck([&](const std::vector<Tensor>& in) { return ops::var(in[0], ax, corr, true); }, {x});
}

TEST_CASE("max: VJP agrees with central differences on inputs without ties", "[ops][reduce][gradcheck]") {
  Generator g(53);
  // Distinct values spaced 0.1 apart and shuffled: no tie, and a step of 1e-6 cannot
  // change which element is the maximum.
  std::vector<double> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * static_cast<double>(i);
  for (std::size_t i = v.size(); i-- > 1;) std::swap(v[i], v[g.below(i + 1)]);
  const Array x = Array::from_vector({2, 3, 4}, v, DType::float64);
  for (const Axes& ax : kAxisSets)
    require_gradcheck([&](const std::vector<Tensor>& in) { return ops::max(in[0], ax); }, {x});
}

TEST_CASE("max: tie rule splits the gradient equally among maximal elements", "[ops][reduce]") {
  Tensor x(Array::of({{1.0, 3.0, 3.0}, {2.0, 2.0, 2.0}}), true);
  Tensor m = ops::max(x, {1});
  CHECK(m.value().to_vector() == std::vector<double>{3, 2});
  m.backward(Array::of({1.0, 6.0}));
  CHECK(x.grad().to_vector() == std::vector<double>{0, 0.5, 0.5, 2, 2, 2});
}
