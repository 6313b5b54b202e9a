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

TEST_CASE("permute/transpose: values", "[ops][shape]") {
  const Tensor x(Array::of({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}));
  CHECK(ops::transpose(x).value().to_vector() == std::vector<double>{1, 4, 2, 5, 3, 6});
  Generator g(61);
  const Array a = rnd({2, 3, 4}, g);
  const Tensor p = ops::permute(Tensor(a), {2, 0, 1});
  CHECK(p.shape() == Shape{4, 2, 3});
  CHECK(p.value().at({3, 1, 2}) == a.at({1, 2, 3}));
}

TEST_CASE("broadcast_to: values", "[ops][shape]") {
  Generator g(67);
  const Array x = rnd({3, 1}, g);
  const Tensor y = ops::broadcast_to(Tensor(x), {2, 3, 4});
  CHECK(y.shape() == Shape{2, 3, 4});
  CHECK(y.value().at({1, 2, 3}) == x.at({2, 0}));
}
