// Derivatives of derivatives (docs/higher-order.md): create_graph against closed forms,
// gradgradcheck per op with a second-order rule, a wrong rule caught, first-order results
// unchanged, jvp / hvp / hessian, and the refusals (an op without a rule, bad shapes).
#include <cmath>
#include <cstdio>

#include "tests/support/helpers.hpp"

#include <xgrad/nn/detail/flash_attention.hpp>

using namespace xg;
using namespace xgt;

namespace {

BackwardOptions graph() {
  BackwardOptions o;
  o.create_graph = true;
  return o;
}

std::string text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// |a - b| <= tol elementwise, printing the worst element with full precision.
void require_near(const Array& a, const Array& b, double tol) {
  REQUIRE(a.shape() == b.shape());
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a.flat(i) - b.flat(i));
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  INFO("worst flat index " << at << ": " << text(a.size() ? a.flat(at) : 0.0) << " vs "
                           << text(b.size() ? b.flat(at) : 0.0) << " (|diff| " << text(worst) << ", tol " << text(tol)
                           << ")");
  REQUIRE(worst <= tol);
}

Array from(const Shape& s, const std::vector<double>& v) { return Array::from_vector(s, v, DType::float64); }

// x^3 with a correct first-order VJP and a second-order rule `dvjp`.
Tensor cube(const Tensor& x, DiffVjpFn dvjp) {
  return custom_op(
      "cube", {x},
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
      std::move(dvjp));
}

// The identity as a custom op with a first-order VJP only.
Tensor passthrough_no_rule(const Tensor& x) {
  return custom_op(
      "passthrough_without_rule", {x}, [](const std::vector<Array>& in) { return in[0].clone(); },
      [](const VjpContext& c) { return Cotangents{c.grad_output}; });
}

GradcheckReport require_gradgradcheck(const std::string& what, const GradcheckFn& f, const std::vector<Array>& in) {
  const GradcheckReport r = gradgradcheck(f, in);
  INFO(what << ": " << r.summary());
  REQUIRE(r.passed);
  REQUIRE(r.comparisons > 0);
  return r;
}

}  // namespace

TEST_CASE("create_graph: d2/dx2 and d3/dx3 of x^3 are 6x and 6", "[core][higher_order]") {
  const Array xv = from({4}, {-1.5, -0.25, 0.5, 2.0});
  for (const bool use_pow : {false, true}) {
    Tape tape;
    const Tensor x(xv, true);
    const Tensor y = ops::sum(use_pow ? ops::pow(x, 3) : x * x * x);
    const Tensor g = grad(y, {x}, Tensor(), graph())[0];
    REQUIRE(g.requires_grad());
    const Tensor g2 = grad(ops::sum(g), {x}, Tensor(), graph())[0];
    const Tensor g3 = grad(ops::sum(g2), {x}, Tensor(), graph())[0];
    for (std::size_t i = 0; i < 4; ++i) {
      const double v = xv.flat(i);
      INFO("pow " << use_pow << " x = " << text(v));
      CHECK(std::fabs(g.value().flat(i) - 3 * v * v) <= 1e-14 * (1 + 3 * v * v));
      CHECK(std::fabs(g2.value().flat(i) - 6 * v) <= 1e-14 * (1 + 6 * std::fabs(v)));
      CHECK(std::fabs(g3.value().flat(i) - 6) <= 1e-13);
    }
  }
}

TEST_CASE("create_graph: the Hessian of sum(tanh(x)) is diagonal with -2 tanh (1 - tanh^2)",
          "[core][higher_order]") {
  const Array xv = from({5}, {-2.0, -0.7, 0.0, 0.3, 1.4});
  const Array H = hessian([](const Tensor& x) { return ops::sum(ops::tanh(x)); }, xv);
  REQUIRE(H.shape() == Shape{5, 5});
  Array expected = Array::zeros({5, 5}, DType::float64);
  for (std::size_t i = 0; i < 5; ++i) {
    const double t = std::tanh(xv.flat(i));
    expected.set_flat(i * 5 + i, -2 * t * (1 - t * t));
  }
  require_near(H, expected, 1e-14);
}

TEST_CASE("create_graph: the Hessian of softmax cross-entropy is (diag(p) - p p^T) / N in float64",
          "[core][higher_order]") {
  const std::size_t N = 2, C = 4;
  Generator gen(7);
  const Array z = rnd({N, C}, gen, -2, 2);
  const IndexArray targets({N}, {3, 1});
  // Analytic: block i is diag(p_i) - p_i p_i^T, over N (the mean), p_i = softmax(z_i) by hand.
  Array expected = Array::zeros({N, C, N, C}, DType::float64);
  for (std::size_t i = 0; i < N; ++i) {
    double m = -1e300, s = 0;
    for (std::size_t j = 0; j < C; ++j) m = std::max(m, z.flat(i * C + j));
    std::vector<double> p(C);
    for (std::size_t j = 0; j < C; ++j) s += p[j] = std::exp(z.flat(i * C + j) - m);
    for (double& v : p) v /= s;
    for (std::size_t a = 0; a < C; ++a)
      for (std::size_t b = 0; b < C; ++b)
        expected.set_flat(((i * C + a) * N + i) * C + b, ((a == b ? p[a] : 0.0) - p[a] * p[b]) / N);
  }
  for (const bool fused : {true, false}) {
    INFO((fused ? "cross_entropy" : "cross_entropy_composed"));
    const Array H = hessian(
        [&](const Tensor& x) { return fused ? ops::cross_entropy(x, targets) : ops::cross_entropy_composed(x, targets); },
        z);
    require_near(H, expected, 1e-15);
  }
}

TEST_CASE("gradgradcheck passes for every op with a second-order rule (float64)", "[core][higher_order]") {
  Generator gen(11);
  using In = std::vector<Tensor>;
  const auto X = [&](const Shape& s) { return rnd(s, gen); };
  const auto P = [&](const Shape& s) { return rnd(s, gen, 0.5, 2.0); };           // positive
  const auto K = [&](const Shape& s) { return rnd_away_from_zero(s, gen, 0.2); };  // off kinks at 0
  // Elementwise arithmetic with broadcasting, scalars.
  require_gradgradcheck("add", [](const In& v) { return ops::tanh(v[0] + v[1]); }, {X({2, 3}), X({3})});
  require_gradgradcheck("sub", [](const In& v) { return ops::tanh(v[0] - v[1]); }, {X({2, 1}), X({3})});
  require_gradgradcheck("mul", [](const In& v) { return v[0] * v[1]; }, {X({2, 3}), X({2, 1})});
  require_gradgradcheck("div", [](const In& v) { return v[0] / v[1]; }, {X({2, 3}), P({3})});
  require_gradgradcheck("neg", [](const In& v) { return -(v[0] * v[0]); }, {X({3})});
  require_gradgradcheck("scalar ops", [](const In& v) { return (2.0 - v[0] * 3.0 + 1.5) / 2.0 * (1.0 / v[0]); },
                        {P({3})});
  require_gradgradcheck("number forms", [](const In& v) { return (0.5 + 1.5 * (v[0] - 0.25)) * v[0]; }, {X({4})});
  // Unary.
  require_gradgradcheck("exp", [](const In& v) { return ops::exp(v[0]); }, {X({3})});
  require_gradgradcheck("log", [](const In& v) { return ops::log(v[0]); }, {P({3})});
  require_gradgradcheck("sqrt", [](const In& v) { return ops::sqrt(v[0]); }, {P({3})});
  require_gradgradcheck("pow", [](const In& v) { return ops::pow(v[0], 2.5); }, {P({3})});
  require_gradgradcheck("abs", [](const In& v) { return ops::abs(v[0]) * v[0]; }, {K({4})});
  require_gradgradcheck("tanh", [](const In& v) { return ops::tanh(v[0]); }, {X({4})});
  require_gradgradcheck("sigmoid", [](const In& v) { return ops::sigmoid(v[0]); }, {X({4})});
  require_gradgradcheck("relu", [](const In& v) { return ops::relu(v[0]) * v[0]; }, {K({4})});
  require_gradgradcheck("clamp", [](const In& v) { return ops::clamp(v[0], -0.5, 0.5) * v[0]; }, {K({4})});
  require_gradgradcheck("gelu", [](const In& v) { return ops::gelu(v[0]); }, {X({4})});
  require_gradgradcheck("gelu_tanh", [](const In& v) { return ops::gelu(v[0], ops::GeluApprox::tanh); }, {X({4})});
  require_gradgradcheck("silu", [](const In& v) { return ops::silu(v[0]); }, {X({4})});
  require_gradgradcheck("swiglu", [](const In& v) { return ops::swiglu(v[0], v[1]); }, {X({2, 3}), X({2, 3})});
  require_gradgradcheck("bias_gelu", [](const In& v) { return ops::bias_gelu(v[0], v[1]); }, {X({2, 3}), X({3})});
  // Matrix products: batched, broadcast batch, transposed flags, 1-d operands.
  require_gradgradcheck("matmul", [](const In& v) { return ops::matmul(v[0], v[1]); }, {X({2, 3}), X({3, 2})});
  require_gradgradcheck("matmul batched broadcast", [](const In& v) { return ops::matmul(v[0], v[1]); },
                        {X({2, 2, 3}), X({3, 2})});
  require_gradgradcheck("matmul transposed", [](const In& v) { return ops::matmul(v[0], v[1], {true, true}); },
                        {X({2, 3, 2}), X({1, 2, 3})});
  require_gradgradcheck("matmul 1-d", [](const In& v) { return ops::matmul(v[0], v[1]); }, {X({3}), X({3, 2})});
  require_gradgradcheck("matmul 1-d b", [](const In& v) { return ops::matmul(v[0], v[1]); }, {X({2, 3}), X({3})});
  require_gradgradcheck("matmul self", [](const In& v) { return ops::matmul(v[0], v[0], {false, true}); }, {X({2, 3})});
  // Reductions.
  require_gradgradcheck("sum", [](const In& v) { return ops::sum(v[0] * v[0], {1}); }, {X({2, 3})});
  require_gradgradcheck("sum keepdims", [](const In& v) { return ops::sum(v[0] * v[0], {0, 2}, true); }, {X({2, 2, 3})});
  require_gradgradcheck("mean", [](const In& v) { return ops::mean(v[0] * v[0]); }, {X({2, 3})});
  require_gradgradcheck("max", [](const In& v) { return ops::max(v[0] * v[0], {1}); },
                        {from({2, 3}, {0.1, 0.9, -0.4, 1.3, -0.2, 0.6})});
  require_gradgradcheck("var", [](const In& v) { return ops::var(v[0], {1}); }, {X({2, 4})});
  require_gradgradcheck("sum_to", [](const In& v) { return ops::sum_to(v[0] * v[0], {1, 3}); }, {X({2, 3})});
  // Softmax.
  require_gradgradcheck("softmax", [](const In& v) { return ops::softmax(v[0], -1); }, {X({2, 4})});
  require_gradgradcheck("softmax axis 0", [](const In& v) { return ops::softmax(v[0], 0); }, {X({3, 2})});
  require_gradgradcheck("log_softmax", [](const In& v) { return ops::log_softmax(v[0], -1); }, {X({2, 4})});
  // Shape ops (squared after, so the rule must pass a recorded cotangent on).
  require_gradgradcheck("reshape", [](const In& v) { const Tensor r = ops::reshape(v[0], {3, 2}); return r * r; },
                        {X({2, 3})});
  require_gradgradcheck("transpose", [](const In& v) { const Tensor r = ops::transpose(v[0]); return r * r; },
                        {X({2, 3})});
  require_gradgradcheck("permute", [](const In& v) { const Tensor r = ops::permute(v[0], {2, 0, 1}); return r * r; },
                        {X({2, 1, 3})});
  require_gradgradcheck("broadcast_to", [](const In& v) { const Tensor r = ops::broadcast_to(v[0], {2, 3}); return r * r; },
                        {X({3})});
  require_gradgradcheck("squeeze/unsqueeze",
                        [](const In& v) { const Tensor r = ops::unsqueeze(ops::squeeze(v[0], 0), 1); return r * r; },
                        {X({1, 3})});
  require_gradgradcheck("concat", [](const In& v) { const Tensor r = ops::concat({v[0], v[1]}, 1); return r * r; },
                        {X({2, 1}), X({2, 2})});
  require_gradgradcheck("slice", [](const In& v) { const Tensor r = ops::slice(v[0], 1, 0, 5, 2); return r * r; },
                        {X({2, 5})});
  // Index ops (repeated indices), masks, dropout's mask, RoPE.
  require_gradgradcheck("index_select", [](const In& v) { const Tensor r = ops::index_select(v[0], 1, IndexArray{2, 0, 2}); return r * r; },
                        {X({2, 3})});
  require_gradgradcheck("gather",
                        [](const In& v) { const Tensor r = ops::gather(v[0], 1, IndexArray({2, 2}, {0, 0, 2, 1})); return r * r; },
                        {X({2, 3})});
  require_gradgradcheck("embedding", [](const In& v) { const Tensor r = ops::embedding(v[0], IndexArray({2, 2}, {1, 0, 1, 1})); return r * r; },
                        {X({3, 2})});
  const Array bias = from({3}, {0.0, -INFINITY, -0.5});
  require_gradgradcheck("add_mask", [&](const In& v) { return ops::softmax(ops::add_mask(v[0], bias), -1); }, {X({2, 3})});
  const BoolArray fill({1, 3}, {0, 1, 0});
  require_gradgradcheck("masked_fill", [&](const In& v) { const Tensor r = ops::masked_fill(v[0], fill, 2.0); return r * r; },
                        {X({2, 3})});
  const BoolArray cond({2, 1}, {1, 0});
  require_gradgradcheck("where", [&](const In& v) { const Tensor r = ops::where(cond, v[0], v[1]); return r * r; },
                        {X({2, 3}), X({3})});
  const Array mask = from({2, 3}, {2.0, 0.0, 2.0, 2.0, 2.0, 0.0});
  require_gradgradcheck("dropout", [&](const In& v) { const Tensor r = ops::apply_dropout_mask(v[0], mask); return r * r; },
                        {X({2, 3})});
  require_gradgradcheck("rope", [](const In& v) { const Tensor r = ops::rope(v[0], {0, 3}); return r * r; }, {X({2, 4})});
  require_gradgradcheck("rope_heads",
                        [](const In& v) { const Tensor r = ops::rope_heads(v[0], 2, 2, {1, 5}); return r * r; },
                        {X({2, 5})});
  require_gradgradcheck("chunk", [](const In& v) { const auto p = ops::chunk(v[0], 2, 1); return p[0] * p[1]; },
                        {X({2, 4})});
  // Losses and norms.
  require_gradgradcheck("cross_entropy", [](const In& v) { return ops::cross_entropy(v[0], IndexArray({3}, {1, 0, 2})); },
                        {X({3, 3})});
  ops::CrossEntropyOptions ce;
  ce.ignore_index = 0;
  ce.weights = from({3}, {0.5, 1.0, 2.0});
  require_gradgradcheck("cross_entropy weights ignore", [&](const In& v) { return ops::cross_entropy(v[0], IndexArray({3}, {1, 0, 2}), ce); },
                        {X({3, 3})});
  require_gradgradcheck("mse", [](const In& v) { return ops::mse(v[0], v[1]); }, {X({2, 3}), X({2, 3})});
  require_gradgradcheck("layer_norm", [](const In& v) { return ops::layer_norm(v[0], v[1], v[2]); },
                        {X({2, 4}), P({4}), X({4})});
  require_gradgradcheck("layer_norm no affine", [](const In& v) { return ops::layer_norm(v[0]); }, {X({2, 4})});
  require_gradgradcheck("rms_norm", [](const In& v) { return ops::rms_norm(v[0], v[1]); }, {X({2, 4}), P({4})});
}

TEST_CASE("third derivatives through the recorded backward ops of gelu and the norms and silu",
          "[core][higher_order]") {
  // gelu, bias_gelu, layer_norm, rms_norm, silu and swiglu record their backward pass as one op
  // under create_graph (gelu_backward, layer_norm_backward, rms_norm_backward, silu_backward,
  // silu_value_times), whose VJPs are fused kernels (checked at second
  // order above) and whose own rules are recorded ops. gradgradcheck of x -> d/dx <f(x), w>
  // (recorded) checks those rules: the ops' third derivatives.
  Generator gen(29);
  using In = std::vector<Tensor>;
  const auto third = [&](const std::string& what, const std::function<Tensor(const In&)>& f,
                         const std::vector<Array>& in) {
    const Array w = rnd(f([&] {
                          In t;
                          for (const Array& a : in) t.emplace_back(a);
                          return t;
                        }()).shape(),
                        gen);
    const auto G = [&](const In& v) {
      BackwardOptions o;
      o.create_graph = true;
      return grad(ops::sum(f(v) * Tensor(w)), {v[0]}, Tensor(), o)[0];
    };
    const GradcheckReport r = gradgradcheck(
        [&](const In& v) {
          if (v[0].requires_grad()) return G(v);
          EnableGradGuard on;  // a value-only evaluation: the same map on leaves of its own
          Tape tape;
          In leaves;
          for (const Tensor& t : v) leaves.emplace_back(t.value(), true);
          return Tensor(G(leaves).value(), false);
        },
        in);
    INFO(what << ": " << r.summary());
    CHECK(r.passed);
    CHECK(r.comparisons > 0);
  };
  third("gelu", [](const In& v) { return ops::gelu(v[0]); }, {rnd({2, 3}, gen)});
  third("bias_gelu", [](const In& v) { return ops::bias_gelu(v[0], v[1]); }, {rnd({2, 3}, gen), rnd({3}, gen)});
  third("layer_norm", [](const In& v) { return ops::layer_norm(v[0], v[1], v[2]); },
        {rnd({2, 4}, gen), rnd({4}, gen, 0.5, 2.0), rnd({4}, gen)});
  third("layer_norm no affine", [](const In& v) { return ops::layer_norm(v[0]); }, {rnd({2, 4}, gen)});
  third("rms_norm", [](const In& v) { return ops::rms_norm(v[0], v[1]); }, {rnd({2, 4}, gen), rnd({4}, gen, 0.5, 2.0)});
  third("silu", [](const In& v) { return ops::silu(v[0]); }, {rnd({2, 3}, gen, -3.0, 3.0)});
  third("swiglu", [](const In& v) { return ops::swiglu(v[0], v[1]); }, {rnd({2, 3}, gen, -3.0, 3.0), rnd({2, 3}, gen)});
}

TEST_CASE("gradgradcheck: the composed attention path has second derivatives", "[core][higher_order][attention]") {
  Generator gen(13);
  nn::SdpaOptions o;
  o.impl = nn::SdpaImpl::composed;
  const Array Q = rnd({1, 2, 3, 2}, gen), K = rnd({1, 1, 3, 2}, gen), V = rnd({1, 1, 3, 2}, gen);
  const GradcheckReport r = gradgradcheck(
      [&](const std::vector<Tensor>& v) {
        const nn::SdpaResult res = nn::scaled_dot_product_attention(v[0], v[1], v[2], nn::Visibility::causal(3, 3), o);
        REQUIRE(res.path == nn::SdpaImpl::composed);
        return res.output;
      },
      {Q, K, V}, {}, {"Q", "K", "V"});
  INFO(r.summary());
  CHECK(r.passed);
}

TEST_CASE("gradgradcheck: the packed fused attention op falls back to the composed path too",
          "[core][higher_order][attention]") {
  Generator gen(37);
  const std::size_t B = 1, T = 3, Hq = 2, Hkv = 1, d = 2;
  const Array P = rnd({B, T, (Hq + 2 * Hkv) * d}, gen);
  const nn::VisibilityPlan plan = nn::Visibility::causal(3, 3).plan("test", {B, Hq, T, T});
  for (const double p : {0.0, 0.25}) {  // with dropout: the composed path must draw the same mask
    nn::FlashOptions fo;
    fo.scale = 0.7;
    fo.dropout_p = p;
    fo.dropout_seed = 99;
    const GradcheckReport r = gradgradcheck(
        [&](const std::vector<Tensor>& in) { return nn::flash_attention_packed(in[0], Hq, Hkv, plan, fo); }, {P}, {},
        {"P"});
    INFO("dropout " << p << ": " << r.summary());
    CHECK(r.passed);
    CHECK(r.comparisons > 0);
  }
}

TEST_CASE("gradgradcheck catches a second-order rule whose values are right but whose graph is not",
          "[core][higher_order][gradcheck]") {
  Generator gen(17);
  const Array x = rnd({3}, gen, 0.5, 1.5);
  // Right: g 3 x^2 with x recorded. Wrong: the same values with x detached (x^3'' = 0 claimed).
  const auto right = [](const DiffVjpContext& c) {
    return DiffCotangents{c.grad_output * (c.inputs[0] * c.inputs[0] * 3.0)};
  };
  const auto wrong = [](const DiffVjpContext& c) {
    const Tensor x = c.inputs[0].detach();
    return DiffCotangents{c.grad_output * (x * x * 3.0)};
  };
  const GradcheckReport ok = gradgradcheck([&](const std::vector<Tensor>& v) { return cube(v[0], right); }, {x}, {}, {"x"});
  INFO(ok.summary());
  CHECK(ok.passed);
  const GradcheckReport bad = gradgradcheck([&](const std::vector<Tensor>& v) { return cube(v[0], wrong); }, {x}, {}, {"x"});
  INFO(bad.summary());
  CHECK_FALSE(bad.passed);
  CHECK(bad.input_name == "x");
  // The worst element: d/dx of 3 x^2 v on the diagonal, claimed 0, is 6 x v.
  CHECK(bad.analytic == 0.0);
  CHECK(std::fabs(bad.numeric) > 0.1);
}

TEST_CASE("first-order gradients are bit-identical whether or not a create_graph pass ran on the tape",
          "[core][higher_order]") {
  Generator gen(19);
  const Array xv = rnd({4, 6}, gen), w1v = rnd({6, 5}, gen), gv = rnd({5}, gen, 0.5, 1.5), w2v = rnd({5, 3}, gen);
  const IndexArray t({4}, {0, 2, 1, 2});
  // A small model: matmul, layer_norm, gelu, matmul, cross-entropy.
  const auto model = [&](const Tensor& x, const Tensor& w1, const Tensor& g, const Tensor& w2) {
    return ops::cross_entropy(ops::matmul(ops::gelu(ops::layer_norm(ops::matmul(x, w1), g)), w2), t);
  };
  std::vector<Array> plain;
  {
    Tape tape;
    const Tensor x(xv), w1(w1v, true), g(gv, true), w2(w2v, true);
    plain = grad(model(x, w1, g, w2), {w1, g, w2});
  }
  std::vector<Array> after, recorded_values;
  {
    Tape tape;
    const Tensor x(xv), w1(w1v, true), g(gv, true), w2(w2v, true);
    const Tensor y = model(x, w1, g, w2);
    const std::size_t before = tape.size();
    const std::vector<Tensor> rg = grad(y, {w1, g, w2}, Tensor(), graph());
    CHECK(tape.size() > before);  // the second-order rules ran and recorded
    for (const Tensor& r : rg) recorded_values.push_back(r.value());
    after = grad(y, {w1, g, w2});  // the plain sweep over the same nodes
  }
  for (std::size_t k = 0; k < plain.size(); ++k) {
    INFO("parameter " << k);
    REQUIRE(plain[k].shape() == after[k].shape());
    for (std::size_t i = 0; i < plain[k].size(); ++i) REQUIRE(plain[k].flat(i) == after[k].flat(i));
    // The recorded gradients' values agree with the plain ones (other formulas: a tolerance).
    require_near(recorded_values[k], plain[k], 1e-5);
  }
}

TEST_CASE("create_graph in float32: the recorded gradients' values agree with the plain ones",
          "[core][higher_order]") {
  Generator gen(31);
  const Array xv = rnd({4, 8}, gen).astype(DType::float32), wv = rnd({8, 8}, gen).astype(DType::float32);
  const IndexArray t({4}, {0, 7, 3, 3});
  const auto model = [&](const Tensor& w) {
    return ops::cross_entropy(ops::swiglu(ops::rms_norm(ops::matmul(Tensor(xv), w)), ops::gelu(Tensor(xv))), t);
  };
  Tape tape;
  const Tensor w(wv, true);
  const Tensor y = model(w);
  const Tensor rg = grad(y, {w}, Tensor(), graph())[0];
  REQUIRE(rg.dtype() == DType::float32);
  const Array plain = grad(y, {w})[0];
  double scale = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) scale = std::max(scale, std::fabs(plain.flat(i)));
  require_near(rg.value(), plain, 1e-5 * std::max(1.0, scale));
}

namespace {

// y = c x^2 * z (elementwise) as a custom op with a first-order VJP and, for higher orders, the
// JVP rule `rule` (written with recorded ops) instead of a differentiable VJP.
Tensor scaled_square(const Tensor& x, const Tensor& z, double c, JvpRuleFn rule) {
  return custom_op(
      "scaled_square", {x, z},
      [c](const std::vector<Array>& in) {
        Array y = in[0].clone();
        for (std::size_t i = 0; i < y.size(); ++i) y.set_flat(i, c * in[0].flat(i) * in[0].flat(i) * in[1].flat(i));
        return y;
      },
      [c](const VjpContext& ctx) {
        Array gx = ctx.grad_output.clone(), gz = ctx.grad_output.clone();
        for (std::size_t i = 0; i < gx.size(); ++i) {
          const double x = ctx.inputs[0].flat(i), z = ctx.inputs[1].flat(i), g = ctx.grad_output.flat(i);
          gx.set_flat(i, g * 2 * c * x * z);
          gz.set_flat(i, g * c * x * x);
        }
        return Cotangents{gx, gz};
      },
      std::move(rule));
}

}  // namespace

TEST_CASE("a custom op with a JVP rule only: create_graph/jvp/hvp run on its transpose",
          "[core][higher_order]") {
  Generator gen(31);
  const double c = 1.5;
  using In = std::vector<Tensor>;
  // dy = c (2 x z dx + x^2 dz): linear in (dx, dz).
  const JvpRuleFn right = [c](const In& p, const In& t) { return (p[0] * p[1] * t[0] * 2.0 + p[0] * p[0] * t[1]) * c; };
  const JvpRuleFn wrong = [c](const In& p, const In& t) { return (p[0] * p[1] * t[0] * 3.0 + p[0] * p[0] * t[1]) * c; };
  const Array x = rnd({3}, gen), z = rnd({3}, gen, 0.5, 1.5);
  const auto f = [&](const JvpRuleFn& rule) {
    return [&, rule](const In& v) { return ops::tanh(scaled_square(v[0], v[1], c, rule)); };
  };
  const GradcheckReport ok = gradgradcheck(f(right), {x, z}, {}, {"x", "z"});
  INFO(ok.summary());
  CHECK(ok.passed);
  CHECK(ok.comparisons > 0);
  const GradcheckReport jok = jvpcheck(f(right), {x, z}, {}, {"x", "z"});
  INFO(jok.summary());
  CHECK(jok.passed);
  // A rule that disagrees with the op's derivative fails both checks.
  CHECK_FALSE(gradgradcheck(f(wrong), {x, z}, {}, {"x", "z"}).passed);
  CHECK_FALSE(jvpcheck(f(wrong), {x, z}, {}, {"x", "z"}).passed);
  // hvp of sum(y) in x for fixed z: H = diag(2 c z).
  const Array v = rnd({3}, gen);
  const Array hv = hvp([&](const Tensor& t) { return ops::sum(scaled_square(t, Tensor(z), c, right)); }, x, v);
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::fabs(hv.flat(i) - 2 * c * z.flat(i) * v.flat(i)) <= 1e-14);
  // An empty rule is refused when the op is made.
  const std::string msg = error_of<ValueError>([&] { scaled_square(Tensor(x, true), Tensor(z), c, JvpRuleFn()); });
  CHECK_THAT(msg, Catch::Contains("[scaled_square]") && Catch::Contains("JVP rule is empty"));
}

TEST_CASE("create_graph through an op without a second-order rule is refused naming the op",
          "[core][higher_order][errors]") {
  Tape tape;
  const Tensor x(from({2}, {1.0, 2.0}), true);
  const Tensor y = ops::sum(passthrough_no_rule(x) * x);
  const std::size_t before = tape.size();
  const std::string msg = error_of<TapeError>([&] { grad(y, {x}, Tensor(), graph()); });
  CHECK_THAT(msg, Catch::Contains("[passthrough_without_rule]") && Catch::Contains("no second-order rule") &&
                     Catch::Contains("a differentiable VJP or a JVP rule"));
  CHECK(tape.size() == before);  // refused before anything was recorded
  // jvp through it is refused the same way, naming the op and what it lacks.
  const std::string msg3 = error_of<TapeError>([&] {
    jvp([](const std::vector<Tensor>& v) { return passthrough_no_rule(v[0]); }, {from({2}, {1.0, 2.0})},
        {from({2}, {1.0, 1.0})});
  });
  CHECK_THAT(msg3, Catch::Contains("[passthrough_without_rule]") && Catch::Contains("JVP rule"));
  const std::string msg2 = error_of<TapeError>([&] {
    BackwardOptions o = graph();
    backward(y, Array(), o);
  });
  CHECK_THAT(msg2, Catch::Contains("passthrough_without_rule"));
  CHECK_FALSE(x.has_grad());
  // The plain pass still works.
  CHECK(grad(y, {x})[0].size() == 2);
}

TEST_CASE("create_graph: the fused attention path falls back to the composed path's second derivatives",
          "[core][higher_order][attention]") {
  Generator gen(23);
  const Array q = rnd({1, 2, 3, 2}, gen), k = rnd({1, 1, 3, 2}, gen), v = rnd({1, 1, 3, 2}, gen), w = rnd({3, 2}, gen);
  const Array dq = rnd({1, 2, 3, 2}, gen);
  const nn::Visibility vis = nn::Visibility::causal(3, 3);
  // hvp of a scalar of the attention output, in Q: fused and composed paths.
  const auto run = [&](nn::SdpaImpl impl) {
    return hvp(
        [&](const Tensor& Q) {
          nn::SdpaOptions o;
          o.impl = impl;
          const nn::SdpaResult r = nn::scaled_dot_product_attention(Q, Tensor(k), Tensor(v), vis, o);
          REQUIRE(r.path == impl);
          return ops::sum(ops::tanh(r.output) * Tensor(w));
        },
        q, dq);
  };
  const Array fused = run(nn::SdpaImpl::fused), composed = run(nn::SdpaImpl::composed);
  require_near(fused, composed, 1e-13);
  const GradcheckReport r = gradgradcheck(
      [&](const std::vector<Tensor>& in) {
        nn::SdpaOptions o;
        o.impl = nn::SdpaImpl::fused;
        return nn::scaled_dot_product_attention(in[0], in[1], in[2], vis, o).output;
      },
      {q, k, v}, {}, {"Q", "K", "V"});
  INFO(r.summary());
  CHECK(r.passed);
}

TEST_CASE("grad's Array overload refuses create_graph and custom_op refuses an empty rule",
          "[core][higher_order][errors]") {
  Tape tape;
  const Tensor x(from({2}, {1.0, 2.0}), true);
  const Tensor y = ops::sum(x * x);
  CHECK_THAT(error_of<ValueError>([&] { grad(y, {x}, Array(), graph()); }), Catch::Contains("Tensor seed"));
  CHECK_THAT(error_of<ValueError>([&] { cube(x, DiffVjpFn()); }), Catch::Contains("[cube]"));
}

TEST_CASE("backward with create_graph keeps a differentiable gradient in grad_graph", "[core][higher_order]") {
  Tape tape;
  const Array xv = from({3}, {0.5, -1.0, 2.0});
  Tensor x(xv, true);
  backward(ops::sum(x * x * x), Array(), graph());
  REQUIRE(x.has_grad());
  const Tensor g = x.grad_graph();
  REQUIRE(g.defined());
  for (std::size_t i = 0; i < 3; ++i) CHECK(g.value().flat(i) == x.grad().flat(i));
  const Array g2 = grad(ops::sum(g), {x})[0];
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::fabs(g2.flat(i) - 6 * xv.flat(i)) <= 1e-14 * 12);
  // A plain pass into the leaf drops the recorded gradient (it would no longer match).
  backward(ops::sum(x));
  CHECK_FALSE(x.grad_graph().defined());
}

TEST_CASE("create_graph: two backward passes accumulate in grad_graph and y may be a leaf", "[core][higher_order]") {
  Tape tape;
  const Array xv = from({2}, {1.5, -0.5});
  Tensor x(xv, true);
  backward(ops::sum(x * x), Array(), graph());      // 2 x
  backward(ops::sum(x * x * x), Array(), graph());  // + 3 x^2
  const Tensor g = x.grad_graph();
  REQUIRE(g.defined());
  for (std::size_t i = 0; i < 2; ++i) {
    const double v = xv.flat(i);
    CHECK(g.value().flat(i) == x.grad().flat(i));
    CHECK(std::fabs(x.grad().flat(i) - (2 * v + 3 * v * v)) <= 1e-14 * 8);
  }
  const Array g2 = grad(ops::sum(g), {x})[0];  // 2 + 6 x
  for (std::size_t i = 0; i < 2; ++i) CHECK(std::fabs(g2.flat(i) - (2 + 6 * xv.flat(i))) <= 1e-14 * 12);
  // y a leaf: its own gradient is the seed (a constant: no graph to differentiate).
  const std::vector<Tensor> self = grad(x, {x}, Tensor(from({2}, {3.0, 4.0})), graph());
  CHECK(self[0].value().flat(1) == 4.0);
  CHECK_FALSE(self[0].requires_grad());
}

TEST_CASE("jvp and hvp agree with the Jacobian and the Hessian", "[core][higher_order]") {
  Generator gen(29);
  const Array a = rnd({3, 2}, gen), b = rnd({2, 2}, gen), ta = rnd({3, 2}, gen), tb = rnd({2, 2}, gen);
  const auto f = [](const std::vector<Tensor>& v) { return ops::tanh(ops::matmul(v[0], v[1])); };
  const JvpResult r = jvp(f, {a, b}, {ta, tb});
  // The reference: J v from the full Jacobian, row by row with plain backward passes.
  Tape tape;
  const Tensor A(a, true), B(b, true);
  const Tensor y = f({A, B});
  Array expected = Array::zeros(y.shape(), DType::float64);
  for (std::size_t i = 0; i < y.size(); ++i) {
    Array e = Array::zeros(y.shape(), DType::float64);
    e.set_flat(i, 1.0);
    BackwardOptions keep;
    keep.retain_graph = true;
    const auto g = grad(y, {A, B}, e, keep);
    double s = 0;
    for (std::size_t j = 0; j < a.size(); ++j) s += g[0].flat(j) * ta.flat(j);
    for (std::size_t j = 0; j < b.size(); ++j) s += g[1].flat(j) * tb.flat(j);
    expected.set_flat(i, s);
  }
  require_near(r.output, y.value(), 0);
  require_near(r.tangent, expected, 1e-14);

  // hvp against the Hessian times v.
  const Array x = rnd({4}, gen), v = rnd({4}, gen);
  const auto h = [](const Tensor& t) { return ops::sum(ops::exp(t) * ops::softmax(t * t, -1)); };
  const Array Hv = hvp(h, x, v), H = hessian(h, x);
  Array HxV = Array::zeros({4}, DType::float64);
  for (std::size_t i = 0; i < 4; ++i) {
    double acc = 0;
    for (std::size_t j = 0; j < 4; ++j) acc += H.flat(i * 4 + j) * v.flat(j);
    HxV.set_flat(i, acc);
  }
  require_near(Hv, HxV, 1e-13);
  // A function linear in x: its Hessian is zero (the gradient does not depend on x).
  require_near(hvp([](const Tensor& t) { return ops::sum(t * 3.0); }, x, v), Array::zeros({4}, DType::float64), 0);
}

TEST_CASE("jvp of an elementwise square is 2 x v", "[core][higher_order]") {
  const Array x = from({3}, {1.0, -2.0, 0.5}), v = from({3}, {0.25, 1.0, -3.0});
  const JvpResult r = jvp([](const std::vector<Tensor>& in) { return in[0] * in[0]; }, {x}, {v});
  require_near(r.tangent, from({3}, {0.5, -4.0, -3.0}), 1e-15);
}

TEST_CASE("jvp hvp and hessian refuse bad shapes and dtypes naming the argument", "[core][higher_order][errors]") {
  const Array x = from({3}, {1.0, 2.0, 3.0});
  const auto f = [](const std::vector<Tensor>& in) { return in[0] * in[0]; };
  const auto s = [](const Tensor& t) { return ops::sum(t * t); };
  CHECK_THAT(error_of<ShapeError>([&] { jvp(f, {x}, {Array::zeros({2}, DType::float64)}); }),
             Catch::Contains("[jvp]") && Catch::Contains("tangents[0] has shape (2)") && Catch::Contains("(3)"));
  CHECK_THAT(error_of<DTypeError>([&] { jvp(f, {x}, {Array::zeros({3}, DType::float32)}); }),
             Catch::Contains("[jvp]") && Catch::Contains("tangents[0] is float32"));
  CHECK_THAT(error_of<ValueError>([&] { jvp(f, {x}, {}); }), Catch::Contains("0 tangents for 1 primals"));
  CHECK_THAT(error_of<ShapeError>([&] { hvp(s, x, Array::zeros({3, 1}, DType::float64)); }),
             Catch::Contains("[hvp]") && Catch::Contains("v has shape (3, 1)"));
  CHECK_THAT(error_of<DTypeError>([&] { hvp(s, x, Array::zeros({3}, DType::float32)); }), Catch::Contains("v is float32"));
  CHECK_THAT(error_of<ValueError>([&] { hvp([](const Tensor& t) { return t * t; }, x, x); }),
             Catch::Contains("one element"));
  CHECK_THAT(error_of<ValueError>([&] { hessian(s, Array::zeros({kHessianMaxElements + 1}, DType::float64)); }),
             Catch::Contains("[hessian]") && Catch::Contains("at most 1024"));
  CHECK_THAT(error_of<ValueError>([&] { hessian(s, x, 2); }), Catch::Contains("at most 2"));
}

TEST_CASE("hvp with respect to existing leaves equals the one-input hvp over the same vector",
          "[core][higher_order]") {
  Generator gen(31);
  const Array a = rnd({2, 3}, gen), b = rnd({3}, gen), va = rnd({2, 3}, gen), vb = rnd({3}, gen);
  const Tensor A(a, true), Bt(b, true);
  const auto loss = [](const Tensor& p, const Tensor& q) { return ops::sum(ops::exp(ops::tanh(p) * q)); };
  const std::vector<Array> hv = hvp([&] { return loss(A, Bt); }, {A, Bt}, {va, vb});
  REQUIRE(hv.size() == 2);
  // The reference: both parameters packed into one vector of 9, through the one-input hvp.
  std::vector<double> x, v;
  for (std::size_t i = 0; i < 6; ++i) x.push_back(a.flat(i)), v.push_back(va.flat(i));
  for (std::size_t i = 0; i < 3; ++i) x.push_back(b.flat(i)), v.push_back(vb.flat(i));
  const Array packed = hvp(
      [&](const Tensor& t) {
        return loss(ops::reshape(ops::slice(t, 0, 0, 6), {2, 3}), ops::slice(t, 0, 6, 9));
      },
      from({9}, x), from({9}, v));
  std::vector<double> first(packed.to_vector()), second(first.begin() + 6, first.end());
  first.resize(6);
  require_near(hv[0], from({2, 3}, first), 1e-14);
  require_near(hv[1], from({3}, second), 1e-14);
  CHECK_FALSE(A.has_grad());  // .grad() untouched
  CHECK_THAT(error_of<ValueError>([&] { hvp([&] { return loss(A, Bt); }, {A, A * 2.0}, {va, va}); }),
             Catch::Contains("[hvp]") && Catch::Contains("params[1] must be a leaf"));
  CHECK_THAT(error_of<ShapeError>([&] { hvp([&] { return loss(A, Bt); }, {A, Bt}, {va, va}); }),
             Catch::Contains("[hvp]") && Catch::Contains("v[1] has shape (2, 3)"));
}

TEST_CASE("hutchinson_diagonal is exact for a diagonal Hessian and within its bound otherwise",
          "[core][higher_order]") {
  Generator gen(37);
  // Diagonal Hessian (-2 tanh (1 - tanh^2)): the off-diagonal terms vanish, one sample is exact.
  const Array x = rnd({5}, gen);
  const ScalarFn diagonal = [](const Tensor& t) { return ops::sum(ops::tanh(t)); };
  Generator draws(1);
  const Array exact_diag = hutchinson_diagonal(diagonal, x, 1, draws);
  const Array H1 = hessian(diagonal, x);
  Array d1 = Array::zeros({5}, DType::float64);
  for (std::size_t i = 0; i < 5; ++i) d1.set_flat(i, H1.flat(i * 5 + i));
  REQUIRE(H1.flat(0) != 0.0);
  require_near(exact_diag, d1, 1e-15);

  // A dense Hessian: each element of the mean of N samples is within 6 standard deviations,
  // sqrt(sum_{j != i} H_ij^2 / N), of H_ii.
  const Array y = rnd({6}, gen);
  const ScalarFn dense = [](const Tensor& t) { return ops::sum(ops::exp(t) * ops::softmax(t * t, -1)); };
  const Array H = hessian(dense, y);
  const std::size_t N = 2000;
  const Array est = hutchinson_diagonal(dense, y, N, draws);
  double off_total = 0;
  for (std::size_t i = 0; i < 6; ++i) {
    double off = 0;
    for (std::size_t j = 0; j < 6; ++j)
      if (j != i) off += H.flat(i * 6 + j) * H.flat(i * 6 + j);
    off_total += off;
    const double bound = 6 * std::sqrt(off / double(N));
    INFO("i " << i << ": estimate " << text(est.flat(i)) << ", H_ii " << text(H.flat(i * 6 + i)) << ", bound "
              << text(bound));
    CHECK(std::fabs(est.flat(i) - H.flat(i * 6 + i)) <= bound);
  }
  REQUIRE(off_total > 1e-3);  // the case has off-diagonal terms to average away
  // One sample is not the diagonal here (the off-diagonal terms do not cancel in one draw).
  const Array one = hutchinson_diagonal(dense, y, 1, draws);
  double miss = 0;
  for (std::size_t i = 0; i < 6; ++i) miss = std::max(miss, std::fabs(one.flat(i) - H.flat(i * 6 + i)));
  CHECK(miss > 1e-6);

  // The parameter form over two leaves agrees with the diagonal of the packed Hessian's blocks.
  const Tensor P(rnd({2, 2}, gen), true), Q(rnd({2}, gen), true);
  const auto pq = [&] { return ops::sum(ops::tanh(P) * ops::exp(Q)); };  // d2/dP dQ != 0, diagonals too
  const std::vector<Array> dpq = hutchinson_diagonal(LossFn(pq), {P, Q}, N, draws);
  REQUIRE(dpq.size() == 2);
  REQUIRE(dpq[0].shape() == Shape{2, 2});
  for (std::size_t r = 0; r < 2; ++r)
    for (std::size_t c = 0; c < 2; ++c) {
      const double t = std::tanh(P.value().flat(r * 2 + c)), e = std::exp(Q.value().flat(c));
      const double hpp = -2 * t * (1 - t * t) * e;  // d2/dP_rc^2
      const double hpq = (1 - t * t) * e;           // d2/dP_rc dQ_c: the only off-diagonal term
      CHECK(std::fabs(dpq[0].flat(r * 2 + c) - hpp) <= 6 * std::sqrt(hpq * hpq / double(N)));
    }
  for (std::size_t c = 0; c < 2; ++c) {
    double hqq = 0, off = 0;
    for (std::size_t r = 0; r < 2; ++r) {
      const double t = std::tanh(P.value().flat(r * 2 + c)), e = std::exp(Q.value().flat(c));
      hqq += t * e;
      off += std::pow((1 - t * t) * e, 2);
    }
    CHECK(std::fabs(dpq[1].flat(c) - hqq) <= 6 * std::sqrt(off / double(N)));
  }
  CHECK_THAT(error_of<ValueError>([&] { hutchinson_diagonal(dense, y, 0, draws); }),
             Catch::Contains("[hutchinson_diagonal]") && Catch::Contains("samples must be at least 1"));
}
