#include <xgrad/checks/detail/common.hpp>

#include <cmath>
#include <limits>
#include <sstream>

namespace xg::checks {

BoolArray random_allowed(const Shape& s, Generator& g, double p_allowed) {
  BoolArray m = BoolArray::filled(s, false);
  const std::size_t S = s.back();
  for (std::size_t r = 0; r < m.size() / S; ++r) {
    bool any = false;
    for (std::size_t j = 0; j < S; ++j) {
      m.data[r * S + j] = g.uniform() < p_allowed;
      any = any || m.data[r * S + j];
    }
    if (!any) m.data[r * S + g.below(S)] = 1;
  }
  return m;
}

nn::Visibility causal_and_random(const Shape& BHTS, Generator& g, double p_allowed) {
  const std::size_t T = BHTS[2], S = BHTS[3];
  BoolArray m = random_allowed(BHTS, g, p_allowed);
  for (std::size_t r = 0; r < m.size() / S; ++r) m.data[r * S + (S - T) + r % T] = 1;
  return nn::Visibility::causal(T, S) & nn::Visibility::allowed(m);
}

Tensor head(const Tensor& x, std::size_t h) {
  return ops::slice(x, 1, static_cast<long>(h), static_cast<long>(h) + 1);
}

Diff max_diff(const Array& a, const Array& b, const std::string& name) {
  if (a.shape() != b.shape())
    throw ShapeError(op_message("gradcheck", name + ": shapes differ: " + shape_str(a.shape()) + " and " +
                                                 shape_str(b.shape())));
  Diff d;
  const std::vector<double> av = a.to_vector(), bv = b.to_vector();
  std::size_t at = 0;
  for (std::size_t i = 0; i < av.size(); ++i) {
    double e = std::fabs(av[i] - bv[i]);
    if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
    if (e > d.max) {
      d.max = e;
      at = i;
    }
  }
  d.where = name + "[" + index_list(unravel_index(at, a.shape())) + "]";
  return d;
}

Diff max_abs(const Array& a, const std::string& name) {
  return max_diff(a, Array::zeros(a.shape(), a.dtype()), name);
}

double max_abs_value(const Array& a) {
  double m = 0;
  for (double x : a.to_vector()) m = std::max(m, std::fabs(x));
  return m;
}

std::string dims_text(std::size_t B, std::size_t H_q, std::size_t H_kv, std::size_t T, std::size_t S,
                      std::size_t d_k, std::size_t d_v) {
  std::ostringstream os;
  os << "B " << B << ", H_q " << H_q << ", H_kv " << H_kv << ", T " << T << ", S " << S << ", d_k " << d_k
     << ", d_v " << d_v;
  return os.str();
}

RefConfig random_ref_config(Generator& g, bool self_attention) {
  RefConfig c;
  Dims& d = c.d;
  d.B = 1 + g.below(2);
  d.H_kv = 1 + g.below(2);
  d.H_q = d.H_kv * (1 + g.below(3));
  d.T = 1 + g.below(4);
  d.S = self_attention ? d.T : d.T + g.below(3);
  d.d_k = 1 + g.below(4);
  d.d_v = 1 + g.below(4);
  const Shape full{d.B, d.H_q, d.T, d.S};
  std::vector<unsigned char> valid(d.B * d.T, 1);
  if (g.uniform() < 0.4)
    for (auto& v : valid) v = g.uniform() < 0.7;
  const std::size_t kind = g.below(5);
  // Each case sets the Visibility (library side) and the same constraints as definitions for
  // the closed-form reference (c.allowed, c.soft): the reference never reads the Visibility.
  switch (kind) {
    case 0: c.vis = nn::Visibility::all(); c.text = "no mask"; break;
    case 1:
      c.vis = nn::Visibility::causal(d.T, d.S);
      c.allowed.causal = true;
      c.text = "causal";
      break;
    case 2: {
      const BoolArray m = random_allowed(full, g, 0.6);
      c.vis = nn::Visibility::causal(d.T, d.S) & nn::Visibility::allowed(m);
      c.allowed.causal = true;
      c.allowed.mask = m.data;
      c.text = "causal & random";
      break;
    }
    case 3: {
      const BoolArray m = random_allowed(full, g, 0.5);
      c.vis = nn::Visibility::allowed(m);
      c.allowed.mask = m.data;
      c.text = "random per-head";
      break;
    }
    default: {
      Array bias = Array::empty({d.B, 1, d.T, d.S}, DType::float64);
      for (std::size_t i = 0; i < bias.size(); ++i)
        bias.set_flat(i, g.uniform() < 0.3 ? -std::numeric_limits<double>::infinity() : g.uniform() - 0.5);
      c.vis = nn::Visibility::additive(bias);
      // (5.11): -inf = forbidden, finite = allowed with that soft bias; one bias for every head.
      c.soft = Array::zeros(full, DType::float64);
      c.allowed.mask.assign(numel(full), 1);
      for (std::size_t b = 0; b < d.B; ++b)
        for (std::size_t h = 0; h < d.H_q; ++h)
          for (std::size_t k = 0; k < d.T * d.S; ++k) {
            const double v = bias.flat(b * d.T * d.S + k);
            const std::size_t o = (b * d.H_q + h) * d.T * d.S + k;
            if (std::isinf(v))
              c.allowed.mask[o] = 0;
            else
              c.soft.set_flat(o, v);
          }
      c.text = "soft bias";
    }
  }
  // A valid query with an empty allowed set is a VisibilityError by design: declare it invalid.
  const auto allowed = reference::allowed_sets(c.allowed, d.B, d.H_q, d.T, d.S);
  for (std::size_t b = 0; b < d.B; ++b)
    for (std::size_t h = 0; h < d.H_q; ++h)
      for (std::size_t i = 0; i < d.T; ++i) {
        bool any = false;
        for (std::size_t j = 0; j < d.S; ++j) any = any || allowed[((b * d.H_q + h) * d.T + i) * d.S + j];
        if (!any) valid[b * d.T + i] = 0;
      }
  bool any_invalid = false;
  for (auto v : valid) any_invalid = any_invalid || !v;
  if (any_invalid) c.valid = BoolArray({d.B, d.T}, valid);
  c.text += "; " + d.text() + (any_invalid ? ", invalid rows" : "");
  return c;
}

// The soft part of a visibility expanded to the score shape (0 where forbidden).
nn::AttentionCall make_call(const nn::Visibility& vis, const BoolArray& query_valid, Generator* gen) {
  nn::AttentionCall c;
  c.visibility = vis;
  c.query_valid = query_valid;
  c.generator = gen;
  return c;
}

Array soft_part(const nn::Visibility& v, const Shape& full) {
  Array b = ops::broadcast_to(Tensor(v.bias(DType::float64)), full).value().clone();
  for (std::size_t i = 0; i < b.size(); ++i)
    if (std::isinf(b.flat(i))) b.set_flat(i, 0.0);
  return b;
}

namespace {
Array f64_columns(const Tensor& t, std::size_t start, std::size_t n) {
  if (!t.defined()) return Array();
  return ops::slice(t, -1, static_cast<long>(start), static_cast<long>(start + n)).value().astype(DType::float64);
}
Array f64_or_none(const Tensor& t) { return t.defined() ? t.value().astype(DType::float64) : Array(); }

// The parts of a reference::Layer that MultiHeadAttention and CrossAttention share: the
// output projection and the head counts.
template <class Attention>
reference::Layer with_output_and_heads(reference::Layer p, const Attention& m, std::size_t d_h) {
  p.W_O = f64_or_none(m.W_O);
  p.b_O = f64_or_none(m.b_O);
  p.H_q = m.config().H_q;
  p.H_kv = m.config().H_kv;
  p.d_h = d_h;
  return p;
}
}  // namespace

reference::Layer reference_layer(const nn::MultiHeadAttention& m) {
  const auto& c = m.config();
  const std::size_t d_h = m.d_head(), q = c.H_q * d_h, kv = c.H_kv * d_h;
  reference::Layer p;
  p.W_Q = f64_columns(m.W_QKV, 0, q);  // columns [Q heads | K heads | V heads] (5.22)
  p.W_K = f64_columns(m.W_QKV, q, kv);
  p.W_V = f64_columns(m.W_QKV, q + kv, kv);
  p.b_Q = f64_columns(m.b_QKV, 0, q);
  p.b_K = f64_columns(m.b_QKV, q, kv);
  p.b_V = f64_columns(m.b_QKV, q + kv, kv);
  return with_output_and_heads(p, m, d_h);
}

reference::Layer reference_layer(const nn::CrossAttention& m) {
  const auto& c = m.config();
  const std::size_t d_h = m.d_head(), kv = c.H_kv * d_h;
  reference::Layer p;
  p.W_Q = f64_or_none(m.W_Q);
  p.W_K = f64_columns(m.W_KV, 0, kv);  // columns [K heads | V heads] (the text after (5.22))
  p.W_V = f64_columns(m.W_KV, kv, kv);
  p.b_Q = f64_or_none(m.b_Q);
  p.b_K = f64_columns(m.b_KV, 0, kv);
  p.b_V = f64_columns(m.b_KV, kv, kv);
  return with_output_and_heads(p, m, d_h);
}

}  // namespace xg::checks
