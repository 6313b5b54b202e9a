// Sliding-window attention checks (Visibility::sliding_window, KVCache::windowed;
// docs/attention.md "Sliding-window attention"):
//   <impl>/grad-sliding-window          the tape against central differences, square and suffix
//                                        windows intersected with key padding, fused and composed;
//   <impl>/window-reference             output and gradients against SPEC 9's closed form with the
//                                        window's allowed set written out here from the definition;
//   models/gpt-window-kv-cache               a windowed GPT decoded with its bounded cache (prefill,
//                                        chunks larger and smaller than W, token by token) against
//                                        its full forward.
#include <algorithm>
#include <cmath>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/detail/common.hpp>
#include <xgrad/checks/attention_reference.hpp>
#include <xgrad/nn/transformer.hpp>

namespace xg::checks {

namespace {

using Inputs = std::vector<Tensor>;

// The window, written out from its definition for one batch of B samples of key lengths
// `len` (every head): allowed[b, h, i, j] = (q_i - W < k_j <= q_i) and j < len[b], with
// queries at S-T .. S-1 and keys at 0 .. S-1.
std::vector<unsigned char> window_allowed(const Dims& d, std::int64_t W, const std::vector<std::int64_t>& len) {
  std::vector<unsigned char> a;
  for (std::size_t b = 0; b < d.B; ++b)
    for (std::size_t h = 0; h < d.H_q; ++h)
      for (std::size_t i = 0; i < d.T; ++i) {
        const std::int64_t q = static_cast<std::int64_t>(d.S - d.T + i);
        for (std::size_t j = 0; j < d.S; ++j) {
          const std::int64_t k = static_cast<std::int64_t>(j);
          a.push_back(q - W < k && k <= q && k < len[b]);
        }
      }
  return a;
}

struct WindowCase {
  Dims d;
  std::int64_t W;
  std::vector<std::int64_t> len;  // key lengths per sample
  std::string text() const {
    return "W " + std::to_string(W) + (d.T == d.S ? ", square" : ", suffix") + ", key padding; " + d.text();
  }
  nn::Visibility vis() const { return nn::Visibility::sliding_window(pos(d.T), pos(d.S), W) & nn::Visibility::key_lengths(len, pos(d.S)); }
};

// Every query keeps at least one key: the padding (sample 1 of the first case: 4 of 5 keys)
// leaves the last query its key 3, which lies in its window {3, 4}.
std::vector<WindowCase> window_cases() {
  return {{{2, 2, 1, 5, 5, 3, 2}, 2, {5, 4}},
          {{1, 2, 2, 3, 7, 2, 3}, 3, {7}},
          {{2, 1, 1, 6, 6, 2, 2}, 1, {6, 6}}};
}

void register_impl(GradcheckSuite& s, const std::string& prefix, nn::SdpaImpl impl) {
  s.add(prefix + "/grad-sliding-window", "gradient",
        "sliding window (q - W < k <= q) & key padding, square and suffix, W 1..3", [impl](CheckContext& ctx) {
          std::vector<CheckResult> parts;
          for (const WindowCase& c : window_cases()) {
            const Dims& d = c.d;
            const Array Q = ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -1.5, 1.5);
            const Array K = ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -1.5, 1.5);
            const Array V = ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -1.5, 1.5);
            const nn::Visibility vis = c.vis();
            nn::SdpaOptions o;
            o.impl = impl;
            CheckResult r = ctx.gradcheck([vis, o](const Inputs& in) { return nn::attention(in[0], in[1], in[2], vis, o); },
                                          {Q, K, V}, {"Q", "K", "V"});
            r.message = c.text() + ": " + r.message;
            parts.push_back(r);
          }
          return CheckResult::combine(parts);
        });
  s.add(prefix + "/window-reference", "property",
        "sliding window & key padding vs closed form (5.24)-(5.28), allowed set from the definition",
        [impl](CheckContext& ctx) {
          Diff worst;
          for (const WindowCase& c : window_cases()) {
            const Dims& d = c.d;
            Tensor Q(ctx.uniform({d.B, d.H_q, d.T, d.d_k}, -1.5, 1.5), true);
            Tensor K(ctx.uniform({d.B, d.H_kv, d.S, d.d_k}, -1.5, 1.5), true);
            Tensor V(ctx.uniform({d.B, d.H_kv, d.S, d.d_v}, -1.5, 1.5), true);
            const Array G = ctx.uniform({d.B, d.H_q, d.T, d.d_v});
            nn::SdpaOptions o;
            o.impl = impl;
            const Tensor O = nn::attention(Q, K, V, c.vis(), o);
            const auto g = grad(O, {Q, K, V}, G);
            const auto f64 = [](const Array& a) { return a.astype(DType::float64); };
            const auto ref = reference::sdpa(f64(Q.value()), f64(K.value()), f64(V.value()),
                                                 window_allowed(d, c.W, c.len), BoolArray(), Array(),
                                                 1.0 / std::sqrt(double(d.d_k)), Array(), f64(G));
            Diff e = max_diff(f64(O.value()), ref.O, "O");
            e.merge(max_diff(f64(g[0]), ref.Q_bar, "Q_bar"));
            e.merge(max_diff(f64(g[1]), ref.K_bar, "K_bar"));
            e.merge(max_diff(f64(g[2]), ref.V_bar, "V_bar"));
            e.where += " (" + c.text() + ")";
            worst.merge(e);
          }
          return CheckResult::property(worst.max, ctx.tol(1e-10, 1e-5), worst.where,
                                       "closed form vs tape under a sliding window");
        });
}

}  // namespace

void register_window_checks(GradcheckSuite& s) {
  register_impl(s, "attention", nn::SdpaImpl::fused);
  register_impl(s, "attention-composed", nn::SdpaImpl::composed);
  s.add("models/gpt-window-kv-cache", "property",
        "windowed GPT (W 3, 2 layers): bounded KV cache, prefill / chunks 5 > W, 2 < W / token by token vs full forward",
        [](CheckContext& ctx) {
          NoGradGuard ng;
          nn::TransformerConfig c;
          c.V_vocab = 7;
          c.context = 12;
          c.d_model = 8;
          c.H_q = 2;
          c.H_kv = 1;
          c.layers = 2;
          c.window = 3;
          c.dtype = ctx.dtype();
          nn::GPT model(c, ctx.gen());
          const std::size_t T = 12;
          std::vector<std::int64_t> toks(2 * T);
          for (auto& t : toks) t = static_cast<std::int64_t>(ctx.gen().uniform() * 7) % 7;
          const IndexArray tokens({2, T}, toks);
          const Array full = model.logits(tokens).value().astype(DType::float64);
          Diff worst;
          std::size_t held = 0;
          for (const std::vector<std::size_t>& chunks :
               {std::vector<std::size_t>{T}, std::vector<std::size_t>{5, 5, 2}, std::vector<std::size_t>{2, 2, 2, 2, 2, 2},
                std::vector<std::size_t>(T, 1)}) {
            auto caches = model.make_caches(2, T);
            std::vector<Tensor> outs;
            std::size_t at = 0;
            for (std::size_t n : chunks) {
              std::vector<std::int64_t> piece;
              for (std::size_t b = 0; b < 2; ++b)
                for (std::size_t t = at; t < at + n; ++t) piece.push_back(toks[b * T + t]);
              outs.push_back(model.logits_cached(IndexArray({2, n}, piece), caches));
              at += n;
              if (n == 1) held = std::max(held, caches[0].length());
            }
            Diff e = max_diff(ops::concat(outs, 1).value().astype(DType::float64), full, "logits");
            e.where += " (" + std::to_string(chunks.size()) + " chunks)";
            worst.merge(e);
          }
          // Token by token the cache holds at most W keys: anything more is a wrong result.
          if (held > c.window) return CheckResult::property(double(held), double(c.window), "cache length", "positions held");
          return CheckResult::property(worst.max, ctx.tol(1e-10, 1e-4), worst.where,
                                       "cached decoding with a windowed cache vs the full forward");
        });
}

}  // namespace xg::checks
