// The spec's hand-derived backward (SPEC 9, (5.24)-(5.31); nn/attention_reference.cpp, no
// tape) against the tape's gradients of the attention core and layers, on randomised
// configurations: masks (random per head, causal with offsets, documents, soft biases), GQA
// and MQA, cross attention, invalid rows, dropout. float64, agreement to 1e-10.
#include <limits>
#include <sstream>

#include <xgrad/checks/common.hpp>
#include "helpers.hpp"
#include <xgrad/nn/flash_attention.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

constexpr double kTol = 1e-10;

struct Config {
  std::size_t B, H_q, H_kv, T, S, d_k, d_v;
  Visibility vis;
  BoolArray valid;  // [B, T] or empty
  double dropout = 0.0;
  std::string text;
};

// A random configuration. Every valid query keeps at least one allowed key; some invalid
// queries get an empty allowed set on purpose (the left-padded case of SPEC 3.8).
Config random_config(Generator& g, bool self_lengths = false) {
  Config c;
  c.B = 1 + g.below(2);
  c.H_kv = 1 + g.below(2);
  c.H_q = c.H_kv * (1 + g.below(3));  // MHA, GQA or MQA
  c.T = 1 + g.below(4);
  c.S = self_lengths ? c.T : c.T + g.below(3);
  c.d_k = 1 + g.below(4);
  c.d_v = 1 + g.below(4);
  const std::size_t kind = g.below(5);
  const Shape full{c.B, c.H_q, c.T, c.S};
  BoolArray m = BoolArray::filled(full, false);
  for (auto& v : m.data) v = g.uniform() < 0.6;
  std::vector<unsigned char> valid(c.B * c.T, 1);
  if (g.uniform() < 0.5)
    for (auto& v : valid) v = g.uniform() < 0.7;
  switch (kind) {
    case 0: c.vis = Visibility::all(); c.text = "no mask"; break;
    case 1: c.vis = Visibility::causal(c.T, c.S); c.text = "causal, bottom-right"; break;
    case 2: c.vis = Visibility::causal(c.T, c.S) & Visibility::allowed(m); c.text = "causal & random per-head"; break;
    case 3: c.vis = Visibility::allowed(m); c.text = "random per-head"; break;
    default: {
      Array bias = Array::empty({c.B, 1, c.T, c.S}, DType::float64);
      for (std::size_t i = 0; i < bias.size(); ++i)
        bias.set_flat(i, g.uniform() < 0.3 ? -std::numeric_limits<double>::infinity() : g.uniform() - 0.5);
      c.vis = Visibility::additive(bias);
      c.text = "soft additive bias";
    }
  }
  // Repair: a valid query with an empty allowed set is a VisibilityError by design.
  const auto allowed = c.vis.expand_allowed("test", full);
  BoolArray extra = BoolArray::filled(full, false);
  bool repaired = false;
  for (std::size_t b = 0; b < c.B; ++b)
    for (std::size_t h = 0; h < c.H_q; ++h)
      for (std::size_t i = 0; i < c.T; ++i) {
        const std::size_t row = ((b * c.H_q + h) * c.T + i) * c.S;
        bool any = false;
        for (std::size_t j = 0; j < c.S; ++j) any = any || allowed[row + j];
        if (!any && valid[b * c.T + i]) {
          if (kind == 4) {
            valid[b * c.T + i] = 0;  // no way to add a key to an additive bias: make it invalid
          } else {
            extra.data[row] = 1;  // key 0 is visible under any causal offset
            repaired = true;
          }
        }
      }
  if (repaired) {
    const auto a = c.vis.expand_allowed("test", full);
    for (std::size_t k = 0; k < a.size(); ++k) extra.data[k] = extra.data[k] || a[k];
    c.vis = Visibility::allowed(extra);
  }
  bool any_invalid = false;
  for (auto v : valid) any_invalid = any_invalid || !v;
  if (any_invalid) c.valid = BoolArray({c.B, c.T}, valid);
  if (g.uniform() < 0.3) c.dropout = 0.25;
  std::ostringstream os;
  os << c.text << "; B " << c.B << ", H_q " << c.H_q << ", H_kv " << c.H_kv << ", T " << c.T << ", S " << c.S
     << ", d_k " << c.d_k << ", d_v " << c.d_v << (any_invalid ? ", invalid rows" : "")
     << (c.dropout > 0 ? ", dropout" : "");
  c.text = os.str();
  return c;
}

}  // namespace

TEST_CASE("attention reference: closed-form (5.24)-(5.28) equals the tape on random configurations",
          "[nn][attention][reference]") {
  Generator g(20241130);
  for (int n = 0; n < 60; ++n) {
    const Config c = random_config(g);
    INFO("case " << n << ": " << c.text);
    Tensor Q(rnd({c.B, c.H_q, c.T, c.d_k}, g, -2, 2), true), K(rnd({c.B, c.H_kv, c.S, c.d_k}, g, -2, 2), true),
        V(rnd({c.B, c.H_kv, c.S, c.d_v}, g, -2, 2), true);
    SdpaOptions o{std::nullopt, c.valid};  // (initialised, not assigned: GCC 12 -Wnonnull false positive)
    o.return_weights = true;
    o.dropout_p = c.dropout;
    o.training = c.dropout > 0;
    o.generator = &g;
    const SdpaResult r = scaled_dot_product_attention(Q, K, V, c.vis, o);
    const Array G = rnd(r.output.shape(), g);
    const auto tape = grad(r.output, {Q, K, V}, G);

    const Shape full{c.B, c.H_q, c.T, c.S};
    const auto ref = reference::sdpa(Q.value(), K.value(), V.value(), c.vis.expand_allowed("test", full), c.valid,
                                     checks::soft_part(c.vis, full), 1.0 / std::sqrt(double(c.d_k)), r.dropout_mask, G);
    CHECK(max_abs_diff(r.output.value(), ref.O) < kTol);
    CHECK(max_abs_diff(r.weights.value(), ref.A) < kTol);
    CHECK(max_abs_diff(tape[0], ref.Q_bar) < kTol);
    CHECK(max_abs_diff(tape[1], ref.K_bar) < kTol);  // GQA: summed over each group
    CHECK(max_abs_diff(tape[2], ref.V_bar) < kTol);
    // (5.25): every row of the score gradient D sums to zero.
    for (std::size_t row = 0; row < ref.D.size() / c.S; ++row) {
      double s = 0;
      for (std::size_t j = 0; j < c.S; ++j) s += ref.D.flat(row * c.S + j);
      CHECK(std::fabs(s) < 1e-12);
    }
  }
}

TEST_CASE("attention reference: self-attention layer, three summed input paths (5.29)-(5.31) and W_O",
          "[nn][attention][reference]") {
  Generator g(77);
  for (int n = 0; n < 25; ++n) {
    const Config c = random_config(g, /*self_lengths=*/true);
    const std::size_t d_h = c.d_k, d_model = 2 + g.below(4);
    INFO("case " << n << ": " << c.text << ", d_model " << d_model << ", d_h " << d_h);
    AttentionConfig cfg;
    cfg.d_model = d_model;
    cfg.H_q = c.H_q;
    cfg.H_kv = c.H_kv;
    cfg.d_head = d_h;
    cfg.bias = g.uniform() < 0.7;
    cfg.dropout = c.dropout;
    cfg.dtype = DType::float64;
    MultiHeadAttention mha(cfg, g);
    if (cfg.bias)  // non-zero biases, so their gradients and broadcasting are exercised
      for (Tensor* b : {&mha.b_QKV, &mha.b_O}) b->set_value(rnd(b->shape(), g));
    Tensor X(rnd({c.B, c.T, d_model}, g), true);
    AttentionCall call{c.vis, c.valid, &g};
    mha.train(c.dropout > 0);
    const AttentionOutput out = mha.forward(X, call);
    const Array Y_bar = rnd(out.Y.shape(), g);
    std::vector<Tensor> wrt{X, mha.W_QKV, mha.W_O};
    if (cfg.bias) wrt.insert(wrt.end(), {mha.b_QKV, mha.b_O});
    const auto tape = grad(out.Y, wrt, Y_bar);

    const reference::Layer p = checks::reference_layer(mha);
    const Shape full{c.B, c.H_q, c.T, c.S};
    const auto ref = reference::layer(p, X.value(), X.value(), c.vis.expand_allowed("test", full), c.valid,
                                      checks::soft_part(c.vis, full), 1.0 / std::sqrt(double(d_h)),
                                      out.dropout_mask.defined() ? out.dropout_mask
                                                                 : attention_dropout_mask(full, c.dropout, out.dropout_seed, DType::float64),
                                      Y_bar);
    CHECK(max_abs_diff(out.Y.value(), ref.Y) < kTol);
    // (5.31): X_bar = Q_bar W_Q^T + K_bar W_K^T + V_bar W_V^T.
    CHECK(max_abs_diff(tape[0], (Tensor(ref.X_q_bar) + Tensor(ref.X_m_bar)).value()) < kTol);
    const Array W_QKV_bar =
        ops::concat({Tensor(ref.W_Q_bar), Tensor(ref.W_K_bar), Tensor(ref.W_V_bar)}, 1).value();
    CHECK(max_abs_diff(tape[1], W_QKV_bar) < kTol);
    CHECK(max_abs_diff(tape[2], ref.W_O_bar) < kTol);
    if (cfg.bias) {
      const Array b_QKV_bar =
          ops::concat({Tensor(ref.b_Q_bar), Tensor(ref.b_K_bar), Tensor(ref.b_V_bar)}, 0).value();
      CHECK(max_abs_diff(tape[3], b_QKV_bar) < kTol);
      CHECK(max_abs_diff(tape[4], ref.b_O_bar) < kTol);
    }
  }
}

TEST_CASE("attention reference: cross-attention layer, d_q != d_m, packed W_KV (the text after (5.22)), (5.29)-(5.30)",
          "[nn][attention][reference]") {
  Generator g(91);
  for (int n = 0; n < 25; ++n) {
    const Config c = random_config(g);
    const std::size_t d_h = c.d_k, d_q = 2 + g.below(4), d_m = 1 + g.below(5), d_out = 1 + g.below(4);
    INFO("case " << n << ": " << c.text << ", d_q " << d_q << ", d_m " << d_m << ", d_out " << d_out);
    CrossAttentionConfig cfg;
    cfg.d_q = d_q;
    cfg.d_m = d_m;
    cfg.d_out = d_out;
    cfg.H_q = c.H_q;
    cfg.H_kv = c.H_kv;
    cfg.d_head = d_h;
    cfg.dropout = c.dropout;
    cfg.dtype = DType::float64;
    CrossAttention xa(cfg, g);
    for (Tensor* b : {&xa.b_Q, &xa.b_KV, &xa.b_O}) b->set_value(rnd(b->shape(), g));
    Tensor Xq(rnd({c.B, c.T, d_q}, g), true), Xm(rnd({c.B, c.S, d_m}, g), true);
    AttentionCall call{c.vis, c.valid, &g};
    xa.train(c.dropout > 0);
    const AttentionOutput out = xa.forward(Xq, Xm, call);
    const Array Y_bar = rnd(out.Y.shape(), g);
    const auto tape = grad(out.Y, {Xq, Xm, xa.W_Q, xa.W_KV, xa.W_O, xa.b_Q, xa.b_KV, xa.b_O}, Y_bar);

    const reference::Layer p = checks::reference_layer(xa);
    const Shape full{c.B, c.H_q, c.T, c.S};
    const auto ref = reference::layer(p, Xq.value(), Xm.value(), c.vis.expand_allowed("test", full), c.valid,
                                      checks::soft_part(c.vis, full), 1.0 / std::sqrt(double(d_h)),
                                      out.dropout_mask.defined() ? out.dropout_mask
                                                                 : attention_dropout_mask(full, c.dropout, out.dropout_seed, DType::float64),
                                      Y_bar);
    CHECK(max_abs_diff(out.Y.value(), ref.Y) < kTol);
    CHECK(max_abs_diff(tape[0], ref.X_q_bar) < kTol);
    CHECK(max_abs_diff(tape[1], ref.X_m_bar) < kTol);  // K and V paths add (5.30)
    CHECK(max_abs_diff(tape[2], ref.W_Q_bar) < kTol);
    CHECK(max_abs_diff(tape[3], ops::concat({Tensor(ref.W_K_bar), Tensor(ref.W_V_bar)}, 1).value()) < kTol);
    CHECK(max_abs_diff(tape[4], ref.W_O_bar) < kTol);
    CHECK(max_abs_diff(tape[5], ref.b_Q_bar) < kTol);
    CHECK(max_abs_diff(tape[6], ops::concat({Tensor(ref.b_K_bar), Tensor(ref.b_V_bar)}, 0).value()) < kTol);
    CHECK(max_abs_diff(tape[7], ref.b_O_bar) < kTol);
  }
}

TEST_CASE("attention reference: the tape agrees with finite differences too (gradcheck, masked GQA)",
          "[nn][attention][gradcheck]") {
  Generator g(5);
  const BoolArray valid({2, 3}, {1, 1, 0, 1, 1, 1});
  const Visibility vis = Visibility::causal(3, 4) & Visibility::key_lengths({4, 3}, 4);
  SdpaOptions o;
  o.query_valid = valid;
  require_gradcheck(
      [&](const std::vector<Tensor>& in) { return attention(in[0], in[1], in[2], vis, o); },
      {rnd({2, 4, 3, 2}, g), rnd({2, 2, 4, 2}, g), rnd({2, 2, 4, 3}, g)}, {"Q", "K", "V"});
}
