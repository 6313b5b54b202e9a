// A custom layer with a hand-written VJP, checked by the gradient-check suite
// (docs/gradcheck.md): RMSNorm with a learnable gain, built with xg::custom_op.
//
//   build/bin/custom_layer                 runs its checks, prints the table, exits 0
//   build/bin/custom_layer --inject-bug    flips one sign in the VJP: the checks on x fail,
//                                          the exit status is 1, and the failure details
//                                          name the broken input ("worst element: x index ...")
//
// Everything but the layer itself is the few lines a check needs: XG_GRADCHECK registers a
// check, ctx makes inputs and runs the comparison, gradcheck_main parses the same flags as
// `xgrad gradcheck` (--filter, --dtype float32, --json, ...) and returns the exit status.
#include <CLI/CLI.hpp>

#include <xgrad/checks/suite_cli.hpp>
#include <xgrad/xgrad.hpp>

using namespace xg;

namespace {

bool inject_bug = false;

// RMSNorm over the last axis, x [..., D], gain [D]. (xgrad has it built in as ops::rms_norm,
// one fused op in ops/rms_norm.cpp; this file writes its own to show how a custom layer is
// made and checked.)
//   forward:  r = sqrt(mean_k x_k^2 + eps),  xhat = x / r,  y = gain * xhat
//   VJP:      gain_bar = sum over rows of y_bar * xhat
//             x_bar = (gain * y_bar - xhat * mean_k(gain_k y_bar_k xhat_k)) / r
// (differentiating r: dr/dx_k = x_k / (D r), so the second term is the projection that
// removes the part of gain * y_bar along xhat.)
Tensor rms_norm(const Tensor& x, const Tensor& gain, double eps = 1e-6) {
  return custom_op(
      "rms_norm", {x, gain},
      [eps](const std::vector<Array>& in) {
        NoGradGuard ng;
        const Tensor x(in[0]), gain(in[1]);
        const Tensor r = ops::sqrt(ops::mean(x * x, {-1}, true) + eps);  // [..., 1]
        return (x / r * gain).value();
      },
      [eps](const VjpContext& c) {
        NoGradGuard ng;
        const Tensor x(c.inputs[0]), gain(c.inputs[1]), y_bar(c.grad_output);
        const Tensor r = ops::sqrt(ops::mean(x * x, {-1}, true) + eps);  // recomputed: cheaper than saving it
        const Tensor xhat = x / r;
        const Tensor gy = gain * y_bar;
        const Tensor proj = xhat * ops::mean(gy * xhat, {-1}, true);
        const Tensor x_bar = (inject_bug ? gy + proj : gy - proj) / r;  // --inject-bug flips this sign
        Axes rows;  // every axis but the last
        for (int a = 0; a + 1 < static_cast<int>(x.ndim()); ++a) rows.push_back(a);
        const Tensor gain_bar = rows.empty() ? y_bar * xhat : ops::sum(y_bar * xhat, rows);
        return Cotangents{x_bar.value(), gain_bar.value()};
      });
}

// The layer as a module: a named parameter "gain", initialised to ones.
class RMSNorm : public nn::Module {
 public:
  RMSNorm(std::size_t d, DType dtype) : gain(register_parameter("gain", Array::full({d}, 1.0, dtype))) {}
  Tensor operator()(const Tensor& x) const { return rms_norm(x, gain); }
  Tensor gain;
};

}  // namespace

// The op on its own: full Jacobian with respect to both inputs.
XG_GRADCHECK("rms_norm/op", "x (3, 8), gain (8)") {
  return ctx.gradcheck([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); },
                       {ctx.normal({3, 8}), ctx.uniform({8}, 0.5, 1.5)}, {"x", "gain"});
}

// Larger inputs switch to random projections (v^T J u), which keeps the run fast.
XG_GRADCHECK("rms_norm/op-large", "x (4, 32, 64), gain (64): random-projection mode") {
  return ctx.gradcheck([](const std::vector<Tensor>& in) { return rms_norm(in[0], in[1]); },
                       {ctx.normal({4, 32, 64}), ctx.uniform({64}, 0.5, 1.5)}, {"x", "gain"});
}

// The module inside a small model: the loss with respect to the input and every parameter
// the model owns, through the module's own parameter handles (gradcheck_leaves).
XG_GRADCHECK("rms_norm/module-in-a-model", "cross_entropy(RMSNorm(x) W), x (2, 3, 6), W (6, 5); x, W, gain") {
  RMSNorm norm(6, ctx.dtype());
  norm.gain.set_value(ctx.uniform({6}, 0.5, 1.5));
  const Tensor x(ctx.normal({2, 3, 6}), true), W(ctx.normal({6, 5}), true);
  const IndexArray targets({2, 3}, {0, 4, 2, 1, 1, 3});
  auto leaves = norm.named_parameters();
  leaves.insert(leaves.begin(), {{"x", x}, {"W", W}});
  return ctx.gradcheck_leaves([&] { return ops::cross_entropy(ops::matmul(norm(x), W), targets); }, leaves);
}

// A property check: with gain = 1 every row has unit root-mean-square, up to eps: the
// exact value is sqrt(ms / (ms + eps)), off by ~eps / (2 ms) ~ 1e-6 for these rows. Tolerance
// 1e-5 in float64; in float32 the mean of squares also rounds at 2^-24 per term.
XG_GRADCHECK("rms_norm/unit-rms", "rows of RMSNorm(x) with gain 1 have RMS 1 (x (5, 16))") {
  NoGradGuard ng;
  const Tensor y = rms_norm(Tensor(ctx.normal({5, 16})), Tensor(ctx.cast(Array::full({16}, 1.0, DType::float64))));
  const Array rms = ops::sqrt(ops::mean(y * y, {-1})).value();
  double worst = 0;
  std::size_t row = 0;
  for (std::size_t i = 0; i < rms.size(); ++i)
    if (std::fabs(rms.flat(i) - 1.0) > worst) {
      worst = std::fabs(rms.flat(i) - 1.0);
      row = i;
    }
  return CheckResult::property(worst, ctx.tol(1e-5, 1e-5), "row " + std::to_string(row), "|RMS(row) - 1|");
}

int main(int argc, char** argv) {
  return gradcheck_main(
      default_gradcheck_suite(), argc, argv,
      [](CLI::App& app) {
        app.add_flag("--inject-bug", inject_bug, "Flip one sign in rms_norm's VJP: the x checks must then fail");
      },
      "custom_layer: gradient checks of a hand-written RMSNorm VJP (docs/gradcheck.md)");
}
