// concat, slice, split and chunk (ops/join.hpp): values and VJPs.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

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
