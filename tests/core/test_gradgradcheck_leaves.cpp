// Second-order checks of leaves read in place (core/gradcheck.hpp): gradgradcheck_leaves and
// jvpcheck_leaves pass real layers, fail a module whose custom op has a wrong second-order
// rule (naming the parameter), leave every leaf's value bit for bit as it was (also when f
// throws) and refuse what they cannot check.

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

using Leaves = std::vector<std::pair<std::string, Tensor>>;

// How the cube op's second-order rule is written.
enum class Rule {
  right,     // g * 3 x^2 with x recorded
  detached,  // the same values with x detached: claims d/dx (3 x^2 g) = 0
  wrong,     // g * 6 x^2: wrong values (the first-order VJP stays right)
};

// x^3 as a custom op with a right first-order VJP and the second-order rule `rule`.
Tensor cube(const Tensor& x, Rule rule) {
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
      [rule](const DiffVjpContext& c) {
        const Tensor x = rule == Rule::detached ? c.inputs[0].detach() : c.inputs[0];
        return DiffCotangents{c.grad_output * (x * x * (rule == Rule::wrong ? 6.0 : 3.0))};
      });
}

// A layer y = cube(x * w) + b with parameters w and b (d of each).
class CubeLayer : public nn::Module {
 public:
  explicit CubeLayer(std::size_t d)
      : w(register_parameter("w", Array::from_vector({d}, std::vector<double>(d, 1.25), DType::float64))),
        b(register_parameter("b", Array::zeros({d}, DType::float64))) {}
  Tensor operator()(const Tensor& x, Rule rule) const { return cube(x * w, rule) + b; }
  Tensor w, b;
};

// The leaves' values as copies, to compare bit for bit afterwards.
std::vector<Array> snapshot(const Leaves& leaves) {
  std::vector<Array> out;
  for (const auto& kv : leaves) out.push_back(kv.second.value().clone());
  return out;
}

void require_same_values(const Leaves& leaves, const std::vector<Array>& before) {
  REQUIRE(leaves.size() == before.size());
  for (std::size_t k = 0; k < leaves.size(); ++k) {
    INFO("leaf " << leaves[k].first);
    CHECK(same_bits(leaves[k].second.value(), before[k]));
  }
}

GradcheckOptions projection() {
  GradcheckOptions o;
  o.mode = GradcheckOptions::Mode::projection;
  return o;
}

}  // namespace

TEST_CASE("gradgradcheck_leaves and jvpcheck_leaves pass real layers in place in both modes",
          "[core][gradcheck][higher_order]") {
  Generator gen(41);
  nn::FeedForward ff(4, 8, gen, 0.0, DType::float64);  // GELU: curved, so the Hessian is not zero
  for (auto& kv : ff.named_parameters()) {
    Tensor t = kv.second;
    t.set_value(rnd(t.shape(), gen, -0.6, 0.6));
  }
  const Tensor x(rnd({2, 3, 4}, gen), true);
  Leaves leaves = {{"x", x}};
  for (auto& kv : ff.named_parameters()) leaves.push_back(kv);
  const std::vector<Array> before = snapshot(leaves);
  const auto f = [&] { return ff(x); };

  GradcheckOptions full;
  full.mode = GradcheckOptions::Mode::full;
  const GradcheckReport gg = gradgradcheck_leaves(f, leaves, full);
  INFO(gg.summary());
  CHECK(gg.passed);
  CHECK(gg.mode == "full");
  // G has one output per leaf element (N) and N + |v| inputs: every pair compared.
  std::size_t N = 0;
  for (const auto& kv : leaves) N += kv.second.size();
  CHECK(gg.comparisons == N * (N + 2 * 3 * 4));
  require_same_values(leaves, before);

  const GradcheckReport gp = gradgradcheck_leaves(f, leaves, projection());
  INFO(gp.summary());
  CHECK(gp.passed);
  CHECK(gp.mode == "projection");
  CHECK(gp.comparisons == 3 * (leaves.size() + 1));  // 3 rounds, each leaf and v
  require_same_values(leaves, before);

  const GradcheckReport jv = jvpcheck_leaves(f, leaves);
  INFO(jv.summary());
  CHECK(jv.passed);
  CHECK(jv.mode == "jvp");
  CHECK(jv.comparisons == 3 * (2 * 3 * 4 + 1));  // 3 rounds: every output element and the identity
  require_same_values(leaves, before);
  // The leaves ask for gradients exactly as before (x and the parameters did).
  for (const auto& kv : leaves) CHECK(kv.second.requires_grad());
}

TEST_CASE("gradgradcheck_leaves fails a module whose second-order rule is wrong and names the parameter",
          "[core][gradcheck][higher_order]") {
  CubeLayer m(3);
  Tensor w = m.w, b = m.b;
  w.set_value(Array::from_vector({3}, {0.8, -1.1, 1.3}, DType::float64));
  b.set_value(Array::from_vector({3}, {0.1, 0.2, -0.3}, DType::float64));
  const Tensor x(Array::from_vector({2, 3}, {0.7, 1.2, -0.9, 1.4, -0.6, 0.5}, DType::float64));  // a constant input
  const Leaves leaves = m.named_parameters();
  const std::vector<Array> before = snapshot(leaves);

  // First order cannot see any of it: the first-order VJP is right in all three.
  for (Rule rule : {Rule::right, Rule::detached, Rule::wrong})
    CHECK(gradcheck_leaves([&] { return m(x, rule); }, leaves).passed);

  for (const GradcheckOptions& o : {GradcheckOptions{}, projection()}) {
    const GradcheckReport ok = gradgradcheck_leaves([&] { return m(x, Rule::right); }, leaves, o);
    INFO(ok.summary());
    CHECK(ok.passed);

    // Values right, graph wrong: the second derivative in w is claimed 0.
    const GradcheckReport detached = gradgradcheck_leaves([&] { return m(x, Rule::detached); }, leaves, o);
    INFO(detached.summary());
    CHECK_FALSE(detached.passed);
    CHECK(detached.input_name == "w");
    CHECK(detached.analytic == 0.0);
    CHECK(std::fabs(detached.numeric) > 0.1);
    require_same_values(leaves, before);

    // Wrong values: twice the right ones, seen through w and through the cotangent v.
    const GradcheckReport wrong = gradgradcheck_leaves([&] { return m(x, Rule::wrong); }, leaves, o);
    INFO(wrong.summary());
    CHECK_FALSE(wrong.passed);
    CHECK(wrong.max_rel_error > 0.4);
    require_same_values(leaves, before);
  }

  // jvpcheck_leaves sees wrong values (J u is twice the difference) but, as jvpcheck, not a
  // detached graph: the linearised reverse mode differentiates the rule in the cotangent only.
  CHECK(jvpcheck_leaves([&] { return m(x, Rule::right); }, leaves).passed);
  CHECK(jvpcheck_leaves([&] { return m(x, Rule::detached); }, leaves).passed);
  const GradcheckReport jv = jvpcheck_leaves([&] { return m(x, Rule::wrong); }, leaves);
  INFO(jv.summary());
  CHECK_FALSE(jv.passed);
  CHECK(jv.max_rel_error > 0.4);
  require_same_values(leaves, before);
}

TEST_CASE("gradgradcheck_leaves restores every leaf bit for bit when f throws and refuses bad leaves",
          "[core][gradcheck][higher_order][errors]") {
  CubeLayer m(3);
  Tensor w = m.w;
  w.set_value(Array::from_vector({3}, {0.8, -1.1, 1.3}, DType::float64));
  const Tensor x(Array::from_vector({3}, {0.7, 1.2, -0.9}, DType::float64), false);  // does not require grad
  const Leaves leaves = {{"x", x}, {"w", m.w}, {"b", m.b}};
  const std::vector<Array> before = snapshot(leaves);
  // f throws on call number `throw_at`: on the numeric side, with a leaf moved (gradgradcheck_leaves:
  // calls 1 and 2 are the output's shape and the recorded G, 3 and 4 the first element of x
  // moved up and down, 5 its second element moved up; jvpcheck_leaves: call 2 runs with every
  // leaf moved).
  int calls = 0, throw_at = 5;
  const auto f = [&] {
    if (++calls == throw_at) throw std::runtime_error("f failed on purpose");
    return m(x, Rule::right);
  };
  CHECK_THROWS_WITH(gradgradcheck_leaves(f, leaves), Catch::Contains("on purpose"));
  require_same_values(leaves, before);
  CHECK_FALSE(x.requires_grad());  // made to require grad for the check, and back
  calls = 0;
  throw_at = 2;
  CHECK_THROWS_WITH(jvpcheck_leaves(f, leaves), Catch::Contains("on purpose"));
  require_same_values(leaves, before);
  CHECK_FALSE(x.requires_grad());

  // Not a leaf; float32 not asked for; an op without a second-order rule.
  CHECK_THROWS_WITH(gradgradcheck_leaves([&] { return m(x, Rule::right); }, {{"y", m.w * 2.0}}),
                    Catch::Contains("[gradgradcheck_leaves]") && Catch::Contains("'y' is not a leaf"));
  const Tensor x32(Array::of({1.0, 2.0}, DType::float32), true);
  CHECK_THROWS_AS(gradgradcheck_leaves([&] { return x32 * x32; }, {{"x32", x32}}), DTypeError);
  CHECK_THROWS_AS(jvpcheck_leaves([&] { return x32 * x32; }, {{"x32", x32}}), DTypeError);
  GradcheckOptions none = projection();
  none.projections = 0;  // no comparison at all would be a pass that checked nothing
  CHECK_THROWS_WITH(gradgradcheck_leaves([&] { return m(x, Rule::right); }, leaves, none),
                    Catch::Contains("[gradgradcheck_leaves]") && Catch::Contains("projections >= 1"));
  CHECK_THROWS_WITH(jvpcheck_leaves([&] { return m(x, Rule::right); }, leaves, none),
                    Catch::Contains("[jvpcheck_leaves]") && Catch::Contains("projections must be >= 1"));
  const auto no_rule = [&] {
    return custom_op(
        "times_w_without_rule", {m.w}, [](const std::vector<Array>& in) { return in[0].clone(); },
        [](const VjpContext& c) { return Cotangents{c.grad_output}; }) * m.w;
  };
  CHECK_THROWS_WITH(gradgradcheck_leaves(no_rule, {{"w", m.w}}), Catch::Contains("times_w_without_rule"));
  CHECK_THROWS_WITH(jvpcheck_leaves(no_rule, {{"w", m.w}}), Catch::Contains("times_w_without_rule"));
  require_same_values(leaves, before);
}
