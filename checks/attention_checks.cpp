// Gradient and closed-form checks of an attention core (SPEC 1-4, 9, (5.36)). The core is an
// argument (AttentionFn), so the same checks judge nn::attention and any other
// implementation; the dropout checks use nn::scaled_dot_product_attention, whose saved mask
// the closed form needs.
#include <cmath>
#include <limits>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/detail/common.hpp>
#include <xgrad/nn/detail/flash_attention.hpp>

namespace xg::checks {

namespace {

using Inputs = std::vector<Tensor>;

struct Case {
  nn::Visibility vis = nn::Visibility::all();
  BoolArray valid;  // [B, T] or empty
  std::optional<double> scale;
};

using CaseFn = std::function<Case(CheckContext&, const Dims&)>;

// Left-padded causal batch: the last sample starts with T/2 pad tokens. Those queries are
// invalid and, under causal & key padding, see no key at all (SPEC 3.8).
BoolArray left_padded(const Dims& d) {
  std::vector<unsigned char> real(d.B * d.T, 1);
  for (std::size_t i = 0; i < d.T / 2; ++i) real[(d.B - 1) * d.T + i] = 0;
  return BoolArray({d.B, d.T}, real);
}

void attention_case(GradcheckSuite& s, const std::string& prefix, const AttentionFn& attn, const std::string& name,
                    const std::string& what, const Dims& small, const Dims& large, CaseFn make) {
  s.add(prefix + "/grad-" + name, "gradient", what + "; " + small.text(), [=](CheckContext& ctx) {
    const Dims d = ctx.full() ? large : small;
    const Case c = make(ctx, d);
    const Array Q = ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -1.5, 1.5);
    const Array K = ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -1.5, 1.5);
    const Array V = ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -1.5, 1.5);
    const nn::SdpaOptions o{c.scale, c.valid};  // (initialised, not assigned: GCC 12 -Wnonnull false positive)
    CheckResult r = ctx.gradcheck(
        [attn, c, o](const Inputs& in) { return attn(in[0], in[1], in[2], c.vis, o); }, {Q, K, V}, {"Q", "K", "V"});
    if (ctx.full()) r.config = what + "; " + d.text();
    return r;
  });
}

// Output and Q, K, V gradients of `attn` against the closed form, for one configuration.
CheckResult compare_with_reference(CheckContext& ctx, const Tensor& O, const std::vector<Array>& grads,
                                   const Tensor& Q, const Tensor& K, const Tensor& V, const RefConfig& c,
                                   const Array& G, const Array& drop, const std::string& what) {
  const auto f64 = [](const Array& a) { return a.astype(DType::float64); };
  // The reference's allowed sets come from the definitions (c.allowed), not from c.vis.
  const auto allowed = reference::allowed_sets(c.allowed, c.d.B, c.d.H_q, c.d.T, c.d.S);
  const auto ref = reference::sdpa(f64(Q.value()), f64(K.value()), f64(V.value()), allowed,
                                       c.valid, c.soft, 1.0 / std::sqrt(double(Q.shape()[3])),
                                       drop.defined() ? f64(drop) : drop, f64(G));
  Diff d = max_diff(f64(O.value()), ref.O, "O");
  d.merge(max_diff(f64(grads[0]), ref.Q_bar, "Q_bar"));
  d.merge(max_diff(f64(grads[1]), ref.K_bar, "K_bar"));
  d.merge(max_diff(f64(grads[2]), ref.V_bar, "V_bar"));
  // float64: 1e-10, xgrad's own choice (the chapter gives no number): both sides differ only by
  // rounding, ~1e-14 on O(1) values, so 1e-10 has margin and still catches any wrong term.
  // float32: the tape rounds at u = 2^-24 = 6e-8 through a few dozen operations on O(1)
  // values, so agreement to ~1e-6 is expected; 1e-5 leaves a margin.
  CheckResult r = CheckResult::property(d.max, ctx.tol(1e-10, 1e-5), d.where,
                                        "closed form (5.24)-(5.28) vs tape, " + what);
  return r;
}

void register_attention_sweep_check(GradcheckSuite& s, const std::string& prefix, const AttentionFn& attn) {
  s.add(prefix + "/grad-random-configs", "gradient",
        "sweep: 6 random configurations (--full: 60) of masks, GQA/MQA, T != S, invalid rows",
        [attn](CheckContext& ctx) {
          std::vector<CheckResult> parts;
          for (std::size_t k = 0; k < ctx.pick(6, 60); ++k) {
            const RefConfig c = random_ref_config(ctx.gen());
            const Dims& d = c.d;
            const Array Q = ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -1.5, 1.5);
            const Array K = ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -1.5, 1.5);
            const Array V = ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -1.5, 1.5);
            const nn::SdpaOptions o{std::nullopt, c.valid};
            CheckResult r = ctx.gradcheck(
                [attn, c, o](const Inputs& in) { return attn(in[0], in[1], in[2], c.vis, o); }, {Q, K, V},
                {"Q", "K", "V"});
            r.message = "case " + std::to_string(k) + " (" + c.text + "): " + r.message;
            r.worst += " (case " + std::to_string(k) + ")";
            parts.push_back(r);
          }
          return CheckResult::combine(parts);
        });
}

}  // namespace

AttentionFn library_attention() {
  return [](const Tensor& Q, const Tensor& K, const Tensor& V, const nn::Visibility& vis, const nn::SdpaOptions& o) {
    return nn::attention(Q, K, V, vis, o);
  };
}

AttentionFn attention_with(nn::SdpaImpl impl) {
  return [impl](const Tensor& Q, const Tensor& K, const Tensor& V, const nn::Visibility& vis, const nn::SdpaOptions& o) {
    nn::SdpaOptions forced = o;
    forced.impl = impl;
    return nn::attention(Q, K, V, vis, forced);
  };
}

void register_attention_implementation_checks(GradcheckSuite& s) {
  s.add("attention/fused-vs-composed", "reference",
        "fused path vs composed path, O and Q/K/V gradients: 16 random configurations (--full: 150) of masks, "
        "GQA/MQA, T != S, invalid rows, half with dropout 0.2; plus causal, documents and key padding at T 150",
        [](CheckContext& ctx) {
          std::vector<CheckResult> parts;
          auto compare = [&](const nn::Visibility& vis, const BoolArray& valid, const Dims& d, double p,
                             const std::string& what) {
            const Array q = ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -2, 2);
            const Array k = ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -2, 2);
            const Array v = ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -2, 2);
            const Array G = ctx.uniform({d.B, d.H_q, d.T, d.d_v});
            const std::uint64_t seed = ctx.gen().next_u64();
            std::vector<Array> out[2];
            const nn::SdpaImpl impls[2] = {nn::SdpaImpl::fused, nn::SdpaImpl::composed};
            for (int i = 0; i < 2; ++i) {
              const Tensor Q(q, true), K(k, true), V(v, true);
              Generator g(seed);  // the same dropout mask on both paths
              nn::SdpaOptions o;
              o.query_valid = valid;
              o.impl = impls[i];
              o.dropout_p = p;
              o.training = p > 0;
              o.generator = &g;
              const Tensor O = nn::attention(Q, K, V, vis, o);
              out[i] = grad(O, {Q, K, V}, G);
              out[i].insert(out[i].begin(), O.value());
            }
            Diff diff = max_diff(out[0][0].astype(DType::float64), out[1][0].astype(DType::float64), "O");
            const char* names[4] = {"O", "Q_bar", "K_bar", "V_bar"};
            for (int j = 1; j < 4; ++j)
              diff.merge(max_diff(out[0][j].astype(DType::float64), out[1][j].astype(DType::float64), names[j]));
            // float64: both paths compute the same sums in different orders (1e-12); float32 rounds at 6e-8.
            parts.push_back(CheckResult::property(diff.max, ctx.tol(1e-12, 1e-5), diff.where, "fused vs composed, " + what));
          };
          for (std::size_t n = 0; n < ctx.pick(16, 150); ++n) {
            const RefConfig c = random_ref_config(ctx.gen());
            compare(c.vis, c.valid, c.d, n % 2 ? 0.2 : 0.0, "case " + std::to_string(n) + ": " + c.text);
          }
          const Dims big{2, 4, 2, 150, 150, 8, 8};  // two 128-row query blocks
          std::vector<std::int64_t> ids(big.T);
          for (std::size_t i = 0; i < big.T; ++i) ids[i] = static_cast<std::int64_t>(i < 30 ? 0 : (i < 140 ? 1 : 2));
          compare(nn::Visibility::causal(big.T, big.S), {}, big, 0.0, "causal, T 150");
          compare(nn::Visibility::documents(IndexArray(Shape{big.T}, ids)), {}, big, 0.0, "documents, T 150");
          compare(nn::Visibility::key_lengths({150, 76}, big.S) & nn::Visibility::causal(big.T, big.S), left_padded(big),
                  big, 0.1, "key padding & causal, left-padded queries, dropout 0.1, T 150");
          return CheckResult::combine(parts);
        });
}

void register_attention_gradient_checks(GradcheckSuite& s, const std::string& prefix, AttentionFn attn) {
  using V = nn::Visibility;
  attention_case(s, prefix, attn, "no-mask", "no mask, scale 0.7", {1, 2, 2, 3, 4, 3, 2}, {2, 2, 2, 6, 8, 4, 3},
                 [](CheckContext&, const Dims&) {
                   Case c;
                   c.scale = 0.7;
                   return c;
                 });
  attention_case(s, prefix, attn, "causal", "causal, T == S", {2, 2, 2, 4, 4, 3, 2}, {2, 3, 3, 8, 8, 4, 4},
                 [](CheckContext&, const Dims& d) { return Case{V::causal(d.T, d.S), {}, {}}; });
  attention_case(s, prefix, attn, "causal-suffix", "causal suffix, bottom-right (T < S)", {1, 2, 2, 2, 5, 3, 2},
                 {2, 2, 2, 3, 9, 4, 3}, [](CheckContext&, const Dims& d) { return Case{V::causal(d.T, d.S), {}, {}}; });
  attention_case(s, prefix, attn, "random-mask", "random allowed mask per query head", {2, 2, 2, 3, 5, 3, 2},
                 {2, 4, 4, 6, 9, 4, 3}, [](CheckContext& ctx, const Dims& d) {
                   return Case{V::allowed(random_allowed({d.B, d.H_q, d.T, d.S}, ctx.gen(), 0.5)), {}, {}};
                 });
  attention_case(s, prefix, attn, "soft-bias", "additive bias: -inf and finite soft entries", {1, 2, 2, 3, 4, 2, 2},
                 {2, 2, 2, 6, 7, 3, 3}, [](CheckContext& ctx, const Dims& d) {
                   Array bias = Array::empty({d.T, d.S}, DType::float64);
                   for (std::size_t i = 0; i < d.T; ++i)
                     for (std::size_t j = 0; j < d.S; ++j)  // key i % S stays finite: no empty row
                       bias.set_flat(i * d.S + j, j != i % d.S && ctx.gen().uniform() < 0.35
                                                      ? -std::numeric_limits<double>::infinity()
                                                      : 2 * ctx.gen().uniform() - 1.5);
                   return Case{V::additive(bias), {}, {}};
                 });
  attention_case(s, prefix, attn, "documents", "packed documents, causal inside each (SPEC 3.7)", {1, 2, 2, 6, 6, 3, 2},
                 {2, 2, 2, 12, 12, 4, 3}, [](CheckContext&, const Dims& d) {
                   std::vector<std::int64_t> ids(d.T);
                   for (std::size_t i = 0; i < d.T; ++i) ids[i] = static_cast<std::int64_t>((i * 3) / d.T);
                   return Case{V::documents(IndexArray(Shape{d.T}, ids)), {}, {}};
                 });
  attention_case(s, prefix, attn, "key-padding", "key padding, lengths {S, S/2}", {2, 2, 2, 3, 4, 3, 2},
                 {2, 2, 2, 6, 10, 4, 3},
                 [](CheckContext&, const Dims& d) { return Case{V::key_lengths({pos(d.S), pos(d.S / 2)}, pos(d.S)), {}, {}}; });
  attention_case(s, prefix, attn, "gqa", "GQA r = 2, causal & random mask", {1, 4, 2, 3, 3, 2, 2}, {2, 6, 2, 6, 6, 4, 3},
                 [](CheckContext& ctx, const Dims& d) {
                   return Case{causal_and_random({d.B, d.H_q, d.T, d.S}, ctx.gen(), 0.7), {}, {}};
                 });
  attention_case(s, prefix, attn, "mqa", "MQA (H_kv 1), key padding", {2, 3, 1, 3, 4, 2, 2}, {2, 4, 1, 6, 8, 4, 3},
                 [](CheckContext&, const Dims& d) { return Case{V::key_lengths({pos(d.S), 2}, pos(d.S)), {}, {}}; });
  attention_case(s, prefix, attn, "invalid-rows", "left-padded causal batch: invalid queries with empty allowed sets",
                 {2, 2, 2, 4, 4, 3, 2}, {2, 4, 2, 8, 8, 4, 3}, [](CheckContext&, const Dims& d) {
                   const BoolArray real = left_padded(d);
                   return Case{V::causal(d.T, d.S) & V::valid_keys(real), real, {}};
                 });
  attention_case(s, prefix, attn, "cross", "cross shapes: T != S, d_k != d_v, key padding", {2, 2, 1, 3, 6, 4, 3},
                 {2, 4, 2, 5, 11, 6, 4},
                 [](CheckContext&, const Dims& d) { return Case{V::key_lengths({pos(d.S), pos(d.S / 2)}, pos(d.S)), {}, {}}; });
  attention_case(s, prefix, attn, "projection", "larger, random-projection mode; causal & random mask",
                 {2, 4, 2, 12, 12, 8, 8}, {2, 8, 4, 32, 32, 16, 16}, [](CheckContext& ctx, const Dims& d) {
                   return Case{causal_and_random({d.B, d.H_q, d.T, d.S}, ctx.gen(), 0.7), {}, {}};
                 });
  register_attention_sweep_check(s, prefix, attn);
}

void register_attention_reference_checks(GradcheckSuite& s, const std::string& prefix, AttentionFn attn) {
  s.add(prefix + "/reference-closed-form", "reference",
        "random configurations (masks, causal, soft bias, GQA/MQA, T != S, invalid rows): 16 (--full: 150)",
        [attn](CheckContext& ctx) {
          std::vector<CheckResult> parts;
          const std::size_t n = ctx.pick(16, 150);
          for (std::size_t k = 0; k < n; ++k) {
            const RefConfig c = random_ref_config(ctx.gen());
            const Dims& d = c.d;
            const Tensor Q(ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -2, 2), true);
            const Tensor K(ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -2, 2), true);
            const Tensor V(ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -2, 2), true);
            const nn::SdpaOptions o{std::nullopt, c.valid};
            const Tensor O = attn(Q, K, V, c.vis, o);
            const Array G = ctx.uniform(O.shape());
            const auto grads = grad(O, {Q, K, V}, G);
            parts.push_back(compare_with_reference(ctx, O, grads, Q, K, V, c, G, Array(),
                                                   "case " + std::to_string(k) + ": " + c.text));
          }
          return CheckResult::combine(parts);
        });
}

void register_attention_dropout_checks(GradcheckSuite& s) {
  const Dims d{2, 4, 2, 4, 5, 3, 2};
  s.add("attention/grad-dropout", "gradient", "dropout p 0.25 on the weights, the same mask each call; causal, " + d.text(),
        [d](CheckContext& ctx) {
          const Array Q = ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -1.5, 1.5);
          const Array K = ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -1.5, 1.5);
          const Array V = ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -1.5, 1.5);
          const std::uint64_t mask_seed = ctx.gen().next_u64();
          return ctx.gradcheck(
              [d, mask_seed](const Inputs& in) {
                Generator g(mask_seed);  // re-seeded: every evaluation draws the same mask
                nn::SdpaOptions o;
                o.dropout_p = 0.25;
                o.training = true;
                o.generator = &g;
                return nn::attention(in[0], in[1], in[2], nn::Visibility::causal(d.T, d.S), o);
              },
              {Q, K, V}, {"Q", "K", "V"});
        });
  s.add("attention/reference-dropout", "reference",
        "closed form with the forward pass's m / q (SPEC 2, 9) vs tape; 8 random configurations",
        [](CheckContext& ctx) {
          std::vector<CheckResult> parts;
          for (std::size_t k = 0; k < ctx.pick(8, 60); ++k) {
            const RefConfig c = random_ref_config(ctx.gen());
            const Dims& d = c.d;
            const Tensor Q(ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -2, 2), true);
            const Tensor K(ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -2, 2), true);
            const Tensor V(ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -2, 2), true);
            nn::SdpaOptions o{std::nullopt, c.valid};
            o.dropout_p = 0.3;
            o.training = true;
            o.generator = &ctx.gen();
            const nn::SdpaResult r = nn::scaled_dot_product_attention(Q, K, V, c.vis, o);
            const Array G = ctx.uniform(r.output.shape());
            const auto grads = grad(r.output, {Q, K, V}, G);
            // The fused path (the default) never forms the mask: regenerate it from its seed.
            const Array mask = r.dropout_mask.defined()
                                   ? r.dropout_mask
                                   : nn::attention_dropout_mask({d.B, d.H_q, d.T, d.S}, 0.3, r.dropout_seed, Q.dtype());
            parts.push_back(compare_with_reference(ctx, r.output, grads, Q, K, V, c, G, mask,
                                                   "case " + std::to_string(k) + ": " + c.text + ", dropout 0.3"));
          }
          return CheckResult::combine(parts);
        });
}

}  // namespace xg::checks
