/// \file
/// Weight layout conversion between xgrad (in x out, y = x W + b) and PyTorch (out x in,
/// y = x W^T + b), including nn.MultiheadAttention's packed in_proj_weight [3d, d], whose
/// row blocks are W_q, W_k, W_v (each out x in). SPEC 0: transpose on import and export.
#pragma once

#include <xgrad/core/array.hpp>
#include <xgrad/nn/attention.hpp>

/// Conversion of weights between xgrad's in x out layout and PyTorch's out x in.
namespace xg::nn::torch_layout {

/// A linear weight `W_in_out` [in, out] (xgrad) as PyTorch's [out, in].
Array linear_to_torch(const Array& W_in_out);
/// A linear weight `W_out_in` [out, in] (PyTorch) as xgrad's [in, out].
Array linear_from_torch(const Array& W_out_in);

/// nn.MultiheadAttention(embed_dim = d_model, num_heads = H, bias) state, batch_first or not.
struct TorchMHA {
  Array in_proj_weight;   ///< [3 d, d].
  Array in_proj_bias;     ///< [3 d] (undefined without bias).
  Array out_proj_weight;  ///< [d, d].
  Array out_proj_bias;    ///< [d] (undefined without bias).
};

/// The PyTorch state of the layer `m`. Requires MHA (H_kv == H_q) with d_head * H_q ==
/// d_model, as torch's module does.
TorchMHA export_mha(const MultiHeadAttention& m);
/// Loads the PyTorch state `w` into the layer `m`, converted to its dtype (same
/// requirements; shapes and bias presence must match, ShapeError or ValueError otherwise).
/// Everything is checked before the first write: a failed import changes nothing.
void import_mha(MultiHeadAttention& m, const TorchMHA& w);

}  // namespace xg::nn::torch_layout
