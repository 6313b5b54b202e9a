// Checks of position-aware attention ("positions/..."): the RoPE op (ops/rope.hpp) in both
// layouts and with a partial rotation, self-attention with RoPE and with ALiBi
// (Visibility::alibi) on the fused and the composed path with respect to X and every
// parameter, and KV-cache decoding against the full causal pass with both.
#include <stdexcept>
#include <string>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/detail/common.hpp>
#include <xgrad/ops/join.hpp>
#include <xgrad/ops/shape_ops.hpp>

namespace xg::checks {

namespace {

ops::RopeConfig rope(ops::RopeLayout layout, double fraction, double base) {
  ops::RopeConfig c;
  c.layout = layout;
  c.fraction = fraction;
  c.base = base;
  return c;
}

nn::AttentionConfig layer(CheckContext& ctx, nn::SdpaImpl impl, bool with_rope, bool alibi) {
  nn::AttentionConfig c;
  c.d_model = 8;
  c.H_q = 4;
  c.H_kv = 2;
  c.dtype = ctx.dtype();
  c.impl = impl;
  if (with_rope) c.rope = rope(ops::RopeLayout::half_split, 1.0, 100.0);
  c.alibi = alibi;
  return c;
}

// Throws unless the layer ran the attention path its config names, so the "-composed" and
// "-fused" checks cannot both run one path (AttentionOutput::path).
void require_path(const nn::AttentionConfig& cfg, nn::SdpaImpl ran) {
  if (ran == cfg.impl) return;
  throw std::runtime_error(std::string("the layer ran the ") + (ran == nn::SdpaImpl::fused ? "fused" : "composed") +
                           " attention path, its config names the other one");
}

void randomise(nn::Module& m, CheckContext& ctx) {
  for (auto& np : m.named_parameters()) {
    Tensor t = np.second;
    t.set_value(ctx.uniform(t.shape(), -0.6, 0.6));
  }
}

CheckResult layer_gradcheck(CheckContext& ctx, const nn::AttentionConfig& cfg) {
  nn::MultiHeadAttention m(cfg, ctx.gen());
  randomise(m, ctx);
  const Tensor X(ctx.uniform({2, 4, cfg.d_model}), true);
  std::vector<std::pair<std::string, Tensor>> leaves{{"X", X}};
  for (auto& np : m.named_parameters()) leaves.push_back(np);
  nn::AttentionCall call;
  call.visibility = nn::Visibility::causal(4, 4);
  return ctx.gradcheck_leaves(
      [&] {
        const nn::AttentionOutput out = m.forward(X, call);
        require_path(cfg, out.path);
        return out.Y;
      },
      leaves);
}

// Cached decoding (prefill 3, then one token at a time) against the full causal pass.
CheckResult cache_check(CheckContext& ctx, const nn::AttentionConfig& cfg) {
  nn::MultiHeadAttention m(cfg, ctx.gen());
  randomise(m, ctx);
  const std::size_t T = 6;
  const Tensor X(ctx.uniform({2, T, cfg.d_model}));
  nn::AttentionCall call;
  call.visibility = nn::Visibility::causal(T, T);
  const nn::AttentionOutput whole = m.forward(X, call);
  require_path(cfg, whole.path);
  const Array full = whole.Y.value();
  nn::KVCache cache = m.make_cache(2, T);
  std::vector<Tensor> outs;
  for (long t = 0; t < long(T); t = t == 0 ? 3 : t + 1) {
    const nn::AttentionOutput step = m.forward_cached(ops::slice(X, 1, t, t == 0 ? 3 : t + 1), cache);
    require_path(cfg, step.path);
    outs.push_back(step.Y);
  }
  const double err = max_abs_diff(ops::concat(outs, 1).value(), full);
  return CheckResult::property(err, ctx.tol(1e-12, 1e-5), "Y", "max |cached - full| over every position");
}

}  // namespace

void register_position_checks(GradcheckSuite& s) {
  s.add_gradient_check(
      "positions/rope-interleaved", "RoPE x (2, 2, 3, 6), positions 0 3 7, base 100, interleaved pairs",
      [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 2, 3, 6})}; },
      [](const std::vector<Tensor>& in) {
        return ops::rope(in[0], {0, 3, 7}, rope(ops::RopeLayout::interleaved, 1.0, 100.0));
      },
      {"x"});
  s.add_gradient_check(
      "positions/rope-half-split-partial",
      "RoPE x (2, 3, 8), positions 5 1 2, base 10000, half-split pairs, fraction 0.75 (6 of 8 rotated)",
      [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 8})}; },
      [](const std::vector<Tensor>& in) {
        return ops::rope(in[0], {5, 1, 2}, rope(ops::RopeLayout::half_split, 0.75, 10000.0));
      },
      {"x"});
  for (const nn::SdpaImpl impl : {nn::SdpaImpl::fused, nn::SdpaImpl::composed}) {
    const std::string path = impl == nn::SdpaImpl::fused ? "fused" : "composed";
    s.add("positions/mha-rope-" + path, "gradient",
          "MHA d 8, H_q 4, H_kv 2, RoPE half-split base 100; causal; B 2, T 4; " + path + " path",
          [impl](CheckContext& ctx) { return layer_gradcheck(ctx, layer(ctx, impl, true, false)); });
    s.add("positions/mha-alibi-" + path, "gradient",
          "MHA d 8, H_q 4, H_kv 2, ALiBi slopes 1/4 .. 1/256; causal; B 2, T 4; " + path + " path",
          [impl](CheckContext& ctx) { return layer_gradcheck(ctx, layer(ctx, impl, false, true)); });
    s.add("positions/kv-cache-rope-alibi-" + path, "invariant",
          "MHA d 8, H_q 4, H_kv 2, RoPE and ALiBi; cached decoding (prefill 3, then 1 by 1) == full causal pass; " +
              path + " path",
          [impl](CheckContext& ctx) { return cache_check(ctx, layer(ctx, impl, true, true)); });
  }
}

}  // namespace xg::checks
