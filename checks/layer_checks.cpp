// Checks of the attention layers (nn/attention.hpp): MHA, GQA, MQA and cross attention with
// respect to their inputs and every parameter (gradcheck_leaves), the layers against the
// closed form (5.29)-(5.31), KV-cache decoding against the full pass (SPEC 11), and
// permutation equivariance of the whole layer ((5.41), derived in (5.37)-(5.40)).
#include <cmath>
#include <numeric>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/detail/common.hpp>
#include <xgrad/checks/kv_cache_check.hpp>

namespace xg::checks {

namespace {

// Every parameter replaced by uniform values in [-a, a] (biases included, so their
// gradients and broadcasting take part; the default zeros would hide a bias bug).
void randomise(nn::Module& m, CheckContext& ctx, double a = 0.6) {
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    t.set_value(ctx.uniform(t.shape(), -a, a));
  }
}

std::vector<std::pair<std::string, Tensor>> with_inputs(const nn::Module& m,
                                                        std::vector<std::pair<std::string, Tensor>> inputs) {
  for (auto& kv : m.named_parameters()) inputs.push_back(kv);
  return inputs;
}

nn::AttentionConfig mha_config(CheckContext& ctx, std::size_t d, std::size_t H_q, std::size_t H_kv, std::size_t d_head,
                               bool bias = true) {
  nn::AttentionConfig c;
  c.d_model = d;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.d_head = d_head;
  c.bias = bias;
  c.dtype = ctx.dtype();
  return c;
}

// A cross-attention layer's configuration in the check's dtype (d_out 0: the width d_q).
nn::CrossAttentionConfig cross_config(CheckContext& ctx, std::size_t d_q, std::size_t d_m, std::size_t H_q,
                                      std::size_t H_kv, std::size_t d_head, std::size_t d_out = 0) {
  nn::CrossAttentionConfig c;
  c.d_q = d_q;
  c.d_m = d_m;
  c.d_out = d_out;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.d_head = d_head;
  c.dtype = ctx.dtype();
  return c;
}

// The self-attention layer's gradient with respect to X and every parameter.
CheckResult mha_gradcheck(CheckContext& ctx, const nn::AttentionConfig& cfg, std::size_t B, std::size_t T,
                          const std::function<nn::AttentionCall(CheckContext&)>& call_for) {
  nn::MultiHeadAttention m(cfg, ctx.gen());
  randomise(m, ctx);
  const Tensor X(ctx.uniform({B, T, cfg.d_model}), true);
  const nn::AttentionCall call = call_for(ctx);
  return ctx.gradcheck_leaves([&] { return m.forward(X, call).Y; }, with_inputs(m, {{"X", X}}));
}

Array f64(const Array& a) { return a.astype(DType::float64); }

// float64: 1e-10, xgrad's own choice (the chapter gives no number): the closed form and the tape
// differ only by rounding, a few dozen operations at u = 1.1e-16 on O(1) values (~1e-14), so
// 1e-10 leaves four orders of margin and is still far below any real gradient error.
// float32: a layer is a few dozen roundings at u = 2^-24 on O(1) values (~1e-6 expected), so 1e-5.
double reference_tol(const CheckContext& ctx) { return ctx.tol(1e-10, 1e-5); }

// The float64 closed form of layer `m` on queries X_q and memory X_m under case `c`, scale
// 1/sqrt(d_h), with Y_bar as the output cotangent.
template <class Attention>
reference::LayerGrads reference_of(const Attention& m, const Tensor& X_q, const Tensor& X_m, const RefConfig& c,
                                   std::size_t d_h, const Array& Y_bar) {
  return reference::layer(reference_layer(m), f64(X_q.value()), f64(X_m.value()),
                          reference::allowed_sets(c.allowed, c.d.B, c.d.H_q, c.d.T, c.d.S), c.valid, c.soft,
                          1.0 / std::sqrt(double(d_h)), Array(), f64(Y_bar));
}

CheckResult mha_reference(CheckContext& ctx) {
  std::vector<CheckResult> parts;
  for (std::size_t n = 0; n < ctx.pick(6, 40); ++n) {
    const RefConfig c = random_ref_config(ctx.gen(), /*self_attention=*/true);
    const std::size_t d_h = c.d.d_k, d_model = 2 + ctx.gen().below(4);
    nn::MultiHeadAttention m(mha_config(ctx, d_model, c.d.H_q, c.d.H_kv, d_h), ctx.gen());
    randomise(m, ctx);
    const Tensor X(ctx.uniform({c.d.B, c.d.T, d_model}), true);
    const nn::AttentionCall call = make_call(c.vis, c.valid);
    const Tensor Y = m.forward(X, call).Y;
    const Array Y_bar = ctx.uniform(Y.shape());
    const auto tape = grad(Y, {X, m.W_QKV, m.W_O, m.b_QKV, m.b_O}, Y_bar);
    const auto ref = reference_of(m, X, X, c, d_h, Y_bar);
    Diff d = max_diff(f64(Y.value()), ref.Y, "Y");
    d.merge(max_diff(f64(tape[0]), (Tensor(ref.X_q_bar) + Tensor(ref.X_m_bar)).value(), "X_bar"));  // (5.31)
    d.merge(max_diff(f64(tape[1]),
                     ops::concat({Tensor(ref.W_Q_bar), Tensor(ref.W_K_bar), Tensor(ref.W_V_bar)}, 1).value(),
                     "W_QKV_bar"));
    d.merge(max_diff(f64(tape[2]), ref.W_O_bar, "W_O_bar"));
    d.merge(max_diff(f64(tape[3]),
                     ops::concat({Tensor(ref.b_Q_bar), Tensor(ref.b_K_bar), Tensor(ref.b_V_bar)}, 0).value(),
                     "b_QKV_bar"));
    d.merge(max_diff(f64(tape[4]), ref.b_O_bar, "b_O_bar"));
    parts.push_back(CheckResult::property(d.max, reference_tol(ctx), d.where,
                                          "closed form (5.29)-(5.31) vs tape, case " + std::to_string(n) + ": " +
                                              c.text + ", d_model " + std::to_string(d_model)));
  }
  return CheckResult::combine(parts);
}

CheckResult cross_reference(CheckContext& ctx) {
  std::vector<CheckResult> parts;
  for (std::size_t n = 0; n < ctx.pick(6, 40); ++n) {
    const RefConfig c = random_ref_config(ctx.gen());
    const std::size_t d_h = c.d.d_k, d_q = 2 + ctx.gen().below(4), d_m = 1 + ctx.gen().below(5),
                      d_out = 1 + ctx.gen().below(4);
    nn::CrossAttention m(cross_config(ctx, d_q, d_m, c.d.H_q, c.d.H_kv, d_h, d_out), ctx.gen());
    randomise(m, ctx);
    const Tensor Xq(ctx.uniform({c.d.B, c.d.T, d_q}), true), Xm(ctx.uniform({c.d.B, c.d.S, d_m}), true);
    const Tensor Y = m.forward(Xq, Xm, make_call(c.vis, c.valid)).Y;
    const Array Y_bar = ctx.uniform(Y.shape());
    const auto tape = grad(Y, {Xq, Xm, m.W_Q, m.W_KV, m.W_O, m.b_Q, m.b_KV, m.b_O}, Y_bar);
    const auto ref = reference_of(m, Xq, Xm, c, d_h, Y_bar);
    Diff d = max_diff(f64(Y.value()), ref.Y, "Y");
    d.merge(max_diff(f64(tape[0]), ref.X_q_bar, "X_q_bar"));
    d.merge(max_diff(f64(tape[1]), ref.X_m_bar, "X_m_bar"));  // K and V paths add (5.30)
    d.merge(max_diff(f64(tape[2]), ref.W_Q_bar, "W_Q_bar"));
    d.merge(max_diff(f64(tape[3]), ops::concat({Tensor(ref.W_K_bar), Tensor(ref.W_V_bar)}, 1).value(), "W_KV_bar"));
    d.merge(max_diff(f64(tape[4]), ref.W_O_bar, "W_O_bar"));
    d.merge(max_diff(f64(tape[5]), ref.b_Q_bar, "b_Q_bar"));
    d.merge(max_diff(f64(tape[6]), ops::concat({Tensor(ref.b_K_bar), Tensor(ref.b_V_bar)}, 0).value(), "b_KV_bar"));
    d.merge(max_diff(f64(tape[7]), ref.b_O_bar, "b_O_bar"));
    parts.push_back(CheckResult::property(d.max, reference_tol(ctx), d.where,
                                          "closed form (5.29)-(5.30) vs tape, case " + std::to_string(n) + ": " +
                                              c.text));
  }
  return CheckResult::combine(parts);
}

// SPEC 11: prefill, chunked prefill and one-token decoding through the KV cache equal the
// full causal pass, through the KV-cache checker (checks/kv_cache_check.hpp) with its default
// schedules and prefix isolation. The cached path runs the same math on other matrix shapes:
// relative bound 64 (T + d) u against the output's size.
CheckResult kv_cache(CheckContext& ctx) {
  const std::size_t B = 2, T = ctx.pick(7, 16), d = 16;
  nn::MultiHeadAttention m(mha_config(ctx, d, 4, 2, 0), ctx.gen());  // GQA
  randomise(m, ctx);
  KVCacheCheckOptions opts;
  opts.rtol = 64.0 * double(T + d) * unit_roundoff(ctx.dtype());
  opts.atol = 0;
  const KVCacheDecoder decoder = kv_cache_decoder(
      [&](const Array& X) { return m(Tensor(X), nn::Visibility::causal(pos(X.shape()[1]), pos(X.shape()[1]))); },
      [&] { return m.make_cache(B, T); },
      [&](nn::KVCache& cache, const Array& X_new) { return m.forward_cached(Tensor(X_new), cache).Y; });
  return to_check_result(check_kv_cache(decoder, ctx.uniform({B, T, d}), opts));
}

// (5.41), derived in (5.37)-(5.40): the whole layer (projections, heads, output projection)
// is permutation equivariant: Y(P X; P M P^T) = P Y(X; M). Relative bound 64 (T + d) u.
CheckResult layer_permutation(CheckContext& ctx) {
  const std::size_t T = 5, d = 8;
  nn::MultiHeadAttention m(mha_config(ctx, d, 4, 2, 0), ctx.gen());
  randomise(m, ctx);
  const Array X = ctx.uniform({1, T, d});
  const BoolArray M = random_allowed({T, T}, ctx.gen(), 0.5);
  const IndexArray P(Shape{T}, {3, 0, 4, 1, 2});
  BoolArray M_perm = BoolArray::filled({T, T}, false);
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j < T; ++j) M_perm.data[i * T + j] = M.data[P.data[i] * T + P.data[j]];
  NoGradGuard ng;
  const Array Y = m(Tensor(X), nn::Visibility::allowed(M)).value();
  const Array Yp = m(ops::index_select(Tensor(X), 1, P), nn::Visibility::allowed(M_perm)).value();
  const Diff dd = max_diff(Yp, ops::index_select(Tensor(Y), 1, P).value(), "Y");
  const double scale = max_abs_value(Y), rel = scale > 0 ? dd.max / scale : dd.max;
  CheckResult r = CheckResult::property(rel, 64.0 * double(T + d) * unit_roundoff(ctx.dtype()), dd.where,
                                        "Y(PX; P M P^T) - P Y(X; M), relative", rel);
  r.max_abs_error = dd.max;
  return r;
}

}  // namespace

void register_attention_layer_checks(GradcheckSuite& s) {
  s.add("layers/mha", "gradient", "MultiHeadAttention d 8, H 2, bias; causal; B 2, T 4; X and all parameters",
        [](CheckContext& ctx) {
          return mha_gradcheck(ctx, mha_config(ctx, 8, 2, 0, 0), 2, 4,
                               [](CheckContext&) { return make_call(nn::Visibility::causal(4, 4)); });
        });
  s.add("layers/gqa", "gradient", "GQA d 12, H_q 4, H_kv 2, d_head 3, no bias; random per-head mask; B 2, T 4",
        [](CheckContext& ctx) {
          return mha_gradcheck(ctx, mha_config(ctx, 12, 4, 2, 3, false), 2, 4, [](CheckContext& c) {
            return make_call(nn::Visibility::allowed(random_allowed({2, 4, 4, 4}, c.gen(), 0.6)));
          });
        });
  s.add("layers/mqa", "gradient", "MQA d 8, H_q 4, H_kv 1; key padding and invalid queries; B 2, T 4",
        [](CheckContext& ctx) {
          return mha_gradcheck(ctx, mha_config(ctx, 8, 4, 1, 0), 2, 4, [](CheckContext&) {
            return make_call(nn::Visibility::key_lengths({4, 2}, 4), nn::valid_queries_from_lengths({4, 2}, 4));
          });
        });
  s.add("layers/mha-dropout", "gradient",
        "MHA d 8, H 2, dropout 0.2 in training (mask fixed by re-seeding); causal; B 1, T 4", [](CheckContext& ctx) {
          nn::AttentionConfig cfg = mha_config(ctx, 8, 2, 0, 0);
          cfg.dropout = 0.2;
          nn::MultiHeadAttention m(cfg, ctx.gen());
          randomise(m, ctx);
          m.train();
          const Tensor X(ctx.uniform({1, 4, 8}), true);
          const std::uint64_t seed = ctx.gen().next_u64();
          return ctx.gradcheck_leaves(
              [&] {
                Generator g(seed);
                return m.forward(X, make_call(nn::Visibility::causal(4, 4), {}, &g)).Y;
              },
              with_inputs(m, {{"X", X}}));
        });
  s.add("layers/cross-attention", "gradient",
        "CrossAttention d_q 6, d_m 4, H_q 2, H_kv 1, d_head 3; T 3, S 5, source padding; X_q, X_m, all parameters",
        [](CheckContext& ctx) {
          nn::CrossAttention m(cross_config(ctx, 6, 4, 2, 1, 3), ctx.gen());
          randomise(m, ctx);
          const Tensor Xq(ctx.uniform({2, 3, 6}), true), Xm(ctx.uniform({2, 5, 4}), true);
          const nn::AttentionCall call = make_call(nn::Visibility::key_lengths({5, 3}, 5));
          return ctx.gradcheck_leaves([&] { return m.forward(Xq, Xm, call).Y; },
                                      with_inputs(m, {{"X_q", Xq}, {"X_m", Xm}}));
        });
  s.add("reference/mha-layer", "reference",
        "self-attention layer vs closed form (5.29)-(5.31): 6 random configurations (--full: 40)", mha_reference);
  s.add("reference/cross-attention-layer", "reference",
        "cross-attention layer vs closed form (5.29)-(5.30), d_q != d_m: 6 random configurations (--full: 40)",
        cross_reference);
  s.add("attention/invariant-kv-cache", "invariant",
        "KV cache (GQA H_q 4, H_kv 2, d 16, T 7): prefill, chunks, one token at a time = full causal pass",
        kv_cache);
  s.add("layers/mha-permutation", "invariant", "MHA layer Y(PX; P M P^T) = P Y(X; M) (5.41), GQA, random mask",
        layer_permutation);
}

}  // namespace xg::checks
