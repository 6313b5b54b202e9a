// The gradient-check suite itself (checks/suite.hpp, checks/): each kind of check
// fails when it should -- a wrong VJP, wrong mask handling, a wrong GQA mapping, a gradient
// leaking into a forbidden position -- and the runner's table, JSON report, filter, list and
// exit status do what docs/gradcheck.md says. (Each built-in check runs as a test case of its own:
// tests/checks/test_builtin_checks.cpp.)
#include <nlohmann/json.hpp>
#include <sstream>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/suite.hpp>
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

// sin with a VJP whose sign is flipped everywhere: a wrong VJP.
Tensor sin_wrong_sign(const Tensor& x) {
  return custom_op(
      "sin_wrong_sign", {x},
      [](const std::vector<Array>& in) {
        NoGradGuard ng;
        Array y = in[0].clone();
        for (std::size_t i = 0; i < y.size(); ++i) y.set_flat(i, std::sin(in[0].flat(i)));
        return y;
      },
      [](const VjpContext& c) {
        Array g = c.grad_output.clone();
        for (std::size_t i = 0; i < g.size(); ++i) g.set_flat(i, -g.flat(i) * std::cos(c.inputs[0].flat(i)));
        return Cotangents{g};
      });
}

// y = x * w with w's cotangent negated: a module parameter with a wrong gradient.
Tensor scale_wrong_w(const Tensor& x, const Tensor& w) {
  return custom_op(
      "scale_wrong_w", {x, w},
      [](const std::vector<Array>& in) {
        NoGradGuard ng;
        return (Tensor(in[0]) * Tensor(in[1])).value();
      },
      [](const VjpContext& c) {
        NoGradGuard ng;
        const Tensor x(c.inputs[0]), w(c.inputs[1]), g(c.grad_output);
        return Cotangents{(g * w).value(), (-ops::sum(g * x, {0})).value()};
      });
}

class Scale : public nn::Module {
 public:
  explicit Scale(std::size_t d) : w(register_parameter("w", Array::full({d}, 1.5, DType::float64))) {}
  Tensor w;
};

// A straightforward attention core (repeat K and V per query head, additive mask, softmax),
// correct unless a bug is chosen:
enum class Bug {
  none,
  post_softmax_mask,  // softmax over every key, then multiply by the 0/1 mask (no renormalisation)
  finite_mask,        // -30 instead of -inf at forbidden keys: a tiny gradient leaks into them
  gqa_modulo,         // query head h reads kv head h % H_kv instead of floor(h / r)
};

Tensor naive_attention(const Tensor& Q, const Tensor& K, const Tensor& V, const nn::Visibility& vis,
                       const nn::SdpaOptions& o, Bug bug) {
  const std::size_t B = Q.shape()[0], H_q = Q.shape()[1], T = Q.shape()[2], S = K.shape()[2], H_kv = K.shape()[1];
  std::vector<std::int64_t> g(H_q);
  for (std::size_t h = 0; h < H_q; ++h) g[h] = static_cast<std::int64_t>(bug == Bug::gqa_modulo ? h % H_kv : h / (H_q / H_kv));
  const IndexArray map(Shape{H_q}, g);
  const Tensor Kh = ops::index_select(K, 1, map), Vh = ops::index_select(V, 1, map);
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(Q.shape()[3]));
  const Tensor U = ops::matmul(Q, Kh, {false, true}) * scale;  // [B, H_q, T, S]
  Array bias = ops::broadcast_to(Tensor(vis.bias(Q.dtype())), {B, H_q, T, S}).value().clone();
  std::vector<unsigned char> row_valid(B * T, 1);
  if (o.query_valid.size() > 0) row_valid = o.query_valid.data;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H_q; ++h)
      for (std::size_t i = 0; i < T; ++i)
        if (!row_valid[b * T + i])
          for (std::size_t j = 0; j < S; ++j) bias.set_flat(((b * H_q + h) * T + i) * S + j, 0.0);  // zeroed below
  Tensor A;
  if (bug == Bug::post_softmax_mask || bug == Bug::finite_mask) {
    Array soft = bias.clone(), keep = bias.clone(), finite = bias.clone();
    for (std::size_t k = 0; k < bias.size(); ++k) {
      const bool forbidden = std::isinf(bias.flat(k));
      soft.set_flat(k, forbidden ? 0.0 : bias.flat(k));
      keep.set_flat(k, forbidden ? 0.0 : 1.0);
      finite.set_flat(k, forbidden ? -30.0 : bias.flat(k));
    }
    A = bug == Bug::post_softmax_mask ? ops::softmax(U + Tensor(soft)) * Tensor(keep) : ops::softmax(U + Tensor(finite));
  } else {
    A = ops::softmax(ops::add_mask(U, bias));
  }
  const Tensor O = ops::matmul(A, Vh);
  std::vector<unsigned char> cond(B * T);
  for (std::size_t k = 0; k < B * T; ++k) cond[k] = row_valid[k];
  return ops::where(BoolArray({B, 1, T, 1}, cond), O, ops::scalar_like(O, 0.0));
}

checks::AttentionFn with_bug(Bug bug) {
  return [bug](const Tensor& Q, const Tensor& K, const Tensor& V, const nn::Visibility& vis, const nn::SdpaOptions& o) {
    return naive_attention(Q, K, V, vis, o, bug);
  };
}

// Runs the suite quietly; returns the report and the printed text.
SuiteReport run_quiet(const GradcheckSuite& suite, const RunOptions& opts, std::string* text = nullptr) {
  std::ostringstream os;
  SuiteReport r = run_suite(suite, opts, os);
  if (text) *text = os.str();
  return r;
}

const CheckResult& result_of(const SuiteReport& r, const std::string& name) {
  for (const CheckRecord& c : r.records)
    if (c.name == name) return c.result;
  FAIL("no check named " << name);
  throw std::logic_error("unreachable");
}

std::string last_line(const std::string& text) {
  std::string t = text;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return t.substr(t.rfind('\n') + 1);
}

// All attention checks (gradient, reference, invariants) for one implementation.
GradcheckSuite attention_suite(Bug bug) {
  GradcheckSuite s;
  checks::register_attention_gradient_checks(s, "impl", with_bug(bug));
  checks::register_attention_reference_checks(s, "impl", with_bug(bug));
  checks::register_attention_invariant_checks(s, "impl", with_bug(bug));
  return s;
}

}  // namespace

TEST_CASE("gradcheck suite: a wrong VJP fails its check and the details name the input and element",
          "[gradcheck][suite]") {
  GradcheckSuite s;
  s.add_gradient_check(
      "mine/sin", "x (2, 3) in [0.5, 1.5]", [](CheckContext& ctx) { return std::vector<Array>{ctx.uniform({2, 3}, 0.5, 1.5)}; },
      [](const std::vector<Tensor>& in) { return sin_wrong_sign(in[0]); }, {"x"});
  s.add_gradient_check(
      "mine/tanh", "x (3)", [](CheckContext& ctx) { return std::vector<Array>{ctx.uniform({3})}; },
      [](const std::vector<Tensor>& in) { return ops::tanh(in[0]); }, {"x"});
  std::string text;
  const SuiteReport r = run_quiet(s, {}, &text);
  CHECK(r.passed == 1);
  CHECK(r.failed == 1);
  CHECK_FALSE(r.all_passed());
  const CheckResult& bad = result_of(r, "mine/sin");
  CHECK_FALSE(bad.passed);
  CHECK(bad.mode == "full");
  CHECK(bad.worst.rfind("x[", 0) == 0);
  CHECK(bad.max_abs_error > 0.5);  // 2 cos(x) with cos(x) > 0.07 on [0.5, 1.5]
  CHECK_THAT(text, Catch::Contains("FAILED") && Catch::Contains("worst element: x index ("));
  CHECK(last_line(text) == "1 passed, 1 failed");
  // float32: the same check, the same verdict.
  RunOptions o32;
  o32.dtype = DType::float32;
  CHECK_FALSE(result_of(run_quiet(s, o32), "mine/sin").passed);
  CHECK(result_of(run_quiet(s, o32), "mine/tanh").passed);
}

TEST_CASE("gradcheck suite: gradcheck_leaves names a module parameter with a wrong gradient and restores values",
          "[gradcheck][suite]") {
  Scale m(3);
  const Tensor x(Array::of({{0.5, -1.0, 2.0}, {1.5, 0.25, -0.75}}), true);
  const Array before = m.w.value();
  auto leaves = m.named_parameters();
  leaves.insert(leaves.begin(), std::make_pair(std::string("x"), x));
  const GradcheckReport r = gradcheck_leaves([&] { return scale_wrong_w(x, m.w); }, leaves);
  CHECK_FALSE(r.passed);
  CHECK(r.input_name == "w");
  CHECK(r.mode == "full");
  XGT_CHECK_SAME(m.w.value(), before);  // restored
  // Projection mode says the same.
  GradcheckOptions o;
  o.mode = GradcheckOptions::Mode::projection;
  const GradcheckReport rp = gradcheck_leaves([&] { return scale_wrong_w(x, m.w); }, leaves, o);
  CHECK_FALSE(rp.passed);
  CHECK(rp.input_name == "w");
  // A correct layer passes in both modes.
  CHECK(gradcheck_leaves([&] { return ops::tanh(x * m.w); }, leaves).passed);
  CHECK(gradcheck_leaves([&] { return ops::tanh(x * m.w); }, leaves, o).passed);
  // Leaves must be leaves, float32 must be asked for.
  CHECK_THROWS_WITH(gradcheck_leaves([&] { return x * 2.0; }, {{"y", x * 2.0}}),
                    Catch::Contains("[gradcheck_leaves]") && Catch::Contains("'y' is not a leaf"));
  const Tensor x32(Array::of({1.0, 2.0}, DType::float32), true);
  CHECK_THROWS_WITH(gradcheck_leaves([&] { return x32 * x32; }, {{"x32", x32}}), Catch::Contains("float32"));
}

TEST_CASE("gradcheck suite: a naive but correct attention core passes every attention check",
          "[gradcheck][suite][attention]") {
  const SuiteReport r = run_quiet(attention_suite(Bug::none), {});
  for (const CheckRecord& c : r.records) {
    INFO(c.name << ": " << c.result.message);
    CHECK(c.result.passed);
  }
  CHECK(r.records.size() >= 20);
}

TEST_CASE("gradcheck suite: wrong mask handling (softmax then multiply by the 0/1 mask) is caught",
          "[gradcheck][suite][attention]") {
  const SuiteReport r = run_quiet(attention_suite(Bug::post_softmax_mask), {});
  // The broken core's tape is consistent with its own forward: finite differences pass...
  CHECK(result_of(r, "impl/grad-causal").passed);
  // ...but it is not attention: the closed form disagrees, and forbidden keys get gradient
  // (their scores still enter the normaliser).
  CHECK_FALSE(result_of(r, "impl/reference-closed-form").passed);
  const CheckResult& f = result_of(r, "impl/invariant-forbidden-zero-grad");
  CHECK_FALSE(f.passed);
  CHECK_THAT(f.worst, Catch::Contains("K_bar["));
  CHECK_FALSE(result_of(r, "impl/invariant-one-visible-key").passed);  // weight < 1 on the only visible key
}

TEST_CASE("gradcheck suite: a gradient leaking into a forbidden position (-30 instead of -inf) is caught",
          "[gradcheck][suite][attention]") {
  const SuiteReport r = run_quiet(attention_suite(Bug::finite_mask), {});
  // exp(-30) ~ 1e-13: invisible to finite differences and even to the 1e-10 closed form...
  CHECK(result_of(r, "impl/grad-random-mask").passed);
  CHECK(result_of(r, "impl/grad-causal").passed);
  // ...but not to the exact-zero invariants.
  const CheckResult& f = result_of(r, "impl/invariant-forbidden-zero-grad");
  CHECK_FALSE(f.passed);
  CHECK(f.max_abs_error > 0);
  CHECK(f.max_abs_error < 1e-9);
  CHECK_FALSE(result_of(r, "impl/invariant-prefix-isolation").passed);  // the future leaks into the past
}

TEST_CASE("gradcheck suite: a wrong GQA mapping (h % H_kv) is caught", "[gradcheck][suite][attention][gqa]") {
  const SuiteReport r = run_quiet(attention_suite(Bug::gqa_modulo), {});
  const CheckResult& m = result_of(r, "impl/invariant-gqa-head-mapping");
  CHECK_FALSE(m.passed);
  CHECK(m.max_abs_error > 1.0);  // kv heads near +10 and -10 swap
  CHECK_FALSE(result_of(r, "impl/reference-closed-form").passed);
  CHECK(result_of(r, "impl/grad-gqa").passed);  // self-consistent tape
}

TEST_CASE("gradcheck suite: property results / combine / exceptions / duplicate names", "[gradcheck][suite]") {
  CHECK(CheckResult::property(0.0, 0.0, "", "exact").passed);
  CHECK_FALSE(CheckResult::property(1e-300, 0.0, "a[0]", "exact").passed);
  CHECK_FALSE(CheckResult::property(std::nan(""), 1.0, "", "nan").passed);
  const CheckResult c = CheckResult::combine(
      {CheckResult::property(1e-3, 1e-2, "a", "x"), CheckResult::property(5e-2, 1e-2, "b", "y"),
       CheckResult::property(1e-1, 1.0, "c", "z")});
  CHECK_FALSE(c.passed);
  CHECK(c.worst == "b");  // the first failing part, not the largest error
  CHECK(c.max_abs_error == 1e-1);

  GradcheckSuite s;
  s.add("x/throws", "property", "", [](CheckContext&) -> CheckResult { throw ValueError("[mine] broken"); });
  CHECK_THROWS_WITH(s.add("x/throws", "property", "", [](CheckContext&) { return CheckResult{}; }),
                    Catch::Contains("already registered"));
  std::string text;
  const SuiteReport r = run_quiet(s, {}, &text);
  CHECK(r.failed == 1);
  CHECK_THAT(result_of(r, "x/throws").message, Catch::Contains("threw") && Catch::Contains("[mine] broken"));
}

TEST_CASE("gradcheck suite: filter / list / seeds / exit status and the JSON report", "[gradcheck][suite]") {
  GradcheckSuite s;
  for (const char* name : {"ops/a", "ops/b", "layers/c"})
    s.add(name, "property", std::string("config of ") + name,
          [](CheckContext& ctx) { return CheckResult::property(ctx.uniform({1}).flat(0) * 0.0, 0.0, "", "zero"); });
  s.add("layers/bad", "property", "fails", [](CheckContext&) { return CheckResult::property(1.0, 0.5, "z[0]", "one"); });

  CHECK(s.select("").size() == 4);
  CHECK(s.select("ops/").size() == 2);
  CHECK(s.select("ops/*").size() == 2);
  CHECK(s.select("*/c").size() == 1);
  CHECK(s.select("ops/a, layers/c").size() == 2);
  CHECK(s.select("nothing").empty());

  std::ostringstream os;
  RunOptions o;
  o.filter = "ops";
  CHECK(run_gradcheck_command(s, o, os) == 0);
  CHECK(last_line(os.str()) == "2 passed, 0 failed");
  o.filter = "";
  std::ostringstream os2;
  CHECK(run_gradcheck_command(s, o, os2) == 1);
  CHECK(last_line(os2.str()) == "3 passed, 1 failed");
  o.filter = "nothing";
  std::ostringstream os3;
  // A filter that selects nothing is not a pass: a usage error naming the filter (exit 2).
  CHECK_THROWS_AS(run_gradcheck_command(s, o, os3), UsageError);
  CHECK_THROWS_WITH(run_gradcheck_command(s, o, os3), Catch::Contains("--filter 'nothing'"));
  o.filter = "";
  o.list = true;
  std::ostringstream os4;
  CHECK(run_gradcheck_command(s, o, os4) == 0);
  CHECK_THAT(os4.str(), Catch::Contains("layers/bad") && Catch::Contains("config of ops/b") && Catch::Contains("4 checks"));

  // The same seed gives the same inputs, whatever else runs; another seed, other inputs.
  auto draw = [](std::uint64_t seed, const std::string& name) { return CheckContext(DType::float64, seed, false, name).uniform({4}); };
  XGT_CHECK_SAME(draw(1, "a"), draw(1, "a"));
  CHECK(max_abs_diff(draw(1, "a"), draw(2, "a")) > 0.0);
  CHECK(max_abs_diff(draw(1, "a"), draw(1, "b")) > 0.0);

  const SuiteReport r = run_quiet(s, RunOptions{});
  const auto j = nlohmann::json::parse(report_json(r));
  CHECK(j["dtype"] == "float64");
  CHECK(j["checks"].size() == 4);
  CHECK(j["summary"]["passed"] == 3);
  CHECK(j["summary"]["failed"] == 1);
  const auto& bad = j["checks"][3];
  CHECK(bad["check"] == "layers/bad");
  CHECK(bad["status"] == "failed");
  CHECK(bad["passed"] == false);
  CHECK(bad["worst_element"] == "z[0]");
  CHECK(bad["max_abs_error"] == 1.0);
  CHECK(bad["max_rel_error"].is_null());
  CHECK(bad["configuration"] == "fails");
  for (const char* key : {"kind", "dtype", "time_s", "mode", "message"}) CHECK(bad.contains(key));
}

XG_GRADCHECK("macro/square", "x (3)") {
  return ctx.gradcheck([](const std::vector<Tensor>& in) { return in[0] * in[0]; }, {ctx.uniform({3})}, {"x"});
}

XG_GRADGRADCHECK("macro/second_order/cube", "x (3)") {
  return ctx.gradgradcheck([](const std::vector<Tensor>& in) { return in[0] * in[0] * in[0]; }, {ctx.uniform({3})},
                           {"x"});
}

TEST_CASE("gradcheck suite: XG_GRADGRADCHECK registers a second-order check into the default suite",
          "[gradcheck][suite][higher_order]") {
  const auto sel = default_gradcheck_suite().select("macro/second_order/cube");
  REQUIRE(sel.size() == 1);
  CHECK(sel[0]->kind == "second-order");
  CHECK(sel[0]->config == "x (3)");
  RunOptions o;
  o.filter = "macro/second_order/";
  const SuiteReport r = run_quiet(default_gradcheck_suite(), o);
  REQUIRE(r.records.size() == 1);
  CHECK(r.all_passed());
  CHECK(r.records[0].result.comparisons > 0);
}

TEST_CASE("gradcheck suite: XG_GRADCHECK registers into the default suite", "[gradcheck][suite]") {
  const auto sel = default_gradcheck_suite().select("macro/square");
  REQUIRE(sel.size() == 1);
  CHECK(sel[0]->kind == "custom");
  CHECK(sel[0]->config == "x (3)");
  RunOptions o;
  o.filter = "macro/";
  CHECK(run_quiet(default_gradcheck_suite(), o).all_passed());
}

namespace {

// x^3 with a correct first-order VJP 3 x^2 g; its second-order rule is right, or returns the
// right values with a factor 2 (a wrong differentiable VJP that first order cannot see).
Tensor cube_with_rule(const Tensor& x, bool wrong_rule) {
  return custom_op(
      wrong_rule ? "cube_wrong_rule" : "cube_right_rule", {x},
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
      [wrong_rule](const DiffVjpContext& c) {
        return DiffCotangents{c.grad_output * (c.inputs[0] * c.inputs[0] * (wrong_rule ? 6.0 : 3.0))};
      });
}

// A suite of one right and one wrong second-order rule, a property check, a module check and a
// module check through the wrong rule.
GradcheckSuite order_suite() {
  GradcheckSuite s;
  const auto inputs = [](CheckContext& ctx) { return std::vector<Array>{ctx.uniform({2, 3}, 0.5, 1.5)}; };
  s.add_gradient_check("mine/cube-right", "x (2, 3)", inputs,
                       [](const std::vector<Tensor>& in) { return cube_with_rule(in[0], false); }, {"x"});
  s.add_gradient_check("mine/cube-wrong-rule", "x (2, 3)", inputs,
                       [](const std::vector<Tensor>& in) { return cube_with_rule(in[0], true); }, {"x"});
  s.add("mine/property", "invariant", "an exact property",
        [](CheckContext&) { return CheckResult::property(0.0, 0.0, "", "zero"); });
  s.add("mine/module", "gradient", "Scale(3) parameters", [](CheckContext& ctx) {
    Scale m(3);
    const Tensor x(ctx.cast(Array::from_vector({3}, {0.5, 1.0, 2.0}, DType::float64)));
    return ctx.gradcheck_leaves([&] { return x * m.w; }, m.named_parameters());
  });
  s.add("mine/module-wrong-rule", "gradient", "cube(x * w), Scale(3) parameters", [](CheckContext& ctx) {
    Scale m(3);
    const Tensor x(ctx.cast(Array::from_vector({3}, {0.5, 1.0, 2.0}, DType::float64)));
    return ctx.gradcheck_leaves([&] { return cube_with_rule(x * m.w, true); }, m.named_parameters());
  });
  return s;
}

}  // namespace

TEST_CASE("gradcheck suite: order 2 fails a wrong second-order rule by name and skips checks without one",
          "[gradcheck][suite][higher_order]") {
  const GradcheckSuite s = order_suite();
  // Order 1 cannot see the wrong rule: everything passes, nothing is skipped.
  std::string text1;
  const SuiteReport r1 = run_quiet(s, RunOptions{}, &text1);
  CHECK(r1.passed == 5);
  CHECK(r1.skipped == 0);
  CHECK(last_line(text1) == "5 passed, 0 failed");

  RunOptions o2;
  o2.order = 2;
  std::string text;
  const SuiteReport r = run_quiet(s, o2, &text);
  INFO(text);
  CHECK(r.passed == 2);
  CHECK(r.failed == 2);
  CHECK(r.skipped == 1);
  CHECK_FALSE(r.all_passed());
  CHECK(last_line(text) == "2 passed, 2 failed, 1 skipped");
  const CheckResult& right = result_of(r, "mine/cube-right");
  CHECK(right.passed);
  CHECK(right.mode == "full+jvp");
  CHECK(right.comparisons > 0);
  const CheckResult& bad = result_of(r, "mine/cube-wrong-rule");
  CHECK_FALSE(bad.passed);
  CHECK_FALSE(bad.skipped);
  CHECK(bad.max_abs_error > 0.5);
  // The failure details name the check and which comparison caught it.
  CHECK_THAT(text, Catch::Contains("Failures:") && Catch::Contains("  mine/cube-wrong-rule (float64") &&
                       Catch::Contains("gradgradcheck: worst element"));
  CHECK_THAT(text, Catch::Contains("order 2"));
  const CheckResult& prop = result_of(r, "mine/property");
  CHECK(prop.skipped);
  CHECK_FALSE(prop.passed);
  CHECK_THAT(prop.message, Catch::Contains("no second-order form") && Catch::Contains("invariant"));
  // Module checks (leaves in place) run gradgradcheck_leaves and jvpcheck_leaves: the right
  // rule passes, the wrong one fails.
  const CheckResult& mod = result_of(r, "mine/module");
  CHECK(mod.passed);
  CHECK_FALSE(mod.skipped);
  CHECK(mod.mode == "full+jvp");
  CHECK(mod.comparisons > 0);
  const CheckResult& mod_bad = result_of(r, "mine/module-wrong-rule");
  CHECK_FALSE(mod_bad.passed);
  CHECK_FALSE(mod_bad.skipped);
  CHECK_THAT(text, Catch::Contains("  mine/module-wrong-rule (float64"));
  CHECK_THAT(mod_bad.message, Catch::Contains("gradgradcheck: worst element"));

  // The JSON report: order, skipped rows and counts.
  const auto j = nlohmann::json::parse(report_json(r));
  CHECK(j["order"] == 2);
  CHECK(j["summary"]["order"] == 2);
  CHECK(j["summary"]["passed"] == 2);
  CHECK(j["summary"]["failed"] == 2);
  CHECK(j["summary"]["skipped"] == 1);
  CHECK(j["checks"][1]["status"] == "failed");
  CHECK(j["checks"][2]["status"] == "skipped");
  CHECK(j["checks"][2]["passed"] == false);
  CHECK(j["checks"][2]["mode"] == "skipped");
  CHECK(nlohmann::json::parse(report_json(r1))["order"] == 1);

  // Exit status: the wrong rule fails the run; the right one alone passes; skipped alone is not a pass.
  std::ostringstream os;
  CHECK(run_gradcheck_command(s, o2, os) == 1);
  o2.filter = "mine/cube-right";
  std::ostringstream os2;
  CHECK(run_gradcheck_command(s, o2, os2) == 0);
  o2.filter = "mine/property";
  std::ostringstream os3;
  CHECK(run_gradcheck_command(s, o2, os3) == 1);
  CHECK(last_line(os3.str()) == "0 passed, 0 failed, 1 skipped");

  // float32 at order 2: the looser tolerances are stated and the right rule passes.
  RunOptions o32;
  o32.order = 2;
  o32.dtype = DType::float32;
  o32.filter = "mine/cube-right";
  std::string text32;
  const SuiteReport r32 = run_quiet(s, o32, &text32);
  INFO(text32);
  CHECK(r32.all_passed());
  CHECK_THAT(text32, Catch::Contains("float32 at order 2") && Catch::Contains("atol 0.05"));
}

TEST_CASE("gradcheck suite: an order other than 1 or 2 is a usage error and combine skips skipped parts",
          "[gradcheck][suite][higher_order][errors]") {
  const GradcheckSuite s = order_suite();
  for (int order : {0, 3, -1}) {
    RunOptions o;
    o.order = order;
    std::ostringstream os;
    CHECK_THROWS_AS(run_gradcheck_command(s, o, os), UsageError);
    CHECK_THROWS_WITH(run_gradcheck_command(s, o, os), Catch::Contains("--order must be 1 or 2"));
    CHECK(os.str().empty());
  }
  CHECK_THROWS_AS(CheckContext(DType::float64, 1, false, "x", 3), ValueError);
  const CheckResult ok = CheckResult::property(0.5, 1.0, "a", "half");
  const CheckResult sk = CheckResult::skip("no second-order form");
  const CheckResult both = CheckResult::combine({sk, ok});
  CHECK(both.passed);
  CHECK_FALSE(both.skipped);
  CHECK(both.max_abs_error == 0.5);
  const CheckResult none = CheckResult::combine({sk, sk});
  CHECK(none.skipped);
  CHECK(none.message == "no second-order form");
}
