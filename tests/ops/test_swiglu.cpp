// silu and swiglu (ops/unary.hpp): values and gradients from the definitions written long-hand,
// the fused op against its compositions, hard inputs, bad input (with rms_norm's), and the
// gradient-check suite's Llama-block checks.
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


// silu and its derivative written out from the definition x / (1 + e^-x) with the quotient
// rule, for moderate x (these overflow for very negative x, which is the point of the op's form).
double silu_def(double x) { return x / (1 + std::exp(-x)); }
double silu_slope_def(double x) {
  const double e = std::exp(-x);
  return (1 + e + x * e) / ((1 + e) * (1 + e));
}

}  // namespace

TEST_CASE("silu: values and derivative equal the definition x / (1 + e^-x) and its quotient-rule derivative",
          "[ops][silu][llama]") {
  const std::vector<double> xs{-20, -6, -2.5, -1, -0.25, 0, 0.25, 1, 2.5, 6, 20, 40};
  for (DType dt : {DType::float64, DType::float32}) {
    INFO(dtype_name(dt));
    const double tol = dt == DType::float64 ? 1e-15 : 1e-6;
    const Tensor x(Array::from_vector({xs.size()}, xs, dt), true);
    const Tensor y = ops::silu(x);
    const Array d = grad(y, {x}, Array::full({xs.size()}, 1.0, dt))[0];
    for (std::size_t i = 0; i < xs.size(); ++i) {
      INFO("x = " << xs[i]);
      const double xv = x.value().flat(i);  // the value as stored (float32 rounds nothing here)
      CHECK(y.value().flat(i) == Approx(silu_def(xv)).epsilon(tol).margin(tol));
      CHECK(d.flat(i) == Approx(silu_slope_def(xv)).epsilon(tol * 4).margin(tol));
    }
  }
  // Hand values: silu(0) = 0 with slope 1/2; silu(1) = 1/(1 + 1/e) = e/(e + 1).
  const Tensor one(Array::of({0.0, 1.0}), true);
  const Tensor y = ops::silu(one);
  CHECK(y.value().flat(0) == 0.0);
  CHECK(y.value().flat(1) == Approx(std::exp(1.0) / (std::exp(1.0) + 1)).epsilon(1e-15));
  CHECK(grad(y, {one}, Array::of({1.0, 0.0}))[0].flat(0) == 0.5);
}

TEST_CASE("silu: very negative and infinite inputs give finite values and gradients (no exp overflow)",
          "[ops][silu][llama]") {
  // float64: x = -100 is still representable, e^-100 (1 + x) is the slope to 1e-40 relative;
  // -1000 and below underflow to exactly 0; at +-inf the limits (0 and x, slopes 0 and 1).
  {
    const std::vector<double> xs{-100, -745, -1000, -1e300, -kInf, kInf, 1000};
    const Tensor x(Array::from_vector({xs.size()}, xs, DType::float64), true);
    const Tensor y = ops::silu(x);
    const Array d = grad(y, {x}, Array::full({xs.size()}, 1.0, DType::float64))[0];
    CHECK(y.value().flat(0) == Approx(-100 * std::exp(-100.0)).epsilon(1e-14));
    CHECK(d.flat(0) == Approx(std::exp(-100.0) * (1 - 100)).epsilon(1e-12));
    for (std::size_t i = 1; i < 5; ++i) {
      INFO("x = " << xs[i]);
      CHECK(std::fabs(y.value().flat(i)) < 1e-300);
      CHECK(std::fabs(d.flat(i)) < 1e-300);
    }
    CHECK(y.value().flat(5) == kInf);
    CHECK(d.flat(5) == 1.0);
    CHECK(y.value().flat(6) == 1000.0);
    CHECK(d.flat(6) == 1.0);
  }
  {  // float32: e^100 already overflows float; the op never forms it
    const std::vector<double> xs{-90, -100, -200, -3e38, -kInf, kInf, 100};
    const Tensor x(Array::from_vector({xs.size()}, xs, DType::float32), true);
    const Tensor y = ops::silu(x);
    const Array d = grad(y, {x}, Array::full({xs.size()}, 1.0, DType::float32))[0];
    for (std::size_t i = 0; i < 5; ++i) {
      INFO("x = " << xs[i]);
      CHECK(std::isfinite(y.value().flat(i)));
      CHECK(std::isfinite(d.flat(i)));
      CHECK(std::fabs(y.value().flat(i)) < 1e-36);
      CHECK(std::fabs(d.flat(i)) < 1e-36);
    }
    CHECK(y.value().flat(0) == Approx(-90 * std::exp(-90.0)).epsilon(1e-5));
    CHECK(y.value().flat(5) == kInf);
    CHECK(d.flat(5) == 1.0);
    CHECK(y.value().flat(6) == 100.0);
    CHECK(d.flat(6) == 1.0);
  }
}

TEST_CASE("swiglu: silu(a) b and both gradients equal the definition written long-hand", "[ops][swiglu][llama]") {
  Generator g(73);
  for (DType dt : {DType::float64, DType::float32}) {
    INFO(dtype_name(dt));
    const double tol = dt == DType::float64 ? 1e-14 : 1e-6;
    const Tensor a(rnd({3, 5}, g, -8, 8).astype(dt), true), b(rnd({3, 5}, g, -2, 2).astype(dt), true);
    const Array G = rnd({3, 5}, g).astype(dt);
    const Tensor y = ops::swiglu(a, b);
    const auto gr = grad(y, {a, b}, G);
    for (std::size_t i = 0; i < 15; ++i) {
      const double av = a.value().flat(i), bv = b.value().flat(i), gv = G.flat(i);
      CHECK(y.value().flat(i) == Approx(silu_def(av) * bv).epsilon(tol).margin(tol));
      CHECK(gr[0].flat(i) == Approx(gv * bv * silu_slope_def(av)).epsilon(4 * tol).margin(tol));
      CHECK(gr[1].flat(i) == Approx(gv * silu_def(av)).epsilon(tol).margin(tol));
    }
  }
  // One gradient only: b a constant.
  const Tensor a(Array::of({-1.0, 2.0}), true), b(Array::of({3.0, -0.5}));
  const Array da = grad(ops::swiglu(a, b), {a}, Array::of({1.0, 1.0}))[0];
  CHECK(da.flat(0) == Approx(3 * silu_slope_def(-1)).epsilon(1e-15));
  CHECK(da.flat(1) == Approx(-0.5 * silu_slope_def(2)).epsilon(1e-15));
}

TEST_CASE("swiglu: the fused op equals silu(a) * b and a * sigmoid(a) * b composed (values and both gradients)",
          "[ops][swiglu][llama]") {
  // silu(a) * b (the oracle swiglu_composed) shares silu's kernel and rounds the same way; the
  // composition from sigmoid and mul has its own VJP chain (sigmoid's g y (1 - y) loses digits
  // of 1 - y when y is near 1, up to |a| ulp): float64 to 1e-12; float32 within 1e-6 for
  // swiglu_composed and 3e-6 for the sigmoid chain, scaled by max(1, |composed|) (measured 8e-7).
  Generator g(79);
  for (DType dt : {DType::float64, DType::float32}) {
    const double tol = dt == DType::float64 ? 1e-12 : 1e-6, tol3 = dt == DType::float64 ? 1e-12 : 3e-6;
    for (const Shape& s : {Shape{7}, Shape{3, 11}, Shape{4, 64, 96}}) {  // the last spans several pool chunks
      INFO(dtype_name(dt) << ", shape " << shape_str(s));
      const Tensor a(rnd(s, g, -10, 10).astype(dt), true), b(rnd(s, g, -2, 2).astype(dt), true);
      const Array G = rnd(s, g).astype(dt);
      const Tensor y1 = ops::swiglu(a, b), y2 = ops::swiglu_composed(a, b), y3 = a * ops::sigmoid(a) * b;
      BackwardOptions keep;
      keep.retain_graph = true;
      const auto g1 = grad(y1, {a, b}, G, keep), g2 = grad(y2, {a, b}, G, keep), g3 = grad(y3, {a, b}, G);
      CHECK(max_scaled_diff(y1.value(), y2.value()) <= tol);
      CHECK(max_scaled_diff(g1[0], g2[0]) <= tol);
      CHECK(max_scaled_diff(g1[1], g2[1]) <= tol);
      CHECK(max_scaled_diff(y1.value(), y3.value()) <= tol3);
      CHECK(max_scaled_diff(g1[0], g3[0]) <= tol3);
      CHECK(max_scaled_diff(g1[1], g3[1]) <= tol3);
    }
  }
}

TEST_CASE("gradcheck suite: the built-in set has the rms_norm silu and swiglu checks and they pass in both dtypes",
          "[gradcheck][suite][llama]") {
  GradcheckSuite s;
  checks::register_builtin_checks(s);
  const std::string filter = "ops/rms_norm,ops/silu,ops/swiglu";
  std::vector<std::string> names;
  for (const Check* c : s.select(filter)) names.push_back(c->name);
  CHECK(names == std::vector<std::string>{"ops/silu", "ops/rms_norm", "ops/rms_norm-plain", "ops/rms_norm-zero-row",
                                          "ops/rms_norm-projection", "ops/swiglu", "ops/swiglu-projection"});
  for (DType dt : {DType::float64, DType::float32}) {
    RunOptions o;
    o.dtype = dt;
    o.filter = filter;
    std::ostringstream out;
    const SuiteReport r = run_suite(s, o, out);
    INFO(dtype_name(dt) << "\n" << out.str());
    CHECK(r.passed == 7);
    CHECK(r.failed == 0);
    for (const CheckRecord& rec : r.records)
      CHECK(rec.result.mode == (rec.name.find("projection") != std::string::npos ? "projection" : "full"));
  }
}
