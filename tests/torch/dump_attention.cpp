// dump_attention: the xgrad half of the PyTorch cross-check (tests/torch/crosscheck.py).
//
// For a fixed seed it draws random small attention configurations in float64, runs the
// xgrad forward pass and the backward pass with a random output cotangent G (gradients of
// L = sum(G * output)), and writes ONE JSON file (path = argv[1]) holding, per case, the
// configuration, every input, the masks, the cotangent, xgrad's output and every gradient.
// crosscheck.py rebuilds each case in torch float64 and compares.
//
// Categories:
//   sdpa  nn::scaled_dot_product_attention, H_q == H_kv: random allowed/forbidden mask,
//         bottom-right causal mask (T <= S), key lengths, invalid query rows.
//   gqa   the same core with H_q = r H_kv (r in 2..4, H_kv = 1 is MQA); torch side repeats
//         K and V with repeat_interleave(r, dim=1).
//   mha   nn::MultiHeadAttention (self-attention, bias on) against torch.nn.MultiheadAttention;
//         weights and gradients exported in torch layout (nn::torch_layout).
//   cross nn::CrossAttention (d_q != d_m, source padding, some invalid query rows); torch
//         side written by hand with F.linear.
//   gqa_layer  nn::MultiHeadAttention with H_kv < H_q (GQA, MQA), exported with
//         torch_layout::export_attention into four torch nn.Linear (q, k, v, o).
//   cross_mha  nn::CrossAttention against torch.nn.MultiheadAttention with kdim = vdim = d_m
//         (packed in_proj_weight when d_m == d_q, separate q/k/v_proj_weight otherwise),
//         state from torch_layout::export_mha.
//
// JSON conventions (also written into the file under "conventions"):
//   * an array is {"shape": [...], "data": [...]} in row-major order, doubles as %.17g;
//   * EVERY mask in the file uses the polarity 1 = ALLOWED (the query may see the key),
//     whatever polarity the xgrad constructor or the torch API takes; the torch side
//     converts at its boundary (nn.MultiheadAttention takes True = NOT allowed);
//   * "query_valid" is [B, T], 1 = a real query, 0 = padding (output row exactly zero);
//   * "key_lengths" gives, per sample, the number of real keys (keys 0 .. len-1);
//   * "causal": queries are the LAST T of S positions (bottom-right aligned): query i may
//     see key j iff j <= i + S - T;
//   * weights marked "torch layout" are [out, in] (y = x W^T + b), as in torch.
//
// argv[2] (optional) picks the attention implementation for every case: automatic (the
// default; the fused path here), fused or composed. CI runs the cross-check with each.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/json_text.hpp"
#include "tests/support/sdpa_impl_arg.hpp"
#include <xgrad/xgrad.hpp>

xg::nn::SdpaImpl g_impl = xg::nn::SdpaImpl::automatic;  // argv[2]

namespace {

using namespace xgt::json_text;

using namespace xg;
using nn::Visibility;

// ----------------------------------------------------------------------------- JSON text

// An object built field by field; values are already JSON text.
class Obj {
 public:
  Obj& add(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ",") + jstr(key) + ":" + json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

// ----------------------------------------------------------------------------- random draws

std::size_t between(Generator& g, std::size_t lo, std::size_t hi) {  // inclusive
  return lo + static_cast<std::size_t>(g.below(hi - lo + 1));
}
bool coin(Generator& g, double p = 0.5) { return g.uniform() < p; }

Array normal_array(const Shape& s, Generator& g) { return random_normal(s, g, DType::float64); }

BoolArray invert(const BoolArray& m) {
  BoolArray r = m;
  for (auto& v : r.data) v = v ? 0 : 1;
  return r;
}

// Visibility pieces of one case, kept in plain form so the fix-up below can reason about
// the combined allowed set and the JSON can describe each piece separately.
struct MaskSpec {
  std::size_t B = 1, H = 1, T = 1, S = 1;
  BoolArray rand_allowed;         // [T, S] or [B|1, H|1, T, S], 1 = allowed; empty = none
  bool causal = false;            // bottom-right aligned, needs T <= S
  std::vector<std::size_t> lens;  // key lengths per sample; empty = none
  BoolArray query_valid;          // [B, T], 1 = real; empty = all real

  std::size_t rand_index(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
    const Shape& s = rand_allowed.shape;
    if (s.size() == 2) return i * S + j;
    const std::size_t bb = s[0] == 1 ? 0 : b, hh = s[1] == 1 ? 0 : h;
    return ((bb * s[1] + hh) * T + i) * S + j;
  }
  bool allowed(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
    if (!rand_allowed.data.empty() && !rand_allowed.data[rand_index(b, h, i, j)]) return false;
    if (causal && j > i + S - T) return false;
    if (!lens.empty() && j >= lens[b]) return false;
    return true;
  }
  bool valid(std::size_t b, std::size_t i) const { return query_valid.data.empty() || query_valid.data[b * T + i]; }
};

// Draws a random mask of a random broadcast shape ([T, S], [B, 1, T, S], [1, H, T, S] or
// [B, H, T, S]) with allowed-density p.
BoolArray random_allowed(Generator& g, std::size_t B, std::size_t H, std::size_t T, std::size_t S, bool allow_2d) {
  Shape s;
  switch (g.below(allow_2d ? 4 : 3)) {
    case 0: s = {B, H, T, S}; break;
    case 1: s = {B, 1, T, S}; break;
    case 2: s = {1, H, T, S}; break;
    default: s = {T, S}; break;
  }
  const double p = 0.3 + 0.5 * g.uniform();
  BoolArray m = BoolArray::filled(s, false);
  for (auto& v : m.data) v = coin(g, p) ? 1 : 0;
  return m;
}

// Every VALID query must keep at least one allowed key in every head (otherwise xgrad
// reports illegal visibility, by design). Rows left empty are either declared invalid (when
// the case uses query validity, half the time: an invalid query with an empty allowed set is
// legal and must output zero) or get one key re-allowed in the random mask, chosen among the
// keys the causal and key-length constraints leave visible.
void fix_empty_rows(MaskSpec& m, Generator& g) {
  for (std::size_t b = 0; b < m.B; ++b)
    for (std::size_t i = 0; i < m.T; ++i) {
      if (!m.valid(b, i)) continue;
      bool any_empty = false;
      for (std::size_t h = 0; h < m.H; ++h) {
        bool ok = false;
        for (std::size_t j = 0; j < m.S && !ok; ++j) ok = m.allowed(b, h, i, j);
        any_empty = any_empty || !ok;
      }
      if (!any_empty) continue;
      if (!m.query_valid.data.empty() && coin(g)) {
        m.query_valid.data[b * m.T + i] = 0;
        continue;
      }
      for (std::size_t h = 0; h < m.H; ++h) {
        bool ok = false;
        for (std::size_t j = 0; j < m.S && !ok; ++j) ok = m.allowed(b, h, i, j);
        if (ok) continue;
        std::size_t jmax = m.S;
        if (m.causal) jmax = std::min(jmax, i + m.S - m.T + 1);
        if (!m.lens.empty()) jmax = std::min(jmax, m.lens[b]);
        if (m.rand_allowed.data.empty() || jmax == 0)
          throw std::runtime_error("dump_attention: cannot repair an empty row (generator bug)");
        m.rand_allowed.data[m.rand_index(b, h, i, static_cast<std::size_t>(g.below(jmax)))] = 1;
      }
    }
}

std::vector<std::size_t> random_lengths(Generator& g, std::size_t B, std::size_t S) {
  std::vector<std::size_t> lens(B);
  for (auto& l : lens) l = between(g, 1, S);
  return lens;
}

BoolArray random_validity(Generator& g, std::size_t B, std::size_t T) {
  BoolArray v = BoolArray::filled({B, T}, true);
  for (auto& x : v.data) x = coin(g, 0.7) ? 1 : 0;
  return v;
}

// JSON fields describing a MaskSpec (see the conventions at the top).
void add_masks(Obj& o, const MaskSpec& m) {
  o.add("causal", m.causal ? "true" : "false");
  o.add("key_lengths", m.lens.empty() ? "null" : jsizes(m.lens));
  o.add("allowed", m.rand_allowed.data.empty() ? "null" : jbools(m.rand_allowed));
  o.add("query_valid", m.query_valid.data.empty() ? "null" : jbools(m.query_valid));
}

// The xgrad visibility of a MaskSpec. The random mask goes in through the constructor named
// by `forbidden_polarity`: Visibility::forbidden takes the complement (true = NOT allowed),
// as nn.MultiheadAttention does; both must mean the same allowed set.
Visibility visibility_of(const MaskSpec& m, bool forbidden_polarity) {
  Visibility v = Visibility::all();
  if (!m.rand_allowed.data.empty())
    v = forbidden_polarity ? Visibility::forbidden(invert(m.rand_allowed)) : Visibility::allowed(m.rand_allowed);
  if (m.causal) v = v & Visibility::causal(m.T, m.S);
  if (!m.lens.empty()) v = v & Visibility::key_lengths(std::vector<nn::Position>(m.lens.begin(), m.lens.end()), static_cast<nn::Position>(m.S));
  return v;
}

std::string grads_json(const std::vector<std::string>& names, const std::vector<Array>& g) {
  Obj o;
  for (std::size_t i = 0; i < names.size(); ++i) o.add(names[i], jarray(g[i]));
  return o.str();
}

// ----------------------------------------------------------------------------- categories

// sdpa (r == 1) and gqa (r > 1): Q [B, H_q, T, d_k], K [B, H_kv, S, d_k], V [B, H_kv, S, d_v].
// Bits of k choose the constraints, so that 16 consecutive cases cover every combination of
// {causal, random mask, key lengths, query validity}.
std::string sdpa_case(Generator& g, const std::string& category, std::size_t id, std::size_t k, std::size_t H_kv,
                      std::size_t r) {
  const std::size_t H_q = H_kv * r;
  MaskSpec m;
  m.B = between(g, 1, 2);
  m.H = H_q;
  m.causal = k & 1;
  m.T = between(g, 1, 6);
  m.S = between(g, 1, 6);
  // Causal needs T <= S; mostly T < S, the bottom-right offset of queries over a prefix.
  if (m.causal) {
    m.T = between(g, 1, 5);
    m.S = coin(g, 0.75) ? between(g, m.T + 1, 6) : m.T;
  }
  const std::size_t d_k = between(g, 2, 8), d_v = between(g, 2, 8);
  if (k & 2) m.rand_allowed = random_allowed(g, m.B, m.H, m.T, m.S, true);
  if (k & 4) m.lens = random_lengths(g, m.B, m.S);
  if (k & 8) m.query_valid = random_validity(g, m.B, m.T);
  // Without a random mask every row keeps key 0 visible; with one, repair empty rows.
  fix_empty_rows(m, g);
  const bool forbidden_polarity = coin(g, 0.5);
  std::optional<double> scale;
  if (coin(g, 0.3)) scale = 0.2 + g.uniform();

  Tape tape;
  const Tensor Q(normal_array({m.B, H_q, m.T, d_k}, g), true);
  const Tensor K(normal_array({m.B, H_kv, m.S, d_k}, g), true);
  const Tensor V(normal_array({m.B, H_kv, m.S, d_v}, g), true);
  nn::SdpaOptions opts;
  opts.impl = g_impl;
  opts.scale = scale;
  opts.query_valid = m.query_valid;
  const nn::SdpaResult res = nn::scaled_dot_product_attention(Q, K, V, visibility_of(m, forbidden_polarity), opts);
  xgt::require_path(g_impl, res.path, category + " case " + std::to_string(id));
  const Tensor O = res.output;
  const Array G = normal_array(O.shape(), g);
  const std::vector<Array> grads = grad(O, {Q, K, V}, G);

  Obj cfg;
  cfg.add("B", std::to_string(m.B)).add("H_q", std::to_string(H_q)).add("H_kv", std::to_string(H_kv));
  cfg.add("T", std::to_string(m.T)).add("S", std::to_string(m.S));
  cfg.add("d_k", std::to_string(d_k)).add("d_v", std::to_string(d_v));
  cfg.add("scale", scale ? jnum(*scale) : "null");
  cfg.add("xgrad_mask_constructor", jstr(forbidden_polarity ? "forbidden" : "allowed"));
  Obj masks;
  add_masks(masks, m);
  Obj inputs;
  inputs.add("Q", jarray(Q.value())).add("K", jarray(K.value())).add("V", jarray(V.value()));
  Obj c;
  c.add("category", jstr(category)).add("id", std::to_string(id)).add("config", cfg.str());
  c.add("masks", masks.str()).add("inputs", inputs.str()).add("cotangent", jarray(G));
  c.add("output", jarray(O.value())).add("grads", grads_json({"Q", "K", "V"}, grads));
  return c.str();
}

// mha: self-attention X [B, T, d] through nn::MultiHeadAttention (H_kv == H_q, bias on).
// Bits of k choose causal, key padding and a random (forbidden-polarity) mask.
std::string mha_case(Generator& g, std::size_t id, std::size_t k) {
  MaskSpec m;
  m.B = between(g, 1, 2);
  m.H = between(g, 1, 4);
  m.T = m.S = between(g, 1, 6);
  const std::size_t d_head = between(g, 1, 3), d = m.H * d_head;
  m.causal = k & 1;
  if (k & 2) m.lens = random_lengths(g, m.B, m.S);
  // torch's attn_mask is [T, S] or [B * H, T, S]: no [B, 1, T, S] / [1, H, T, S] here.
  if (k & 4) {
    m.rand_allowed = random_allowed(g, m.B, m.H, m.T, m.S, true);
    if (m.rand_allowed.shape.size() == 4 && (m.rand_allowed.shape[0] == 1 || m.rand_allowed.shape[1] == 1)) {
      // Make it full [B, H, T, S].
      BoolArray full = BoolArray::filled({m.B, m.H, m.T, m.S}, false);
      for (std::size_t b = 0; b < m.B; ++b)
        for (std::size_t h = 0; h < m.H; ++h)
          for (std::size_t i = 0; i < m.T; ++i)
            for (std::size_t j = 0; j < m.S; ++j)
              full.data[((b * m.H + h) * m.T + i) * m.S + j] = m.rand_allowed.data[m.rand_index(b, h, i, j)];
      m.rand_allowed = full;
    }
  }
  fix_empty_rows(m, g);

  Generator init(1000 + id);
  nn::AttentionConfig acfg;
  acfg.impl = g_impl;
  acfg.d_model = d;
  acfg.H_q = m.H;
  acfg.bias = true;
  acfg.dtype = DType::float64;
  nn::MultiHeadAttention mha(acfg, init);
  // Biases start at zero; give them random values so the bias paths are checked.
  mha.b_QKV.set_value(normal_array(mha.b_QKV.shape(), g));
  mha.b_O.set_value(normal_array(mha.b_O.shape(), g));

  Tape tape;
  const Tensor X(normal_array({m.B, m.T, d}, g), true);
  nn::AttentionCall call;
  // The random mask goes in as a FORBIDDEN mask, the polarity nn.MultiheadAttention uses.
  call.visibility = visibility_of(m, true);
  const nn::AttentionOutput out = mha.forward(X, call);
  xgt::require_path(g_impl, out.path, "mha case " + std::to_string(id));
  const Tensor Y = out.Y;
  const Array G = normal_array(Y.shape(), g);
  const std::vector<Array> gr = grad(Y, {X, mha.W_QKV, mha.b_QKV, mha.W_O, mha.b_O}, G);

  namespace tl = nn::torch_layout;
  const tl::TorchMHA w = tl::export_mha(mha);
  Obj cfg;
  cfg.add("B", std::to_string(m.B)).add("T", std::to_string(m.T)).add("d_model", std::to_string(d));
  cfg.add("H", std::to_string(m.H)).add("d_head", std::to_string(d_head));
  Obj masks;
  add_masks(masks, m);
  Obj inputs;  // parameters in torch layout (nn.MultiheadAttention's state)
  inputs.add("X", jarray(X.value()));
  inputs.add("in_proj_weight", jarray(w.in_proj_weight)).add("in_proj_bias", jarray(w.in_proj_bias));
  inputs.add("out_proj_weight", jarray(w.out_proj_weight)).add("out_proj_bias", jarray(w.out_proj_bias));
  // Gradients converted to torch layout: dL/d in_proj_weight = (dL/d W_QKV)^T, etc.
  const std::vector<Array> tg = {gr[0], tl::linear_to_torch(gr[1]), gr[2], tl::linear_to_torch(gr[3]), gr[4]};
  Obj c;
  c.add("category", jstr("mha")).add("id", std::to_string(id)).add("config", cfg.str());
  c.add("masks", masks.str()).add("inputs", inputs.str()).add("cotangent", jarray(G));
  c.add("output", jarray(Y.value()));
  c.add("grads", grads_json({"X", "in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias"}, tg));
  return c.str();
}

// cross: X_q [B, T, d_q], X_m [B, S, d_m] through nn::CrossAttention with source padding.
std::string cross_case(Generator& g, std::size_t id, std::size_t k) {
  MaskSpec m;
  m.B = between(g, 1, 2);
  m.T = between(g, 1, 6);
  m.S = between(g, 1, 6);
  const std::size_t H_kv = between(g, 1, 2), r = coin(g, 0.7) ? 1 : between(g, 2, 3), H_q = H_kv * r;
  m.H = H_q;
  const std::size_t d_head = between(g, 1, 3);
  nn::CrossAttentionConfig ccfg;
  ccfg.impl = g_impl;
  if (coin(g, 0.5)) {
    ccfg.d_q = H_q * d_head;  // customary: d_head = d_q / H_q
    ccfg.d_head = 0;
  } else {
    ccfg.d_q = between(g, 2, 8);
    ccfg.d_head = d_head;
  }
  do ccfg.d_m = between(g, 2, 8);
  while (ccfg.d_m == ccfg.d_q);
  ccfg.d_out = coin(g, 0.5) ? 0 : between(g, 2, 8);
  ccfg.H_q = H_q;
  ccfg.H_kv = H_kv;
  ccfg.bias = true;
  ccfg.dtype = DType::float64;
  m.lens = random_lengths(g, m.B, m.S);  // source padding
  if (k & 1) m.query_valid = random_validity(g, m.B, m.T);
  fix_empty_rows(m, g);  // key lengths are >= 1: nothing to repair

  Generator init(2000 + id);
  nn::CrossAttention ca(ccfg, init);
  ca.b_Q.set_value(normal_array(ca.b_Q.shape(), g));
  ca.b_KV.set_value(normal_array(ca.b_KV.shape(), g));
  ca.b_O.set_value(normal_array(ca.b_O.shape(), g));

  Tape tape;
  const Tensor Xq(normal_array({m.B, m.T, ccfg.d_q}, g), true);
  const Tensor Xm(normal_array({m.B, m.S, ccfg.d_m}, g), true);
  nn::AttentionCall call;
  call.visibility = visibility_of(m, false);
  call.query_valid = m.query_valid;
  const nn::AttentionOutput out = ca.forward(Xq, Xm, call);
  xgt::require_path(g_impl, out.path, "cross case " + std::to_string(id));
  const Tensor Y = out.Y;
  const Array G = normal_array(Y.shape(), g);
  const std::vector<Array> gr = grad(Y, {Xq, Xm, ca.W_Q, ca.b_Q, ca.W_KV, ca.b_KV, ca.W_O, ca.b_O}, G);

  namespace tl = nn::torch_layout;
  Obj cfg;
  cfg.add("B", std::to_string(m.B)).add("T", std::to_string(m.T)).add("S", std::to_string(m.S));
  cfg.add("d_q", std::to_string(ccfg.d_q)).add("d_m", std::to_string(ccfg.d_m));
  cfg.add("d_out", std::to_string(ca.config().d_out)).add("d_head", std::to_string(ca.d_head()));
  cfg.add("H_q", std::to_string(H_q)).add("H_kv", std::to_string(H_kv));
  cfg.add("weight_layout", jstr("torch [out, in]; W_KV rows = [K heads | V heads], each head-major"));
  Obj masks;
  add_masks(masks, m);
  Obj inputs;
  inputs.add("X_q", jarray(Xq.value())).add("X_m", jarray(Xm.value()));
  inputs.add("W_Q", jarray(tl::linear_to_torch(ca.W_Q.value()))).add("b_Q", jarray(ca.b_Q.value()));
  inputs.add("W_KV", jarray(tl::linear_to_torch(ca.W_KV.value()))).add("b_KV", jarray(ca.b_KV.value()));
  inputs.add("W_O", jarray(tl::linear_to_torch(ca.W_O.value()))).add("b_O", jarray(ca.b_O.value()));
  const std::vector<Array> tg = {gr[0], gr[1], tl::linear_to_torch(gr[2]), gr[3],
                                 tl::linear_to_torch(gr[4]), gr[5], tl::linear_to_torch(gr[6]), gr[7]};
  Obj c;
  c.add("category", jstr("cross")).add("id", std::to_string(id)).add("config", cfg.str());
  c.add("masks", masks.str()).add("inputs", inputs.str()).add("cotangent", jarray(G));
  c.add("output", jarray(Y.value()));
  c.add("grads", grads_json({"X_q", "X_m", "W_Q", "b_Q", "W_KV", "b_KV", "W_O", "b_O"}, tg));
  return c.str();
}

// Rows of several 2-d arrays (or elements of 1-d ones) one after another: torch's packed
// in_proj_weight / in_proj_bias from the separate parts.
Array concat_rows(const std::vector<Array>& parts) {
  std::vector<double> v;
  Shape s = parts[0].shape();
  s[0] = 0;
  for (const Array& p : parts) {
    const auto d = p.to_vector();
    v.insert(v.end(), d.begin(), d.end());
    s[0] += p.shape()[0];
  }
  return Array::from_vector(s, v, DType::float64);
}

// gqa_layer: self-attention X [B, T, d] through nn::MultiHeadAttention with H_kv < H_q (GQA,
// and MQA when H_kv == 1), exported with torch_layout::export_attention as separate q/k/v/o
// nn.Linear weights; torch side: four nn.Linear modules and repeat_interleave. Bits of k choose
// causal and key padding; odd cases set d_head explicitly (H_q d_head != d_model).
std::string gqa_layer_case(Generator& g, std::size_t id, std::size_t k) {
  MaskSpec m;
  m.B = between(g, 1, 2);
  const std::size_t H_kv = k % 4 == 0 ? 1 : between(g, 1, 2), r = between(g, 2, 3), H_q = H_kv * r;
  m.H = H_q;
  m.T = m.S = between(g, 1, 6);
  m.causal = k & 1;
  if (k & 2) m.lens = random_lengths(g, m.B, m.S);
  if (m.causal && !m.lens.empty())  // row i sees keys 0..i: keep key 0 real in every sample
    for (auto& l : m.lens) l = std::max<std::size_t>(l, 1);
  const std::size_t d_head = between(g, 1, 3);
  nn::AttentionConfig acfg;
  acfg.impl = g_impl;
  acfg.H_q = H_q;
  acfg.H_kv = H_kv;
  if (k & 4) {
    acfg.d_model = between(g, 2, 7);
    acfg.d_head = d_head;
  } else {
    acfg.d_model = H_q * d_head;
  }
  acfg.bias = true;
  acfg.dtype = DType::float64;
  Generator init(3000 + id);
  nn::MultiHeadAttention mha(acfg, init);
  mha.b_QKV.set_value(normal_array(mha.b_QKV.shape(), g));
  mha.b_O.set_value(normal_array(mha.b_O.shape(), g));

  Tape tape;
  const Tensor X(normal_array({m.B, m.T, acfg.d_model}, g), true);
  nn::AttentionCall call;
  call.visibility = visibility_of(m, false);
  const nn::AttentionOutput out = mha.forward(X, call);
  xgt::require_path(g_impl, out.path, "gqa_layer case " + std::to_string(id));
  const Tensor Y = out.Y;
  const Array G = normal_array(Y.shape(), g);
  const std::vector<Array> gr = grad(Y, {X, mha.W_QKV, mha.b_QKV, mha.W_O, mha.b_O}, G);

  namespace tl = nn::torch_layout;
  const tl::TorchAttention w = tl::export_attention(mha);
  const tl::TorchAttention tg = tl::attention_to_torch(gr[1], gr[2], gr[3], gr[4], H_q, H_kv);  // gradients too
  Obj cfg;
  cfg.add("B", std::to_string(m.B)).add("T", std::to_string(m.T)).add("d_model", std::to_string(acfg.d_model));
  cfg.add("H_q", std::to_string(H_q)).add("H_kv", std::to_string(H_kv)).add("d_head", std::to_string(mha.d_head()));
  Obj masks;
  add_masks(masks, m);
  Obj inputs;  // torch layout: nn.Linear weights [out, in]
  inputs.add("X", jarray(X.value()));
  const std::vector<std::pair<std::string, const Array*>> params = {
      {"q.weight", &w.q_weight}, {"q.bias", &w.q_bias}, {"k.weight", &w.k_weight}, {"k.bias", &w.k_bias},
      {"v.weight", &w.v_weight}, {"v.bias", &w.v_bias}, {"o.weight", &w.o_weight}, {"o.bias", &w.o_bias}};
  for (const auto& p : params) inputs.add(p.first, jarray(*p.second));
  Obj c;
  c.add("category", jstr("gqa_layer")).add("id", std::to_string(id)).add("config", cfg.str());
  c.add("masks", masks.str()).add("inputs", inputs.str()).add("cotangent", jarray(G));
  c.add("output", jarray(Y.value()));
  c.add("grads", grads_json({"X", "q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias", "o.weight", "o.bias"},
                            {gr[0], tg.q_weight, tg.q_bias, tg.k_weight, tg.k_bias, tg.v_weight, tg.v_bias, tg.o_weight,
                             tg.o_bias}));
  return c.str();
}

// cross_mha: nn::CrossAttention (H_kv == H_q, d_q = H d_head, d_out = d_q) against
// torch.nn.MultiheadAttention(embed_dim = d_q, kdim = vdim = d_m), state from
// torch_layout::export_mha: packed in_proj_weight when d_m == d_q (even k), separate
// q/k/v_proj_weight otherwise. Source padding always (key_padding_mask); odd k add a random
// [T, S] mask (torch's attn_mask, True = NOT allowed).
std::string cross_mha_case(Generator& g, std::size_t id, std::size_t k) {
  MaskSpec m;
  m.B = between(g, 1, 2);
  m.H = between(g, 1, 3);
  m.T = between(g, 1, 5);
  m.S = between(g, 1, 5);
  const std::size_t d_head = between(g, 1, 3), E = m.H * d_head;
  nn::CrossAttentionConfig ccfg;
  ccfg.impl = g_impl;
  ccfg.d_q = E;
  if (k % 2 == 0) {
    ccfg.d_m = E;
  } else {
    do ccfg.d_m = between(g, 1, 7);
    while (ccfg.d_m == E);
  }
  ccfg.H_q = ccfg.H_kv = m.H;
  ccfg.bias = true;
  ccfg.dtype = DType::float64;
  m.lens = random_lengths(g, m.B, m.S);
  if (k & 2) {
    m.rand_allowed = random_allowed(g, m.B, m.H, m.T, m.S, true);
    if (m.rand_allowed.shape.size() != 2) m.rand_allowed = random_allowed(g, m.B, m.H, m.T, m.S, true);
    if (m.rand_allowed.shape.size() != 2) m.rand_allowed = BoolArray();  // torch takes [T, S] here
  }
  fix_empty_rows(m, g);
  Generator init(4000 + id);
  nn::CrossAttention ca(ccfg, init);
  ca.b_Q.set_value(normal_array(ca.b_Q.shape(), g));
  ca.b_KV.set_value(normal_array(ca.b_KV.shape(), g));
  ca.b_O.set_value(normal_array(ca.b_O.shape(), g));

  Tape tape;
  const Tensor Xq(normal_array({m.B, m.T, E}, g), true);
  const Tensor Xm(normal_array({m.B, m.S, ccfg.d_m}, g), true);
  nn::AttentionCall call;
  call.visibility = visibility_of(m, true);
  const nn::AttentionOutput out = ca.forward(Xq, Xm, call);
  xgt::require_path(g_impl, out.path, "cross_mha case " + std::to_string(id));
  const Tensor Y = out.Y;
  const Array G = normal_array(Y.shape(), g);
  const std::vector<Array> gr = grad(Y, {Xq, Xm, ca.W_Q, ca.b_Q, ca.W_KV, ca.b_KV, ca.W_O, ca.b_O}, G);

  namespace tl = nn::torch_layout;
  const tl::TorchMHA w = tl::export_mha(ca);
  const tl::TorchAttention tg = tl::cross_to_torch(gr[2], gr[3], gr[4], gr[5], gr[6], gr[7]);
  Obj cfg;
  cfg.add("B", std::to_string(m.B)).add("T", std::to_string(m.T)).add("S", std::to_string(m.S));
  cfg.add("d_q", std::to_string(E)).add("d_m", std::to_string(ccfg.d_m)).add("H", std::to_string(m.H));
  cfg.add("d_head", std::to_string(d_head)).add("packed", w.in_proj_weight.defined() ? "true" : "false");
  Obj masks;
  add_masks(masks, m);
  Obj inputs;  // nn.MultiheadAttention's state
  inputs.add("X_q", jarray(Xq.value())).add("X_m", jarray(Xm.value()));
  std::vector<std::string> names = {"X_q", "X_m"};
  std::vector<Array> grads = {gr[0], gr[1]};
  if (w.in_proj_weight.defined()) {
    inputs.add("in_proj_weight", jarray(w.in_proj_weight));
    names.push_back("in_proj_weight");
    grads.push_back(concat_rows({tg.q_weight, tg.k_weight, tg.v_weight}));
  } else {
    inputs.add("q_proj_weight", jarray(w.q_proj_weight)).add("k_proj_weight", jarray(w.k_proj_weight));
    inputs.add("v_proj_weight", jarray(w.v_proj_weight));
    names.insert(names.end(), {"q_proj_weight", "k_proj_weight", "v_proj_weight"});
    grads.insert(grads.end(), {tg.q_weight, tg.k_weight, tg.v_weight});
  }
  inputs.add("in_proj_bias", jarray(w.in_proj_bias));
  inputs.add("out_proj_weight", jarray(w.out_proj_weight)).add("out_proj_bias", jarray(w.out_proj_bias));
  names.insert(names.end(), {"in_proj_bias", "out_proj_weight", "out_proj_bias"});
  grads.insert(grads.end(), {concat_rows({tg.q_bias, tg.k_bias, tg.v_bias}), tg.o_weight, tg.o_bias});
  Obj c;
  c.add("category", jstr("cross_mha")).add("id", std::to_string(id)).add("config", cfg.str());
  c.add("masks", masks.str()).add("inputs", inputs.str()).add("cotangent", jarray(G));
  c.add("output", jarray(Y.value()));
  c.add("grads", grads_json(names, grads));
  return c.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (!xgt::parse_dump_args(argc, argv, "dump_attention", g_impl)) return 2;
  const std::size_t per_category = 16;
  try {
    Generator g(20240521);
    std::vector<std::string> cases;
    std::size_t id = 0;
    for (std::size_t k = 0; k < per_category; ++k) {
      const std::size_t H = between(g, 1, 4);
      cases.push_back(sdpa_case(g, "sdpa", id++, k, H, 1));
    }
    for (std::size_t k = 0; k < per_category; ++k) {
      // Every fourth case is MQA (H_kv = 1); r cycles through 2, 3, 4.
      const std::size_t r = 2 + k % 3, H_kv = k % 4 == 0 ? 1 : between(g, 2, r == 2 ? 3 : 2);
      cases.push_back(sdpa_case(g, "gqa", id++, k, H_kv, r));
    }
    for (std::size_t k = 0; k < per_category; ++k) cases.push_back(mha_case(g, id++, k));
    for (std::size_t k = 0; k < per_category; ++k) cases.push_back(cross_case(g, id++, k));
    for (std::size_t k = 0; k < per_category; ++k) cases.push_back(gqa_layer_case(g, id++, k));
    for (std::size_t k = 0; k < per_category; ++k) cases.push_back(cross_mha_case(g, id++, k));

    Obj conv;
    conv.add("arrays", jstr("{shape, data}, row-major, float64 as %.17g"));
    conv.add("masks", jstr("1 = ALLOWED (query may see key), for every mask in this file"));
    conv.add("query_valid", jstr("[B, T], 1 = real query, 0 = padding: xgrad output row is exactly zero"));
    conv.add("causal", jstr("bottom-right aligned: query i sees key j iff j <= i + S - T"));
    conv.add("key_lengths", jstr("sample b has real keys 0 .. key_lengths[b]-1"));
    conv.add("cotangent", jstr("gradients are of L = sum(cotangent * output)"));
    std::string out = "{\"conventions\":" + conv.str() + ",\"cases\":[\n";
    for (std::size_t i = 0; i < cases.size(); ++i) out += cases[i] + (i + 1 < cases.size() ? ",\n" : "\n");
    out += "]}\n";

    std::FILE* f = std::fopen(argv[1], "w");
    if (!f) {
      std::fprintf(stderr, "dump_attention: cannot open %s for writing\n", argv[1]);
      return 1;
    }
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) {
      std::fprintf(stderr, "dump_attention: write to %s failed\n", argv[1]);
      return 1;
    }
    std::printf("dump_attention: wrote %zu cases (%zu per category) to %s\n", cases.size(), per_category, argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_attention: %s\n", e.what());
    return 1;
  }
  return 0;
}
