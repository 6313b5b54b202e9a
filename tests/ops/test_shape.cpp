// Shape ops (ops/shape_ops.hpp): reshape, squeeze, unsqueeze, permute, transpose, broadcast_to.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("reshape: infers -1 and keeps element order", "[ops][shape]") {
  const Tensor x(Array::of({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}));
  const Tensor y = ops::reshape(x, {3, -1});
  CHECK(y.shape() == Shape{3, 2});
  CHECK(y.value().to_vector() == x.value().to_vector());
}

TEST_CASE("reshape, squeeze, unsqueeze: VJPs agree with central differences", "[ops][shape][gradcheck]") {
  Generator g(59);
  const Array x = rnd({2, 1, 3}, g);
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::reshape(in[0], {3, 2}); }, {x});
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::squeeze(in[0], 1); }, {x});
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::unsqueeze(in[0], -1); }, {x});
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::unsqueeze(in[0], 0); }, {x});
}

TEST_CASE("permute/transpose: values and VJPs", "[ops][shape][gradcheck]") {
  const Tensor x(Array::of({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}));
  CHECK(ops::transpose(x).value().to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
  Generator g(61);
  const Array a = rnd({2, 3, 4}, g);
  const Tensor p = ops::permute(Tensor(a), {2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.value().at({3, 1, 2}) == a.at({1, 2, 3}));
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::permute(in[0], {2, 0, 1}); }, {a});
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::transpose(in[0], 0, 2); }, {a});
}

TEST_CASE("broadcast_to: values and VJP sums back", "[ops][shape][gradcheck]") {
  Generator g(67);
  const Array x = rnd({3, 1}, g);
  const Tensor y = ops::broadcast_to(Tensor(x), {2, 3, 4});
  CHECK(y.shape() == Shape{2, 3, 4});
  CHECK(y.value().at({1, 2, 3}) == x.at({2, 0}));
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::broadcast_to(in[0], {2, 3, 4}); }, {x});
}
