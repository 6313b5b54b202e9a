#include <xgrad/nn/torch_layout.hpp>

#include <xgrad/core/error.hpp>
#include <xgrad/core/kernels.hpp>

namespace xg::nn::torch_layout {

namespace {
void require_matrix(const std::string& what, const Array& a) {
  if (a.ndim() != 2) throw ShapeError(op_message("torch_layout", what + " must be 2-d, has shape " + shape_str(a.shape())));
}
void require_torch_compatible(const MultiHeadAttention& m) {
  const auto& c = m.config();
  if (c.H_kv != c.H_q || m.d_head() * c.H_q != c.d_model)
    throw ValueError(op_message("torch_layout", "nn.MultiheadAttention needs H_kv == H_q and H_q * d_head == d_model; "
                                                "this layer has H_q " + std::to_string(c.H_q) + ", H_kv " +
                                                std::to_string(c.H_kv) + ", d_head " + std::to_string(m.d_head()) +
                                                ", d_model " + std::to_string(c.d_model)));
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

// W_QKV = [W_Q W_K W_V] (d x 3d) is exactly in_proj_weight^T: its row blocks transposed.
TorchMHA export_mha(const MultiHeadAttention& m) {
  require_torch_compatible(m);
  TorchMHA w;
  w.in_proj_weight = linear_to_torch(m.W_QKV.value());
  w.out_proj_weight = linear_to_torch(m.W_O.value());
  if (m.b_QKV.defined()) w.in_proj_bias = m.b_QKV.value().clone();
  if (m.b_O.defined()) w.out_proj_bias = m.b_O.value().clone();
  return w;
}

void import_mha(MultiHeadAttention& m, const TorchMHA& w) {
  require_torch_compatible(m);
  if (m.b_QKV.defined() != w.in_proj_bias.defined() || m.b_O.defined() != w.out_proj_bias.defined())
    throw ValueError(op_message("torch_layout", "bias presence differs between the layer and the PyTorch state"));
  // Convert and check everything before the first write, so a failed import changes nothing.
  const DType dt = m.config().dtype;
  const Array W_QKV = linear_from_torch(w.in_proj_weight).astype(dt), W_O = linear_from_torch(w.out_proj_weight).astype(dt);
  const Array b_QKV = m.b_QKV.defined() ? w.in_proj_bias.astype(dt) : Array();
  const Array b_O = m.b_O.defined() ? w.out_proj_bias.astype(dt) : Array();
  auto same = [](const char* what, const Array& a, const Tensor& p) {
    if (a.defined() && a.shape() != p.shape())
      throw ShapeError(op_message("torch_layout", std::string(what) + " converts to shape " + shape_str(a.shape()) +
                                                      ", the layer expects " + shape_str(p.shape())));
  };
  same("in_proj_weight", W_QKV, m.W_QKV);
  same("out_proj.weight", W_O, m.W_O);
  same("in_proj_bias", b_QKV, m.b_QKV);
  same("out_proj.bias", b_O, m.b_O);
  m.W_QKV.set_value(W_QKV);
  m.W_O.set_value(W_O);
  if (b_QKV.defined()) m.b_QKV.set_value(b_QKV);
  if (b_O.defined()) m.b_O.set_value(b_O);
}

}  // namespace xg::nn::torch_layout
