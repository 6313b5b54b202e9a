// The fused attention's second-order rule (nn/detail/flash_double_backward.inc): under
// create_graph the fused ops record their backward pass as one op whose VJP is the fused
// double-backward kernel. Checked against the composed fallback (AttentionSecondOrder::composed,
// which differentiates the composed path) on every visibility feature the fused op takes, each
// path shown to have run; gradgradcheck of both ops; third derivatives through the backward op's
// own rule; and the memory property: the fused rule forms no [T, S] weights (no softmax op).
#include <cmath>
#include <cstdio>

#include "tests/support/helpers.hpp"

#include <xgrad/core/detail/profile.hpp>
#include <xgrad/core/higher_order.hpp>
#include <xgrad/nn/detail/flash_attention.hpp>

using namespace xg;
using namespace xgt;

namespace {

std::uint64_t forward_calls(const std::string& name) {
  for (const auto& t : detail::op_profile())
    if (t.op == name) return t.forward_calls;
  return 0;
}

// Sets the second-order path for a scope, with the op counters on; restores the default.
struct SecondOrderPath {
  explicit SecondOrderPath(nn::AttentionSecondOrder p) {
    nn::set_attention_second_order(p);
    detail::set_profiling(true);
    detail::reset_profile();
  }
  ~SecondOrderPath() {
    detail::set_profiling(false);
    nn::set_attention_second_order(nn::AttentionSecondOrder::fused);
  }
};

Array random_array(const Shape& s, Generator& gen) { return random_normal(s, gen, DType::float64); }

double max_rel_diff(const Array& a, const Array& b, std::size_t& at) {
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) scale = std::max(scale, std::fabs(b.flat(i)));
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a.flat(i) - b.flat(i)) / std::max(scale, 1e-300);
    if (d > worst || i == 0) {
      worst = std::max(worst, d);
      at = i;
    }
  }
  return worst;
}

struct Case {
  std::string name;
  std::size_t B = 1, Hq = 2, Hkv = 1, T = 6, d = 3;
  nn::Visibility vis = nn::Visibility::causal(6, 6);
  double dropout = 0;
  bool some_invalid = false;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  Case c;
  c.name = "causal GQA";
  out.push_back(c);
  c.name = "causal MHA two blocks";  // T > kBlock (128): block boundaries and a second block
  c.Hq = c.Hkv = 2;
  c.T = 130;
  c.d = 2;
  c.vis = nn::Visibility::causal(130, 130);
  out.push_back(c);
  c = Case{};
  c.name = "sliding window";
  c.vis = nn::Visibility::sliding_window(6, 6, 3);
  out.push_back(c);
  c = Case{};
  c.name = "ALiBi and causal";
  c.Hq = 4;
  c.Hkv = 2;
  c.vis = nn::Visibility::alibi({0.5, 0.25, 0.125, 0.0625}, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}) &
          nn::Visibility::causal(6, 6);
  out.push_back(c);
  c = Case{};
  c.name = "dropout";
  c.B = 2;
  c.dropout = 0.3;
  out.push_back(c);
  c = Case{};
  c.name = "invalid queries";
  c.B = 2;
  c.some_invalid = true;
  out.push_back(c);
  c = Case{};
  c.name = "bidirectional MQA";
  c.Hq = 3;
  c.vis = nn::Visibility::all();
  out.push_back(c);
  return out;
}

nn::FlashOptions options(const Case& c) {
  nn::FlashOptions o;
  o.scale = 0.6;
  o.dropout_p = c.dropout;
  o.dropout_seed = 77;
  if (c.some_invalid) {
    o.query_valid = BoolArray({c.B, c.T}, std::vector<unsigned char>(c.B * c.T, 1));
    o.query_valid.data[1] = 0;          // batch 0, query 1
    o.query_valid.data[c.T + 4] = 0;    // batch 1, query 4
  }
  return o;
}

// The hvp of L = sum(tanh(O) W) in the op's inputs, along v, on the given second-order path;
// counts the backward op, the softmax and the rule's input stand-ins (composed_input) it recorded.
struct HvpRun {
  std::vector<Array> hv;
  std::uint64_t backward_op = 0, softmax = 0;
};
HvpRun run_hvp(nn::AttentionSecondOrder path, bool packed, const Case& c, const std::vector<Array>& x,
               const std::vector<Array>& v, const Array& W) {
  SecondOrderPath scope(path);
  const nn::VisibilityPlan plan = c.vis.plan("test", {c.B, c.Hq, c.T, c.T});
  const nn::FlashOptions o = options(c);
  std::vector<Tensor> leaves;
  for (const Array& a : x) leaves.emplace_back(a.clone(), true);
  const auto loss = [&] {
    const Tensor O = packed ? nn::flash_attention_packed(leaves[0], c.Hq, c.Hkv, plan, o)
                            : nn::flash_attention(leaves[0], leaves[1], leaves[2], plan, o);
    return ops::sum(ops::tanh(O) * Tensor(W));
  };
  HvpRun r;
  r.hv = hvp(loss, leaves, v);
  r.backward_op = forward_calls(packed ? "attention_packed_backward" : "attention_backward");
  r.softmax = forward_calls("softmax");
  return r;
}

}  // namespace

TEST_CASE("fused attention second order: the fused rule equals the composed fallback on every visibility",
          "[nn][attention][higher_order]") {
  for (const Case& c : cases())
    for (const bool packed : {false, true}) {
      INFO(c.name << (packed ? " (packed)" : " (Q, K, V)"));
      Generator gen(5);
      std::vector<Array> x;
      Shape out_shape;
      if (packed) {
        x.push_back(random_array({c.B, c.T, (c.Hq + 2 * c.Hkv) * c.d}, gen));
        out_shape = {c.B, c.T, c.Hq * c.d};
      } else {
        x.push_back(random_array({c.B, c.Hq, c.T, c.d}, gen));
        x.push_back(random_array({c.B, c.Hkv, c.T, c.d}, gen));
        x.push_back(random_array({c.B, c.Hkv, c.T, c.d}, gen));
        out_shape = {c.B, c.Hq, c.T, c.d};
      }
      std::vector<Array> v;
      for (const Array& a : x) v.push_back(random_array(a.shape(), gen));
      const Array W = random_array(out_shape, gen);
      const HvpRun fused = run_hvp(nn::AttentionSecondOrder::fused, packed, c, x, v, W);
      const HvpRun composed = run_hvp(nn::AttentionSecondOrder::composed, packed, c, x, v, W);
      // Each path ran: the fused rule records its backward op and never the weights' softmax;
      // the fallback records the composed path, softmax included, and no backward op.
      CHECK(fused.backward_op == 1);
      CHECK(fused.softmax == 0);
      CHECK(composed.backward_op == 0);
      CHECK(composed.softmax >= 1);
      REQUIRE(fused.hv.size() == composed.hv.size());
      for (std::size_t k = 0; k < fused.hv.size(); ++k) {
        std::size_t at = 0;
        const double rel = max_rel_diff(fused.hv[k], composed.hv[k], at);
        char msg[200];
        std::snprintf(msg, sizeof msg, "input %zu: worst at %zu, fused %.17g composed %.17g, rel %.3e", k, at,
                      fused.hv[k].flat(at), composed.hv[k].flat(at), rel);
        INFO(msg);
        CHECK(rel <= 1e-12);
      }
    }
}

TEST_CASE("fused attention second order: gradgradcheck of both fused ops on the fused rule",
          "[nn][attention][higher_order]") {
  Generator gen(41);
  const std::size_t B = 2, T = 4, Hq = 2, Hkv = 1, d = 2;
  const nn::VisibilityPlan plan = nn::Visibility::causal(4, 4).plan("test", {B, Hq, T, T});
  for (const double p : {0.0, 0.25}) {
    nn::FlashOptions o;
    o.scale = 0.8;
    o.dropout_p = p;
    o.dropout_seed = 3;
    SecondOrderPath scope(nn::AttentionSecondOrder::fused);
    const GradcheckReport packed = gradgradcheck(
        [&](const std::vector<Tensor>& in) { return nn::flash_attention_packed(in[0], Hq, Hkv, plan, o); },
        {random_array({B, T, (Hq + 2 * Hkv) * d}, gen)}, {}, {"P"});
    INFO("packed, dropout " << p << ": " << packed.summary());
    CHECK(packed.passed);
    CHECK(packed.comparisons > 0);
    const GradcheckReport split = gradgradcheck(
        [&](const std::vector<Tensor>& in) { return nn::flash_attention(in[0], in[1], in[2], plan, o); },
        {random_array({B, Hq, T, d}, gen), random_array({B, Hkv, T, d}, gen), random_array({B, Hkv, T, d}, gen)}, {},
        {"Q", "K", "V"});
    INFO("Q, K, V, dropout " << p << ": " << split.summary());
    CHECK(split.passed);
    CHECK(forward_calls("attention_backward") > 0);
    CHECK(forward_calls("attention_packed_backward") > 0);
  }
}

TEST_CASE("fused attention second order: third derivatives through the backward op's own rule",
          "[nn][attention][higher_order]") {
  // gradgradcheck of x -> d/dx sum(tanh(attention(x)) W) (recorded with create_graph): its
  // second derivatives are the attention's third, which go through the recorded backward op's
  // second-order rule (the composed backward, differentiated).
  Generator gen(43);
  const std::size_t B = 1, T = 3, Hq = 2, Hkv = 1, d = 2;
  const nn::VisibilityPlan plan = nn::Visibility::causal(3, 3).plan("test", {B, Hq, T, T});
  nn::FlashOptions o;
  o.scale = 0.7;
  const Array W = random_array({B, T, Hq * d}, gen);
  SecondOrderPath scope(nn::AttentionSecondOrder::fused);
  BackwardOptions graph;
  graph.create_graph = true;
  const GradcheckReport r = gradgradcheck(
      [&](const std::vector<Tensor>& in) {
        const auto g = [&](const Tensor& x) {
          const Tensor y = ops::sum(ops::tanh(nn::flash_attention_packed(x, Hq, Hkv, plan, o)) * Tensor(W));
          return grad(y, {x}, Tensor(), graph)[0];
        };
        if (in[0].requires_grad()) return g(in[0]);
        // A value-only evaluation (finite differences): the same map on a leaf of its own.
        EnableGradGuard on;
        Tape tape;
        return Tensor(g(Tensor(in[0].value(), true)).value(), false);
      },
      {random_array({B, T, (Hq + 2 * Hkv) * d}, gen)}, {}, {"P"});
  INFO(r.summary());
  CHECK(r.passed);
  CHECK(r.comparisons > 0);
  CHECK(forward_calls("attention_packed_backward") > 0);
}
