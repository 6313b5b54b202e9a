// concat, slice, split and chunk (ops/join.hpp): values and VJPs.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("concat: values along any axis", "[ops][join]") {
  const Tensor a(Array::of({{1.0, 2.0}})), b(Array::of({{3.0, 4.0}, {5.0, 6.0}}));
  CHECK(ops::concat({a, b}, 0).value().to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("slice/split/chunk: values", "[ops][join]") {
  const Tensor x(Array::of({0.0, 1.0, 2.0, 3.0, 4.0, 5.0}));
  CHECK(ops::slice(x, 0, 1, 5, 2).value().to_vector() == std::vector<double>{1, 3});
  CHECK(ops::slice(x, 0, -2, 100).value().to_vector() == std::vector<double>{4, 5});
  const auto parts = ops::split(x, {1, 2, 3}, 0);
  CHECK(parts[2].value().to_vector() == std::vector<double>{3, 4, 5});
  CHECK(ops::chunk(x, 3, 0)[1].value().to_vector() == std::vector<double>{2, 3});
}
