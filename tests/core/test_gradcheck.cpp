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
