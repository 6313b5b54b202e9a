#include <xgrad/nn/torch_layout.hpp>

#include <cstring>

#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/detail/storage.hpp>

namespace xg::nn::torch_layout {

namespace {

const std::string kOp = "torch_layout";

void require_matrix(const std::string& what, const Array& a) {
  if (!a.defined() || a.ndim() != 2)
    throw ShapeError(op_message(kOp, what + " must be 2-d, has shape " + (a.defined() ? shape_str(a.shape()) : "undefined")));
}

void require_shape(const std::string& what, const Array& a, const Shape& s) {
  if (!a.defined() || a.shape() != s)
    throw ShapeError(op_message(kOp, what + " has shape " + (a.defined() ? shape_str(a.shape()) : "undefined") +
                                         ", the layer needs " + shape_str(s)));
}

std::size_t elem_size(const Array& a) { return a.dtype() == DType::float32 ? 4 : 8; }

// Rows [begin, end) of a 2-d array, or elements [begin, end) of a 1-d one (a copy).
Array rows(const Array& a, std::size_t begin, std::size_t end) {
  Shape s = a.shape();
  const std::size_t row = a.ndim() == 2 ? s[1] : 1;
  s[0] = end - begin;
  Array out = Array::empty(s, a.dtype());
  if (out.size()) {
    detail::dispatch(a.dtype(), [&](auto t) {
      using T = decltype(t);
      std::memcpy(out.data<T>(), a.data<T>() + begin * row, out.size() * sizeof(T));
    });
  }
  return out;
}

// Concatenation along the first axis (all of one dtype and row width).
Array stack(const std::vector<Array>& parts) {
  Shape s = parts[0].shape();
  s[0] = 0;
  for (const Array& p : parts) s[0] += p.shape()[0];
  Array out = Array::empty(s, parts[0].dtype());
  std::size_t at = 0;
  for (const Array& p : parts) {
    if (p.size()) std::memcpy(static_cast<char*>(out.storage().ptr) + at, p.storage().ptr, p.size() * elem_size(p));
    at += p.size() * elem_size(p);
  }
  return out;
}

Array maybe_clone(const Array& a) { return a.defined() ? a.clone() : Array(); }
Array value_or_empty(const Tensor& t) { return t.defined() ? t.value() : Array(); }

void require_mha_compatible(std::size_t H_q, std::size_t H_kv, std::size_t d_h, std::size_t d, const char* d_name) {
  if (H_kv != H_q || d_h * H_q != d)
    throw ValueError(op_message(kOp, std::string("nn.MultiheadAttention needs H_kv == H_q and H_q * d_head == ") + d_name +
                                         "; this layer has H_q " + std::to_string(H_q) + ", H_kv " + std::to_string(H_kv) +
                                         ", d_head " + std::to_string(d_h) + ", " + d_name + " " + std::to_string(d)));
}

void require_bias_presence(bool layer_has, const Array& given, const char* what) {
  if (layer_has != given.defined())
    throw ValueError(op_message(kOp, std::string(what) + (layer_has ? " is missing but the layer has biases"
                                                                    : " is given but the layer has no biases")));
}

// Converted values checked against the parameter, then written (all checks first: see below).
struct Pending {
  Tensor param;
  Array value;
  const char* what;
};
void check_all(const std::vector<Pending>& p) {
  for (const Pending& x : p)
    if (x.param.defined()) require_shape(x.what, x.value, x.param.shape());
}
void write_all(const std::vector<Pending>& p) {
  for (const Pending& x : p)
    if (x.param.defined()) {
      Tensor t = x.param;
      t.set_value(x.value);
    }
}

}  // namespace

Array linear_to_torch(const Array& W) {
  require_matrix("weight", W);
  return kernels::transpose_last2(W);
}
Array linear_from_torch(const Array& W) {
  require_matrix("weight", W);
  return kernels::transpose_last2(W);
}

// ------------------------------------------------------------------ separate projections

TorchAttention attention_to_torch(const Array& W_QKV, const Array& b_QKV, const Array& W_O, const Array& b_O,
                                  std::size_t H_q, std::size_t H_kv) {
  require_matrix("W_QKV", W_QKV);
  require_matrix("W_O", W_O);
  const std::size_t width = W_QKV.shape()[1];
  if (H_q == 0 || H_kv == 0 || width % (H_q + 2 * H_kv) != 0)
    throw ShapeError(op_message(kOp, "W_QKV has shape " + shape_str(W_QKV.shape()) + ": its width is not (H_q + 2 H_kv) d_h with H_q " +
                                         std::to_string(H_q) + ", H_kv " + std::to_string(H_kv)));
  const std::size_t d_h = width / (H_q + 2 * H_kv), q = H_q * d_h, kv = H_kv * d_h;
  const Array P = linear_to_torch(W_QKV);  // rows [Q heads | K heads | V heads]
  TorchAttention w;
  w.q_weight = rows(P, 0, q);
  w.k_weight = rows(P, q, q + kv);
  w.v_weight = rows(P, q + kv, q + 2 * kv);
  if (b_QKV.defined()) {
    require_shape("b_QKV", b_QKV, {width});
    w.q_bias = rows(b_QKV, 0, q);
    w.k_bias = rows(b_QKV, q, q + kv);
    w.v_bias = rows(b_QKV, q + kv, q + 2 * kv);
  }
  w.o_weight = linear_to_torch(W_O);
  w.o_bias = maybe_clone(b_O);
  return w;
}

TorchAttention cross_to_torch(const Array& W_Q, const Array& b_Q, const Array& W_KV, const Array& b_KV,
                              const Array& W_O, const Array& b_O) {
  require_matrix("W_Q", W_Q);
  require_matrix("W_KV", W_KV);
  require_matrix("W_O", W_O);
  if (W_KV.shape()[1] % 2 != 0) throw ShapeError(op_message(kOp, "W_KV has shape " + shape_str(W_KV.shape()) + ": odd width"));
  const std::size_t kv = W_KV.shape()[1] / 2;
  const Array P = linear_to_torch(W_KV);  // rows [K heads | V heads]
  TorchAttention w;
  w.q_weight = linear_to_torch(W_Q);
  w.q_bias = maybe_clone(b_Q);
  w.k_weight = rows(P, 0, kv);
  w.v_weight = rows(P, kv, 2 * kv);
  if (b_KV.defined()) {
    require_shape("b_KV", b_KV, {2 * kv});
    w.k_bias = rows(b_KV, 0, kv);
    w.v_bias = rows(b_KV, kv, 2 * kv);
  }
  w.o_weight = linear_to_torch(W_O);
  w.o_bias = maybe_clone(b_O);
  return w;
}

namespace {

// An export reads W_QKV and W_O: an adapter's term would be lost, so it must be merged first.
void require_no_adapters(const MultiHeadAttention& m) {
  using P = MultiHeadAttention::Projection;
  for (P p : {P::q, P::k, P::v, P::o})
    if (m.adapter(p))
      throw ValueError(op_message(kOp, std::string("projection ") + MultiHeadAttention::projection_name(p) +
                                           " has an adapter; merge it first (merge_adapter, nn::merge_lora)"));
}

}  // namespace

TorchAttention export_attention(const MultiHeadAttention& m) {
  require_no_adapters(m);
  return attention_to_torch(m.W_QKV.value(), value_or_empty(m.b_QKV), m.W_O.value(), value_or_empty(m.b_O),
                            m.config().H_q, m.config().H_kv);
}

TorchAttention export_attention(const CrossAttention& m) {
  return cross_to_torch(m.W_Q.value(), value_or_empty(m.b_Q), m.W_KV.value(), value_or_empty(m.b_KV), m.W_O.value(),
                        value_or_empty(m.b_O));
}

namespace {

// Every shape of the separate projections w (q: [q, d_in], k, v: [kv, d_kv], o: [d_out, q])
// and the presence and shapes of their biases, before anything is written.
void check_torch_attention(const TorchAttention& w, std::size_t q, std::size_t kv, std::size_t d_in,
                           std::size_t d_kv, std::size_t d_out, bool bias) {
  require_shape("q_weight", w.q_weight, {q, d_in});
  require_shape("k_weight", w.k_weight, {kv, d_kv});
  require_shape("v_weight", w.v_weight, {kv, d_kv});
  require_shape("o_weight", w.o_weight, {d_out, q});
  for (const auto& b : {std::make_pair(&w.q_bias, "q_bias"), std::make_pair(&w.k_bias, "k_bias"),
                        std::make_pair(&w.v_bias, "v_bias"), std::make_pair(&w.o_bias, "o_bias")})
    require_bias_presence(bias, *b.first, b.second);
  if (bias) {
    require_shape("q_bias", w.q_bias, {q});
    require_shape("k_bias", w.k_bias, {kv});
    require_shape("v_bias", w.v_bias, {kv});
    require_shape("o_bias", w.o_bias, {d_out});
  }
}

}  // namespace

void import_attention(MultiHeadAttention& m, const TorchAttention& w) {
  const auto& c = m.config();
  const DType dt = c.dtype;
  const std::size_t q = c.H_q * m.d_head(), kv = c.H_kv * m.d_head(), d = c.d_model;
  const bool bias = m.b_QKV.defined();
  check_torch_attention(w, q, kv, d, d, d, bias);
  const std::vector<Pending> p = {
      {m.W_QKV, linear_from_torch(stack({w.q_weight.astype(dt), w.k_weight.astype(dt), w.v_weight.astype(dt)})), "W_QKV"},
      {m.b_QKV, bias ? stack({w.q_bias.astype(dt), w.k_bias.astype(dt), w.v_bias.astype(dt)}) : Array(), "b_QKV"},
      {m.W_O, linear_from_torch(w.o_weight).astype(dt), "W_O"},
      {m.b_O, bias ? w.o_bias.astype(dt) : Array(), "b_O"}};
  check_all(p);
  write_all(p);
}

void import_attention(CrossAttention& m, const TorchAttention& w) {
  const auto& c = m.config();
  const DType dt = c.dtype;
  const std::size_t q = c.H_q * m.d_head(), kv = c.H_kv * m.d_head();
  const bool bias = m.b_Q.defined();
  check_torch_attention(w, q, kv, c.d_q, c.d_m, c.d_out, bias);
  const std::vector<Pending> p = {
      {m.W_Q, linear_from_torch(w.q_weight).astype(dt), "W_Q"},
      {m.b_Q, bias ? w.q_bias.astype(dt) : Array(), "b_Q"},
      {m.W_KV, linear_from_torch(stack({w.k_weight.astype(dt), w.v_weight.astype(dt)})), "W_KV"},
      {m.b_KV, bias ? stack({w.k_bias.astype(dt), w.v_bias.astype(dt)}) : Array(), "b_KV"},
      {m.W_O, linear_from_torch(w.o_weight).astype(dt), "W_O"},
      {m.b_O, bias ? w.o_bias.astype(dt) : Array(), "b_O"}};
  check_all(p);
  write_all(p);
}

// ------------------------------------------------------------------ nn.MultiheadAttention

// W_QKV = [W_Q W_K W_V] (d x 3d) is exactly in_proj_weight^T: its row blocks transposed.
TorchMHA export_mha(const MultiHeadAttention& m) {
  require_no_adapters(m);
  const auto& c = m.config();
  require_mha_compatible(c.H_q, c.H_kv, m.d_head(), c.d_model, "d_model");
  TorchMHA w;
  w.in_proj_weight = linear_to_torch(m.W_QKV.value());
  w.out_proj_weight = linear_to_torch(m.W_O.value());
  w.in_proj_bias = maybe_clone(value_or_empty(m.b_QKV));
  w.out_proj_bias = maybe_clone(value_or_empty(m.b_O));
  return w;
}

void import_mha(MultiHeadAttention& m, const TorchMHA& w) {
  const auto& c = m.config();
  require_mha_compatible(c.H_q, c.H_kv, m.d_head(), c.d_model, "d_model");
  if (m.b_QKV.defined() != w.in_proj_bias.defined() || m.b_O.defined() != w.out_proj_bias.defined())
    throw ValueError(op_message(kOp, "bias presence differs between the layer and the PyTorch state"));
  if (!w.in_proj_weight.defined())
    throw ValueError(op_message(kOp, "self attention needs the packed in_proj_weight (q/k/v_proj_weight are for kdim != embed_dim)"));
  // Check everything before the first write, so a failed import changes nothing.
  require_shape("in_proj_weight", w.in_proj_weight, {3 * c.d_model, c.d_model});
  require_shape("out_proj.weight", w.out_proj_weight, {c.d_model, c.d_model});
  if (w.in_proj_bias.defined()) require_shape("in_proj_bias", w.in_proj_bias, {3 * c.d_model});
  if (w.out_proj_bias.defined()) require_shape("out_proj.bias", w.out_proj_bias, {c.d_model});
  const DType dt = c.dtype;
  const std::vector<Pending> p = {{m.W_QKV, linear_from_torch(w.in_proj_weight).astype(dt), "in_proj_weight"},
                                  {m.b_QKV, m.b_QKV.defined() ? w.in_proj_bias.astype(dt) : Array(), "in_proj_bias"},
                                  {m.W_O, linear_from_torch(w.out_proj_weight).astype(dt), "out_proj.weight"},
                                  {m.b_O, m.b_O.defined() ? w.out_proj_bias.astype(dt) : Array(), "out_proj.bias"}};
  check_all(p);
  write_all(p);
}

// Cross attention: torch's in_proj rows are [W_q; W_k; W_v] = [W_Q^T; W_KV^T] (packed when
// kdim == embed_dim), in_proj_bias = [b_Q | b_KV].
TorchMHA export_mha(const CrossAttention& m) {
  const auto& c = m.config();
  require_mha_compatible(c.H_q, c.H_kv, m.d_head(), c.d_q, "d_q");
  if (c.d_out != c.d_q)
    throw ValueError(op_message(kOp, "nn.MultiheadAttention's output width is embed_dim: d_out " + std::to_string(c.d_out) +
                                         " must equal d_q " + std::to_string(c.d_q)));
  const std::size_t E = c.d_q;
  TorchMHA w;
  const Array Wq = linear_to_torch(m.W_Q.value()), Wkv = linear_to_torch(m.W_KV.value());
  if (c.d_m == E) {
    w.in_proj_weight = stack({Wq, Wkv});
  } else {
    w.q_proj_weight = Wq;
    w.k_proj_weight = rows(Wkv, 0, E);
    w.v_proj_weight = rows(Wkv, E, 2 * E);
  }
  if (m.b_Q.defined()) w.in_proj_bias = stack({m.b_Q.value(), m.b_KV.value()});
  w.out_proj_weight = linear_to_torch(m.W_O.value());
  w.out_proj_bias = maybe_clone(value_or_empty(m.b_O));
  return w;
}

void import_mha(CrossAttention& m, const TorchMHA& w) {
  const auto& c = m.config();
  require_mha_compatible(c.H_q, c.H_kv, m.d_head(), c.d_q, "d_q");
  if (c.d_out != c.d_q)
    throw ValueError(op_message(kOp, "nn.MultiheadAttention's output width is embed_dim: d_out " + std::to_string(c.d_out) +
                                         " must equal d_q " + std::to_string(c.d_q)));
  if (m.b_Q.defined() != w.in_proj_bias.defined() || m.b_O.defined() != w.out_proj_bias.defined())
    throw ValueError(op_message(kOp, "bias presence differs between the layer and the PyTorch state"));
  const bool packed = w.in_proj_weight.defined();
  const bool separate = w.q_proj_weight.defined() || w.k_proj_weight.defined() || w.v_proj_weight.defined();
  if (packed == separate)
    throw ValueError(op_message(kOp, "give either in_proj_weight (kdim == embed_dim) or q/k/v_proj_weight (kdim != embed_dim)"));
  const std::size_t E = c.d_q;
  TorchAttention t;
  if (packed) {
    require_shape("in_proj_weight", w.in_proj_weight, {3 * E, E});
    t.q_weight = rows(w.in_proj_weight, 0, E);
    t.k_weight = rows(w.in_proj_weight, E, 2 * E);
    t.v_weight = rows(w.in_proj_weight, 2 * E, 3 * E);
  } else {
    t.q_weight = w.q_proj_weight;
    t.k_weight = w.k_proj_weight;
    t.v_weight = w.v_proj_weight;
  }
  if (w.in_proj_bias.defined()) {
    require_shape("in_proj_bias", w.in_proj_bias, {3 * E});
    t.q_bias = rows(w.in_proj_bias, 0, E);
    t.k_bias = rows(w.in_proj_bias, E, 2 * E);
    t.v_bias = rows(w.in_proj_bias, 2 * E, 3 * E);
  }
  t.o_weight = w.out_proj_weight;
  t.o_bias = w.out_proj_bias;
  import_attention(m, t);
}

}  // namespace xg::nn::torch_layout
