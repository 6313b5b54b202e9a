// The losses: cross_entropy (with ignore_index and weights) and mse.
#include <cmath>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("cross_entropy: equals the average of -log softmax at the target", "[ops][loss]") {
  const Array z = Array::of({{2.0, 1.0, 0.1}, {0.5, 2.5, 0.3}});
  const Tensor L = ops::cross_entropy(Tensor(z), IndexArray{0, 2});
  const double l0 = -std::log(std::exp(2.0) / (std::exp(2.0) + std::exp(1.0) + std::exp(0.1)));
  const double l1 = -std::log(std::exp(0.3) / (std::exp(0.5) + std::exp(2.5) + std::exp(0.3)));
  CHECK(L.item() == Approx((l0 + l1) / 2));
  // ignore_index drops a row from the average.
  ops::CrossEntropyOptions o;
  o.ignore_index = -1;
  CHECK(ops::cross_entropy(Tensor(z), IndexArray{0, -1}, o).item() == Approx(l0));
  // Per-token weights: a weighted mean.
  o.weights = Array::of({1.0, 3.0});
  CHECK(ops::cross_entropy(Tensor(z), IndexArray{0, 2}, o).item() == Approx((l0 + 3 * l1) / 4));
}

TEST_CASE("cross_entropy: the gradient is (softmax - onehot) / N",
          "[ops][loss]") {
  Generator g(167);
  const Array z = rnd({2, 3, 4}, g, -2, 2);
  const IndexArray t({2, 3}, {0, 3, 1, 2, 2, 0});
  Tensor zt(z, true);
  ops::cross_entropy(zt, t).backward();
  const Array p = ops::softmax(Tensor(z)).value();
  for (std::size_t r = 0; r < 6; ++r)
    for (std::size_t c = 0; c < 4; ++c) {
      const double expect = (p.flat(r * 4 + c) - (static_cast<std::int64_t>(c) == t.data[r] ? 1.0 : 0.0)) / 6.0;
      CHECK(zt.grad().flat(r * 4 + c) == Approx(expect).margin(1e-15));
    }
}

TEST_CASE("mse: value", "[ops][loss]") {
  CHECK(ops::mse(Tensor(Array::of({1.0, 2.0})), Tensor(Array::of({0.0, 4.0}))).item() == Approx(2.5));
}
