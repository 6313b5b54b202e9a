// Shape ops, concat/split/slice and indexing: values and gradchecks.
#include "helpers.hpp"

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

TEST_CASE("concat: values along any axis and VJP", "[ops][join][gradcheck]") {
  const Tensor a(Array::of({{1.0, 2.0}})), b(Array::of({{3.0, 4.0}, {5.0, 6.0}}));
  CHECK(ops::concat({a, b}, 0).value().to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});
  Generator g(71);
  const Array x = rnd({2, 1, 3}, g), y = rnd({2, 2, 3}, g), z = rnd({2, 3, 3}, g);
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::concat(in, 1); }, {x, y, z}, {"x", "y", "z"});
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::concat(in, -1); },
                    {rnd({2, 2}, g), rnd({2, 3}, g)});
}

TEST_CASE("slice/split/chunk: values and VJPs", "[ops][join][gradcheck]") {
  const Tensor x(Array::of({0.0, 1.0, 2.0, 3.0, 4.0, 5.0}));
  CHECK(ops::slice(x, 0, 1, 5, 2).value().to_vector() == std::vector<double>{1, 3});
  CHECK(ops::slice(x, 0, -2, 100).value().to_vector() == std::vector<double>{4, 5});
  const auto parts = ops::split(x, {1, 2, 3}, 0);
  CHECK(parts[2].value().to_vector() == std::vector<double>{3, 4, 5});
  CHECK(ops::chunk(x, 3, 0)[1].value().to_vector() == std::vector<double>{2, 3});
  Generator g(73);
  const Array a = rnd({3, 5, 2}, g);
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::slice(in[0], 1, 1, 5, 2); }, {a});
  // The pieces of a split recombined with different weights: each piece's VJP is checked.
  require_gradcheck([](const std::vector<Tensor>& in) {
    const auto p = ops::split(in[0], {2, 3}, 1);
    return ops::concat({p[1] * 2.0, p[0] * -1.0}, 1);
  }, {a});
}

TEST_CASE("index_select, gather, embedding: values and scatter-add VJPs", "[ops][index][gradcheck]") {
  const Tensor w(Array::of({{0.0, 0.5}, {1.0, 1.5}, {2.0, 2.5}}));
  const Tensor e = ops::embedding(w, IndexArray({2, 2}, {2, 0, 2, 1}));
  CHECK(e.shape() == Shape{2, 2, 2});
  CHECK(e.value().to_vector() == std::vector<double>{2, 2.5, 0, 0.5, 2, 2.5, 1, 1.5});
  const Tensor gth = ops::gather(w, 1, IndexArray({3, 1}, {1, 0, 1}));
  CHECK(gth.value().to_vector() == std::vector<double>{0.5, 1.0, 2.5});
  Generator g(79);
  const Array x = rnd({4, 3}, g);
  // Repeated indices check that gradients are summed, not overwritten.
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::index_select(in[0], 0, IndexArray{3, 1, 3}); }, {x});
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::index_select(in[0], 1, IndexArray{2, 2}); }, {x});
  require_gradcheck([](const std::vector<Tensor>& in) {
    return ops::gather(in[0], 1, IndexArray({4, 2}, {0, 2, 1, 1, 2, 0, 0, 0}));
  }, {x});
  require_gradcheck([](const std::vector<Tensor>& in) {
    return ops::embedding(in[0], IndexArray({2, 3}, {0, 3, 3, 1, 2, 0}));
  }, {x});
}
