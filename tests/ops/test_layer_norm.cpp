// layer_norm: the fused op, its VJP, and its composition as the oracle.
#include <cmath>
#include <limits>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("layer_norm: normalised rows have mean 0 and variance 1 before the affine part", "[ops][layer_norm]") {
  Generator g(157);
  const Tensor x(rnd({4, 6}, g, -3, 3));
  const Tensor y = ops::layer_norm(x, Tensor(), Tensor(), 1e-12);
  const auto m = ops::mean(y, {-1}).value().to_vector();
  const auto v = ops::var(y, {-1}, 0).value().to_vector();
  for (double a : m) CHECK(std::fabs(a) < 1e-12);
  for (double a : v) CHECK(a == Approx(1.0).epsilon(1e-9));
  const Tensor gamma(Array::of({1, 2, 3, 4, 5, 6})), beta(Array::full({6}, 0.5, DType::float64));
  const Tensor z = ops::layer_norm(x, gamma, beta, 1e-12);
  CHECK(z.value().at({2, 3}) == Approx(y.value().at({2, 3}) * 4 + 0.5));
}

TEST_CASE("layer_norm: the fused op equals its composition from mean/sub/sqrt/div (values and VJP to 1e-12)",
          "[ops][layer_norm]") {
  Generator g(33);
  for (const Shape& s : {Shape{5}, Shape{3, 7}, Shape{2, 300, 16}}) {  // the last spans several chunks
    for (int affine = 0; affine < 2; ++affine) {
      INFO("shape " << shape_str(s) << ", affine " << affine);
      const Tensor x(rnd(s, g, -3, 3), true);
      const Tensor gamma = affine ? Tensor(rnd({s.back()}, g), true) : Tensor();
      const Tensor beta = affine ? Tensor(rnd({s.back()}, g), true) : Tensor();
      const Array G = rnd(s, g);
      const Tensor a = ops::layer_norm(x, gamma, beta);
      const Tensor b = ops::layer_norm_composed(x, gamma, beta);
      require_close(a.value(), b.value(), 1e-12);
      std::vector<Tensor> wrt{x};
      if (affine) wrt.insert(wrt.end(), {gamma, beta});
      BackwardOptions keep;
      keep.retain_graph = true;  // a and b share the tape
      const auto ga = grad(a, wrt, G, keep), gb = grad(b, wrt, G);
      for (std::size_t k = 0; k < wrt.size(); ++k) require_close(ga[k], gb[k], 1e-12);
    }
  }
}

TEST_CASE("layer_norm: eps that is not positive and finite is a ValueError naming the op", "[ops][layer_norm]") {
  Generator g(5);
  const Tensor x(rnd({2, 3}, g, -3, 3));
  for (double eps : {std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                     std::numeric_limits<double>::quiet_NaN(), 0.0, -1e-5}) {
    INFO("eps " << eps);
    CHECK_THROWS_WITH(ops::layer_norm(x, Tensor(), Tensor(), eps),
                      Catch::StartsWith("[layer_norm] eps must be positive and finite"));
    CHECK_THROWS_AS(ops::layer_norm_composed(x, Tensor(), Tensor(), eps), ValueError);
  }
  CHECK_NOTHROW(ops::layer_norm(x, Tensor(), Tensor(), 1e-5));
}
