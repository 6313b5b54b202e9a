// Shape ops (ops/shape_ops.hpp): reshape, squeeze, unsqueeze, permute, transpose, broadcast_to.
#include <limits>

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

TEST_CASE("broadcast_to: every element of a large result in each form at 1 2 and 3 threads", "[ops][shape]") {
  // One value (0-d and one element of rank 1), a trailing block (a bias), leading values with
  // trailing ones, and the general strided case; small and large enough to run over the pool.
  // The expected value of each element comes from its multi-index, the source's axes of size 1
  // read at 0.
  struct Case {
    Shape from, to;
  };
  const Case cases[] = {{{}, {5, 40001}},          {{1}, {200003}},     {{37}, {5000, 37}},
                        {{1, 37}, {3, 1700, 37}},  {{5000, 1}, {5000, 37}}, {{3, 1}, {2, 3, 4}},
                        {{300, 1}, {7, 300, 50}},  {{2}, {3, 2}}};
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Generator g(71);
  for (const Case& c : cases)
    for (const DType dt : {DType::float32, DType::float64}) {
      const Array src = rnd(c.from, g).astype(dt);
      const std::vector<double> sv = src.to_vector();
      for (const int threads : {1, 2, 3}) {
        const ThreadCount scope(threads);
        INFO(shape_str(c.from) << " to " << shape_str(c.to) << ", " << dtype_name(dt) << ", " << threads
                               << " threads");
        { const Array dirty = Array::full(c.to, nan, dt); }  // its block goes back to the cache for `out`
        const Array out = ops::broadcast_to(Tensor(src), c.to).value();
        REQUIRE(out.shape() == c.to);
        const std::vector<double> ov = out.to_vector();
        const std::size_t rank = c.to.size(), lead = rank - c.from.size();
        std::size_t wrong = 0, first = ov.size();
        for (std::size_t i = 0; i < ov.size(); ++i) {
          std::size_t rem = i, at = 0, stride = 1;
          for (std::size_t d = rank; d-- > 0;) {  // out's index along axis d, mapped onto the source
            const std::size_t k = rem % c.to[d];
            rem /= c.to[d];
            if (d >= lead) {
              const std::size_t size = c.from[d - lead];
              at += (size == 1 ? 0 : k) * stride;
              stride *= size;
            }
          }
          if (!(ov[i] == sv[at]) && !wrong++) first = i;
        }
        INFO("first wrong element " << first << " of " << ov.size());
        CHECK(wrong == 0);
      }
    }
}
