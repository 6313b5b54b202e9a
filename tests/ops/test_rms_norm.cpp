// rms_norm (ops/rms_norm.hpp): values and gradients worked out by hand, the fused op against its
// composition, numerically hard inputs (bad input: tests/ops/test_swiglu.cpp, with swiglu).
#include <cmath>
#include <limits>
#include <sstream>

#include "tests/support/helpers.hpp"
#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/suite.hpp>

using namespace xg;
using namespace xgt;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

}  // namespace

// Worked by hand: row [1, 2, 2, 4] has mean square 25/4, so with eps 2.75 r = 1/3; row
// [-3, 0, 0, 0] has mean square 9/4, r = 1/sqrt(5); the zero row has r = 1/sqrt(2.75).
// With y_bar = 1 and w = [1, 2, 3, 0.5], gh = w and x_bar = r (gh - xh mean(gh xh)):
// row 0: mean(gh xh) = (1/3 + 4/3 + 2 + 2/3) / 4 = 13/12, x_bar = [23, 46, 82, -34] / 108;
// row 1: x_bar = w / sqrt(2.75); row 2: mean(gh xh) = -3/(4 sqrt 5), x_bar = [0.55, 2, 3, 0.5] / sqrt 5;
// w_bar = sum of the rows' xh = [1/3 - 3/sqrt 5, 2/3, 2/3, 4/3].
TEST_CASE("rms_norm: values and gradients equal the ones worked out by hand", "[ops][rms_norm][llama]") {
  const double s5 = std::sqrt(5.0), s275 = std::sqrt(2.75);
  const std::vector<double> x{1, 2, 2, 4, 0, 0, 0, 0, -3, 0, 0, 0}, w{1, 2, 3, 0.5};
  const std::vector<double> y{1.0 / 3, 4.0 / 3, 2, 2.0 / 3, 0, 0, 0, 0, -3 / s5, 0, 0, 0};
  const std::vector<double> dx{23.0 / 108, 46.0 / 108, 82.0 / 108, -34.0 / 108, 1 / s275, 2 / s275, 3 / s275,
                               0.5 / s275, 0.55 / s5,  2 / s5,      3 / s5,      0.5 / s5};
  const std::vector<double> dw{1.0 / 3 - 3 / s5, 2.0 / 3, 2.0 / 3, 4.0 / 3};
  for (DType dt : {DType::float64, DType::float32}) {
    INFO(dtype_name(dt));
    const double tol = dt == DType::float64 ? 1e-15 : 1e-6;
    const Tensor X(Array::from_vector({3, 4}, x, dt), true), W(Array::from_vector({4}, w, dt), true);
    const Tensor Y = ops::rms_norm(X, W, 2.75);
    require_close(Y.value(), Array::from_vector({3, 4}, y, dt), tol);
    const auto g = grad(Y, {X, W}, Array::full({3, 4}, 1.0, dt));
    require_close(g[0], Array::from_vector({3, 4}, dx, dt), tol);
    require_close(g[1], Array::from_vector({4}, dw, dt), tol);
    // Without a weight: the same rows, unscaled.
    const Tensor Y1 = ops::rms_norm(X, Tensor(), 2.75);
    CHECK(Y1.value().at({0, 3}) == Approx(4.0 / 3).epsilon(tol));
    CHECK(Y1.value().at({2, 0}) == Approx(-3 / s5).epsilon(tol));
  }
}

TEST_CASE("rms_norm: the fused op equals its composition from mul/mean/add/sqrt/div (values and VJP)",
          "[ops][rms_norm][llama]") {
  // float64 to 1e-12; float32 within 1e-6 (values) and 5e-6 (gradients), scaled by max(1, |composed|):
  // both sides round in float32 (the fused op sums squares in double, the composition in
  // float). Measured: 3e-7 and 1.2e-6 (the weight gradient summed over 600 rows).
  Generator g(71);
  for (DType dt : {DType::float64, DType::float32}) {
    const double tol_y = dt == DType::float64 ? 1e-12 : 1e-6, tol_g = dt == DType::float64 ? 1e-12 : 5e-6;
    for (const Shape& s : {Shape{5}, Shape{3, 7}, Shape{2, 300, 16}, Shape{4, 288}}) {  // 600 rows span several chunks
      for (int weighted = 0; weighted < 2; ++weighted) {
        INFO(dtype_name(dt) << ", shape " << shape_str(s) << ", weight " << weighted);
        const Tensor x(rnd(s, g, -3, 3).astype(dt), true);
        const Tensor w = weighted ? Tensor(rnd({s.back()}, g, 0.5, 1.5).astype(dt), true) : Tensor();
        const Array G = rnd(s, g).astype(dt);
        const Tensor a = ops::rms_norm(x, w, 1e-5);
        const Tensor b = ops::rms_norm_composed(x, w, 1e-5);
        CHECK(max_scaled_diff(a.value(), b.value()) <= tol_y);
        std::vector<Tensor> wrt{x};
        if (weighted) wrt.push_back(w);
        BackwardOptions keep;
        keep.retain_graph = true;  // a and b share the tape
        const auto ga = grad(a, wrt, G, keep), gb = grad(b, wrt, G);
        for (std::size_t k = 0; k < wrt.size(); ++k) CHECK(max_scaled_diff(ga[k], gb[k]) <= tol_g);
      }
    }
  }
}

TEST_CASE("rms_norm: a row of zeros stays finite (y 0 and x_bar = g w / sqrt(eps)) even with a tiny eps",
          "[ops][rms_norm][llama]") {
  for (DType dt : {DType::float64, DType::float32}) {
    INFO(dtype_name(dt));
    const double eps = dt == DType::float64 ? 1e-30 : 1e-12;
    const Tensor x(Array::zeros({2, 3}, dt), true), w(Array::from_vector({3}, {1, -2, 0.5}, dt), true);
    const Tensor y = ops::rms_norm(x, w, eps);
    for (double v : y.value().to_vector()) CHECK(v == 0.0);
    const auto gr = grad(y, {x, w}, Array::from_vector({2, 3}, {1, 1, 1, 2, 2, 2}, dt));
    const double r = 1 / std::sqrt(eps);
    for (std::size_t j = 0; j < 3; ++j) {
      CHECK(gr[0].at({0, j}) == Approx(r * w.value().flat(j)).epsilon(1e-6));
      CHECK(gr[0].at({1, j}) == Approx(2 * r * w.value().flat(j)).epsilon(1e-6));
      CHECK(gr[1].flat(j) == 0.0);  // xh = 0 on every row
    }
  }
}

TEST_CASE("rms_norm: float32 rows whose squares overflow float still normalise (the mean square is summed in double)",
          "[ops][rms_norm][llama]") {
  // x^2 = 1e60 is beyond float's 3.4e38; r = 1e-30 is not. y = x / 1e30 = +-1 (times w).
  const Tensor x(Array::from_vector({1, 4}, {1e30, -1e30, 1e30, 1e30}, DType::float32), true);
  const Tensor y = ops::rms_norm(x, Tensor(Array::from_vector({4}, {1, 1, 2, 1}, DType::float32)), 1e-5);
  const std::vector<double> expect{1, -1, 2, 1};
  for (std::size_t j = 0; j < 4; ++j) CHECK(y.value().flat(j) == Approx(expect[j]).epsilon(1e-6));
  const Array dx = grad(y, {x}, Array::from_vector({1, 4}, {1, 0, 0, 0}, DType::float32))[0];
  for (double v : dx.to_vector()) CHECK(std::isfinite(v));
}

TEST_CASE("rms_norm and swiglu: bad input is an error naming the op and the argument", "[ops][errors][llama]") {
  const Tensor x(Array::zeros({2, 4}, DType::float64));
  CHECK_THROWS_AS(ops::rms_norm(x, Tensor(Array::zeros({3}, DType::float64))), ShapeError);
  CHECK_THROWS_WITH(ops::rms_norm(x, Tensor(Array::zeros({3}, DType::float64))),
                    Catch::Contains("[rms_norm] weight has shape (3), expected (4) for x of shape (2, 4)"));
  CHECK_THROWS_WITH(ops::rms_norm(x, Tensor(Array::zeros({1, 4}, DType::float64))),
                    Catch::Contains("[rms_norm] weight has shape (1, 4)"));
  CHECK_THROWS_AS(ops::rms_norm(x, Tensor(Array::zeros({4}, DType::float32))), DTypeError);
  CHECK_THROWS_WITH(ops::rms_norm(x, Tensor(Array::zeros({4}, DType::float32))),
                    Catch::Contains("[rms_norm]") && Catch::Contains("x is float64") && Catch::Contains("weight is float32"));
  for (double eps : {0.0, -1e-5, kInf, std::nan("")}) {
    INFO("eps " << eps);
    CHECK_THROWS_AS(ops::rms_norm(x, Tensor(), eps), ValueError);
    CHECK_THROWS_WITH(ops::rms_norm(x, Tensor(), eps),
                      Catch::Contains("[rms_norm] eps must be positive and finite, got"));
    CHECK_THROWS_WITH(ops::rms_norm_composed(x, Tensor(), eps), Catch::Contains("[rms_norm_composed] eps"));
  }
  CHECK_THROWS_WITH(ops::rms_norm(x, Tensor(), -0.5), Catch::Contains("got -0.5"));
  CHECK_THROWS_WITH(ops::rms_norm(Tensor(Array::scalar(1.0, DType::float64))),
                    Catch::Contains("[rms_norm] x must have at least 1 dimension(s), has shape ()"));
  CHECK_THROWS_WITH(ops::rms_norm(Tensor()), Catch::Contains("[rms_norm] x is an undefined Tensor"));

  CHECK_THROWS_AS(ops::swiglu(x, Tensor(Array::zeros({4, 2}, DType::float64))), ShapeError);
  CHECK_THROWS_WITH(ops::swiglu(x, Tensor(Array::zeros({4, 2}, DType::float64))),
                    Catch::Contains("[swiglu] shapes differ: a has shape (2, 4), b has shape (4, 2)"));
  CHECK_THROWS_WITH(ops::swiglu(x, Tensor(Array::zeros({4}, DType::float64))),
                    Catch::Contains("[swiglu] shapes differ"));  // no broadcasting
  CHECK_THROWS_AS(ops::swiglu(x, Tensor(Array::zeros({2, 4}, DType::float32))), DTypeError);
  CHECK_THROWS_WITH(ops::swiglu(x, Tensor(Array::zeros({2, 4}, DType::float32))),
                    Catch::Contains("[swiglu]") && Catch::Contains("b is float32"));
  CHECK_THROWS_WITH(ops::swiglu(Tensor(), x), Catch::Contains("[swiglu] a is an undefined Tensor"));
  CHECK_THROWS_WITH(ops::silu(Tensor()), Catch::Contains("[silu] x is an undefined Tensor"));
}
