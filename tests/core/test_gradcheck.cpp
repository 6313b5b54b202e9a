// The checker itself: it must fail on wrong VJPs, name the worst element, refuse float32
// unless asked, and catch errors that an all-ones cotangent would hide.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

// sin with a VJP whose sign is flipped on one element (flat index 4) only.
Tensor sin_bad_at_4(const Tensor& x) {
  return custom_op(
      "sin_bad", {x},
      [](const std::vector<Array>& in) {
        Array y = in[0].clone();
        for (std::size_t i = 0; i < y.size(); ++i) y.set_flat(i, std::sin(in[0].flat(i)));
        return y;
      },
      [](const VjpContext& c) {
        Array g = c.grad_output.clone();
        for (std::size_t i = 0; i < g.size(); ++i) g.set_flat(i, g.flat(i) * std::cos(c.inputs[0].flat(i)));
        g.set_flat(4, -g.flat(4));
        return Cotangents{g};
      });
}

// softmax with a VJP that returns zeros: correct for an all-ones cotangent only (5.24).
Tensor softmax_zero_vjp(const Tensor& u) {
  return custom_op(
      "softmax_zero_vjp", {u}, [](const std::vector<Array>& in) { return ops::softmax(Tensor(in[0])).value(); },
      [](const VjpContext& c) { return Cotangents{Array::zeros(c.inputs[0].shape(), c.inputs[0].dtype())}; });
}

}  // namespace

TEST_CASE("gradcheck: a deliberately wrong VJP is rejected and the worst element is named",
          "[core][gradcheck]") {
  Generator g(179);
  const Array x = rnd({2, 3}, g, 0.5, 1.5);  // cos > 0 on this range: the flip is visible
  const GradcheckReport r =
      gradcheck([](const std::vector<Tensor>& in) { return sin_bad_at_4(in[0]); }, {x}, {}, {"x"});
  CHECK_FALSE(r.passed);
  CHECK(r.mode == "full");
  CHECK(r.input_name == "x");
  CHECK(r.index == std::vector<std::size_t>{1, 1});  // flat 4 of a 2x3 array
  CHECK(r.output_index == std::vector<std::size_t>{1, 1});
  CHECK(r.analytic == Approx(-std::cos(x.flat(4))).epsilon(1e-6));
  CHECK(r.numeric == Approx(std::cos(x.flat(4))).epsilon(1e-6));
  CHECK_THAT(r.summary(), Catch::Contains("FAILED") && Catch::Contains("x index (1, 1)"));
}

TEST_CASE("gradcheck: projection mode also rejects the wrong VJP and names the input",
          "[core][gradcheck]") {
  Generator g(181);
  GradcheckOptions o;
  o.mode = GradcheckOptions::Mode::projection;
  const Array good = rnd({2, 3}, g), x = rnd({2, 3}, g, 0.5, 1.5);
  const GradcheckReport r = gradcheck(
      [](const std::vector<Tensor>& in) { return in[0] * sin_bad_at_4(in[1]); }, {good, x}, o, {"a", "x"});
  CHECK_FALSE(r.passed);
  CHECK(r.mode == "projection");
  CHECK(r.input_name == "x");
}

TEST_CASE("gradcheck: a random cotangent catches a VJP that is only right for all-ones",
          "[core][gradcheck]") {
  Generator g(191);
  const Array u = rnd({3, 4}, g);
  for (auto mode : {GradcheckOptions::Mode::full, GradcheckOptions::Mode::projection}) {
    GradcheckOptions o;
    o.mode = mode;
    const GradcheckReport r =
        gradcheck([](const std::vector<Tensor>& in) { return softmax_zero_vjp(in[0]); }, {u}, o, {"u"});
    CHECK_FALSE(r.passed);
  }
  // The same op under sum() -- an all-ones cotangent -- would have passed:
  const GradcheckReport fooled =
      gradcheck([](const std::vector<Tensor>& in) { return ops::sum(softmax_zero_vjp(in[0])); }, {u});
  CHECK(fooled.passed);
}

TEST_CASE("gradcheck: projection mode passes correct ops on large inputs", "[core][gradcheck]") {
  Generator g(193);
  const Array a = rnd({40, 60}, g), b = rnd({60, 50}, g);
  const GradcheckReport r = require_gradcheck(
      [](const std::vector<Tensor>& in) { return ops::softmax(ops::matmul(in[0], in[1])); }, {a, b}, {"a", "b"});
  CHECK(r.mode == "projection");  // 5400 inputs x 2000 outputs is past the full-Jacobian limit
}

TEST_CASE("gradcheck: float32 inputs are refused unless the caller opts in", "[core][gradcheck][errors]") {
  Generator g(197);
  const Array x = rnd({3}, g).astype(DType::float32);
  auto f = [](const std::vector<Tensor>& in) { return ops::tanh(in[0]); };
  CHECK_THROWS_WITH(gradcheck(f, {x}), Catch::Contains("[gradcheck]") && Catch::Contains("float32"));
  GradcheckOptions o;
  o.allow_float32 = true;
  o.eps = 1e-2;
  o.atol = 1e-3;
  o.rtol = 1e-2;
  CHECK(gradcheck(f, {x}, o).passed);
}

namespace {

// x^3 with a correct first-order VJP 3 x^2 g and a second-order rule that returns `factor`
// times it (1: right; 2: values doubled, which jvp, built on the rule, inherits).
Tensor cube_rule_times(const Tensor& x, double factor) {
  return custom_op(
      "cube_rule_times", {x},
      [](const std::vector<Array>& in) {
        Array y = in[0].clone();
        for (std::size_t i = 0; i < y.size(); ++i) y.set_flat(i, std::pow(in[0].flat(i), 3));
        return y;
      },
      [](const VjpContext& c) {
        Array g = c.grad_output.clone();
        for (std::size_t i = 0; i < g.size(); ++i) g.set_flat(i, g.flat(i) * 3 * std::pow(c.inputs[0].flat(i), 2));
        return Cotangents{g};
      },
      [factor](const DiffVjpContext& c) {
        return DiffCotangents{c.grad_output * (c.inputs[0] * c.inputs[0] * (3.0 * factor))};
      });
}

}  // namespace

TEST_CASE("jvpcheck: forward mode of real ops agrees with central differences and the transpose identity",
          "[core][gradcheck][higher_order]") {
  Generator gen(5);
  const Array a = rnd({3, 4}, gen), b = rnd({4, 2}, gen);
  const GradcheckOptions o;
  const GradcheckReport r = jvpcheck(
      [](const std::vector<Tensor>& in) { return ops::softmax(ops::tanh(ops::matmul(in[0], in[1]))); }, {a, b}, o,
      {"a", "b"});
  INFO(r.summary());
  CHECK(r.passed);
  CHECK(r.mode == "jvp");
  // Per random tangent: the 3 x 2 output elements and one transpose identity.
  CHECK(r.comparisons == static_cast<std::size_t>(o.projections) * (6 + 1));
  CHECK(r.max_abs_error < 1e-7);
}

TEST_CASE("jvpcheck: a wrong second-order rule gives a wrong jvp and is caught", "[core][gradcheck][higher_order]") {
  Generator gen(9);
  const Array x = rnd({4}, gen, 0.5, 1.5);
  const GradcheckReport ok = jvpcheck([](const std::vector<Tensor>& in) { return cube_rule_times(in[0], 1.0); }, {x});
  INFO(ok.summary());
  CHECK(ok.passed);
  const GradcheckReport bad = jvpcheck([](const std::vector<Tensor>& in) { return cube_rule_times(in[0], 2.0); }, {x});
  INFO(bad.summary());
  CHECK_FALSE(bad.passed);
  CHECK((bad.input_name == "J u" || bad.input_name == "<v, J u>"));
  // Whichever comparison is worst, the jvp side is twice the true value there.
  CHECK(std::fabs(bad.analytic - 2 * bad.numeric) <= 1e-6 * std::fabs(bad.numeric) + 1e-9);
  // Each of the two comparisons catches it on its own: one tangent, one output element.
  const GradcheckReport one = jvpcheck([](const std::vector<Tensor>& in) { return cube_rule_times(in[0], 2.0); },
                                       {Array::from_vector({1}, {1.25}, DType::float64)});
  INFO(one.summary());
  CHECK_FALSE(one.passed);
  CHECK(one.comparisons == 2 * static_cast<std::size_t>(GradcheckOptions{}.projections));
}

TEST_CASE("jvpcheck: float32 is refused unless allowed and bad options are errors",
          "[core][gradcheck][higher_order][errors]") {
  const Array x32 = Array::from_vector({2}, {0.5, 1.0}, DType::float32);
  const auto f = [](const std::vector<Tensor>& in) { return ops::tanh(in[0]); };
  CHECK_THROWS_WITH(jvpcheck(f, {x32}, {}, {"x"}), Catch::Contains("[jvpcheck]") && Catch::Contains("x") &&
                                                          Catch::Contains("float32"));
  GradcheckOptions o32;
  o32.allow_float32 = true;
  o32.eps = 5e-3;
  o32.atol = o32.rtol = 1e-2;
  const GradcheckReport r = jvpcheck(f, {x32}, o32);
  INFO(r.summary());
  CHECK(r.passed);
  GradcheckOptions bad;
  bad.projections = 0;
  CHECK_THROWS_AS(jvpcheck(f, {Array::from_vector({1}, {0.5}, DType::float64)}, bad), ValueError);
  CHECK_THROWS_AS(jvpcheck(f, {}), ValueError);
}
