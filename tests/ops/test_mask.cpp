// add_mask and masked_fill (ops/mask.hpp): exact -inf, gradients only where visible.
#include <cmath>
#include <limits>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/ops/dropout.hpp>

using namespace xg;
using namespace xgt;

namespace {
const double kInf = std::numeric_limits<double>::infinity();
}

TEST_CASE("add_mask: -inf positions are exactly -inf and get zero gradient and NaN cannot leak",
          "[ops][mask]") {
  Tensor u(Array::of({{NAN, 1.0, 2.0}}), true);
  const Array forbid_first = Array::of({{-kInf, 0.0, 0.0}});
  Tensor a = ops::softmax(ops::add_mask(u, forbid_first));
  REQUIRE(a.value().all_finite());
  CHECK(a.value().at({0, 0}) == 0.0);
  a.backward(Array::of({{1.0, 2.0, 3.0}}));
  CHECK(u.grad().at({0, 0}) == 0.0);
  CHECK(u.grad().all_finite());
}

TEST_CASE("masked_fill: replaces where true with gradient only where false", "[ops][mask]") {
  const BoolArray m({1, 3}, {1, 0, 0});
  Tensor x(Array::of({{INFINITY, 1.0, 2.0}}), true);
  Tensor y = ops::masked_fill(x, m, 0.0);
  CHECK(y.value().to_vector() == std::vector<double>{0, 1, 2});
  ops::sum(y * y).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{0, 2, 4});
}
