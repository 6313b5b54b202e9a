// The custom layer of docs/tutorial.md section 6, verbatim (the tests also build and run the
// tutorial's whole program, doc_sample_docs_tutorial_1), with further checks.
#include "tests/support/helpers.hpp"

using namespace xg;

namespace {

Tensor rms_norm(const Tensor& x, double eps = 1e-6) {
  return custom_op(
      "rms_norm", {x},
      [eps](const std::vector<Array>& in) {  // forward on values
        NoGradGuard ng;
        Tensor v(in[0]);
        Tensor r = ops::sqrt(ops::mean(v * v, {-1}, true) + eps);
        return (v / r).value();
      },
      [eps](const VjpContext& c) {  // VJP: x_bar = (g - y mean(g y)) / r
        NoGradGuard ng;
        Tensor v(c.inputs[0]), y(c.output), g(c.grad_output);
        Tensor r = ops::sqrt(ops::mean(v * v, {-1}, true) + eps);
        return Cotangents{((g - y * ops::mean(g * y, {-1}, true)) / r).value()};
      });
}

}  // namespace

TEST_CASE("tutorial: the RMSNorm custom layer passes gradcheck with the full Jacobian", "[tutorial][custom]") {
  Generator gen(1);
  GradcheckReport r = gradcheck([](const std::vector<Tensor>& in) { return rms_norm(in[0]); },
                                {random_normal({3, 8}, gen, DType::float64)});
  INFO(r.summary());
  CHECK(r.passed);
  CHECK(r.mode == "full");
  CHECK(r.comparisons == 576);
  // And it equals the composed formula.
  const Array x = random_normal({2, 5}, gen);
  const Tensor xt(x);
  const Array composed = (xt / ops::sqrt(ops::mean(xt * xt, {-1}, true) + 1e-6)).value();
  CHECK(max_abs_diff(rms_norm(xt).value(), composed) < 1e-15);
}
