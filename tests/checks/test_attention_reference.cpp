// The spec's hand-derived backward (SPEC 9, (5.24)-(5.31); checks/attention_reference.cpp, no
// tape) against the tape's gradients of the attention core and layers, on randomised
// configurations: masks (random per head, causal with offsets, documents, key lengths,
// streaming availability, soft biases), GQA and MQA, cross attention, invalid rows, dropout.
// float64, agreement to 1e-10. The reference's allowed sets come from the definitions
// (reference::allowed_sets: positions, lengths, document ids, arrival times), not from the
// Visibility the library uses; dense masks and additive biases are data given to both sides.
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

#include <xgrad/checks/detail/common.hpp>
#include "tests/support/helpers.hpp"
#include <xgrad/nn/detail/flash_attention.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xg::checks;
using namespace xgt;

namespace {

constexpr double kTol = 1e-10;

struct Config {
  std::size_t B, H_q, H_kv, T, S, d_k, d_v;
  Visibility vis;                   // the library side, built by the named constructors
  reference::AllowedSets allowed;   // the reference side: the same constraints as definitions
  Array soft;                       // [B, H_q, T, S] soft bias for the reference, or undefined
  BoolArray valid;  // [B, T] or empty
  double dropout = 0.0;
  std::string text;
};

std::vector<std::int64_t> random_ids(Generator& g, std::size_t n, std::size_t range) {
  std::vector<std::int64_t> v(n);
  for (auto& x : v) x = static_cast<std::int64_t>(g.below(range));
  return v;
}

// A random configuration. The allowed sets of the reference come from the definitions
// (positions, lengths, document ids, arrival times; checks::reference::allowed_sets), never from
// the Visibility, so a mask bug cannot hide on both sides; dense user masks and additive
// biases are data and go to both sides as given. A valid query whose allowed set is empty is
// declared invalid (a VisibilityError by design otherwise; the left-padded case of SPEC 3.8).
Config random_config(Generator& g, bool self_lengths = false) {
  Config c;
  c.B = 1 + g.below(2);
  c.H_kv = 1 + g.below(2);
  c.H_q = c.H_kv * (1 + g.below(3));  // MHA, GQA or MQA
  c.T = 1 + g.below(4);
  c.S = self_lengths ? c.T : c.T + g.below(3);
  c.d_k = 1 + g.below(4);
  c.d_v = 1 + g.below(4);
  const std::size_t kind = g.below(7);
  const Shape full{c.B, c.H_q, c.T, c.S};
  BoolArray m = BoolArray::filled(full, false);
  for (auto& v : m.data) v = g.uniform() < 0.6;
  std::vector<unsigned char> valid(c.B * c.T, 1);
  if (g.uniform() < 0.5)
    for (auto& v : valid) v = g.uniform() < 0.7;
  std::vector<std::int64_t> lengths(c.B);
  for (auto& l : lengths) l = static_cast<std::int64_t>(1 + g.below(c.S));
  switch (kind) {
    case 0: c.vis = Visibility::all(); c.text = "no mask"; break;
    case 1:
      c.vis = Visibility::causal(c.T, c.S);
      c.allowed.causal = true;
      c.text = "causal, bottom-right";
      break;
    case 2:
      c.vis = Visibility::causal(c.T, c.S) & Visibility::allowed(m);
      c.allowed.causal = true;
      c.allowed.mask = m.data;
      c.text = "causal & random per-head";
      break;
    case 3: c.vis = Visibility::allowed(m); c.allowed.mask = m.data; c.text = "random per-head"; break;
    case 4: {
      Array bias = Array::empty({c.B, 1, c.T, c.S}, DType::float64);
      for (std::size_t i = 0; i < bias.size(); ++i)
        bias.set_flat(i, g.uniform() < 0.3 ? -std::numeric_limits<double>::infinity() : g.uniform() - 0.5);
      c.vis = Visibility::additive(bias);
      // (5.11): -inf = forbidden, finite = allowed with that bias; broadcast over the heads here.
      c.soft = Array::zeros(full, DType::float64);
      c.allowed.mask.assign(c.B * c.H_q * c.T * c.S, 1);
      for (std::size_t b = 0; b < c.B; ++b)
        for (std::size_t h = 0; h < c.H_q; ++h)
          for (std::size_t k = 0; k < c.T * c.S; ++k) {
            const double v = bias.flat(b * c.T * c.S + k);
            const std::size_t o = (b * c.H_q + h) * c.T * c.S + k;
            if (std::isinf(v))
              c.allowed.mask[o] = 0;
            else
              c.soft.set_flat(o, v);
          }
      c.text = "soft additive bias";
      break;
    }
    case 5: {  // packed documents, general form (T != S, absolute positions), and key padding
      const auto q_doc = random_ids(g, c.B * c.T, 2), k_doc = random_ids(g, c.B * c.S, 2);
      std::vector<std::int64_t> q_pos(c.T), k_pos(c.S);
      for (std::size_t j = 0; j < c.S; ++j) k_pos[j] = static_cast<std::int64_t>(j);
      for (std::size_t i = 0; i < c.T; ++i) q_pos[i] = static_cast<std::int64_t>(c.S - c.T + i);
      const bool causal = g.uniform() < 0.5;
      c.vis = Visibility::documents(IndexArray({c.B, c.T}, q_doc), IndexArray({c.B, c.S}, k_doc), q_pos, k_pos,
                                    causal) &
              Visibility::key_lengths(lengths, static_cast<Position>(c.S));
      c.allowed.causal = causal;
      c.allowed.q_doc = q_doc;
      c.allowed.k_doc = k_doc;
      c.allowed.q_pos = q_pos;
      c.allowed.k_pos = k_pos;
      c.allowed.key_lengths = lengths;
      c.text = causal ? "documents (causal) & key lengths" : "documents (bidirectional) & key lengths";
      break;
    }
    default: {  // streaming source (SPEC 8) & causal & key padding
      const auto arrival = random_ids(g, c.B * c.S, 4), time = random_ids(g, c.B * c.T, 4);
      c.vis = Visibility::available(IndexArray({c.B, c.S}, arrival), IndexArray({c.B, c.T}, time)) &
              Visibility::causal(c.T, c.S) & Visibility::key_lengths(lengths, static_cast<Position>(c.S));
      c.allowed.arrival = arrival;
      c.allowed.query_time = time;
      c.allowed.causal = true;
      c.allowed.key_lengths = lengths;
      c.text = "available & causal & key lengths";
    }
  }
  const auto allowed = reference::allowed_sets(c.allowed, c.B, c.H_q, c.T, c.S);
  for (std::size_t b = 0; b < c.B; ++b)
    for (std::size_t h = 0; h < c.H_q; ++h)
      for (std::size_t i = 0; i < c.T; ++i) {
        const std::size_t row = ((b * c.H_q + h) * c.T + i) * c.S;
        bool any = false;
        for (std::size_t j = 0; j < c.S; ++j) any = any || allowed[row + j];
        if (!any) valid[b * c.T + i] = 0;
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
    const auto ref = reference::sdpa(Q.value(), K.value(), V.value(), reference::allowed_sets(c.allowed, c.B, c.H_q, c.T, c.S), c.valid,
                                     c.soft, 1.0 / std::sqrt(double(c.d_k)), r.dropout_mask, G);
    // The library's allowed sets (from the Visibility) equal the definitions.
    CHECK(c.vis.expand_allowed("test", full) == reference::allowed_sets(c.allowed, c.B, c.H_q, c.T, c.S));
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

TEST_CASE("attention reference: self-attention layer with three summed input paths (5.29)-(5.31) and W_O",
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
    const auto ref = reference::layer(p, X.value(), X.value(), reference::allowed_sets(c.allowed, c.B, c.H_q, c.T, c.S), c.valid,
                                      c.soft, 1.0 / std::sqrt(double(d_h)),
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

TEST_CASE("attention reference: cross-attention layer (5.29)-(5.30) with d_q != d_m and packed W_KV (the text after (5.22))",
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
    const auto ref = reference::layer(p, Xq.value(), Xm.value(), reference::allowed_sets(c.allowed, c.B, c.H_q, c.T, c.S), c.valid,
                                      c.soft, 1.0 / std::sqrt(double(d_h)),
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

TEST_CASE("attention reference: the tape agrees with finite differences too (gradcheck on masked GQA)",
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
