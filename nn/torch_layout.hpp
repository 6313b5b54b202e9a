/// \file
/// Weight layout conversion between xgrad (in x out, y = x W + b) and PyTorch (out x in,
/// y = x W^T + b) for the attention layers, in both directions (export: xgrad -> torch,
/// import: torch -> xgrad). docs/from-pytorch.md has the full name mapping.
///
/// Two torch forms:
///  * TorchAttention: separate q, k, v, o projections, as torch models with nn.Linear layers
///    write them (and tools/xgrad_torch.py's Attention): any H_kv (MHA, GQA, MQA), self or
///    cross attention, any d_head. q: [H_q d_h, d_in], k, v: [H_kv d_h, d_kv], o: [d_out, H_q d_h].
///    xgrad's packed weights are these stacked and transposed:
///      W_QKV = [q^T | k^T | v^T]   (columns [Q heads | K heads | V heads], head-major in each)
///      W_KV  = [k^T | v^T]         (cross attention; W_Q = q^T)
///    Query head h reads key/value head h / (H_q / H_kv) on both sides (torch: repeat_interleave).
///  * TorchMHA: nn.MultiheadAttention's state. Needs H_kv == H_q and H_q d_h == embed_dim.
///    Self attention: in_proj_weight [3E, E] (row blocks W_q, W_k, W_v). Cross attention
///    (embed_dim = d_q, kdim = vdim = d_m): the packed in_proj_weight when d_m == d_q, else
///    torch's separate q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim]
///    (in_proj_weight undefined); in_proj_bias [3E] either way, and d_out must be d_q.
///
/// Imports check every shape (ShapeError) and the bias presence (ValueError) before the first
/// write, so a failed import leaves the layer unchanged; values are converted to the layer's
/// dtype. The array-level functions (attention_to_torch, cross_to_torch) do the same for any
/// arrays of those shapes, e.g. gradients.
#pragma once

#include <xgrad/core/array.hpp>
#include <xgrad/nn/attention.hpp>

/// Conversion of weights between xgrad's in x out layout and PyTorch's out x in.
namespace xg::nn::torch_layout {

/// A linear weight `W_in_out` [in, out] (xgrad) as PyTorch's [out, in].
Array linear_to_torch(const Array& W_in_out);
/// A linear weight `W_out_in` [out, in] (PyTorch) as xgrad's [in, out].
Array linear_from_torch(const Array& W_out_in);

/// An attention layer as separate PyTorch nn.Linear projections (out x in). Biases are
/// undefined for a layer without bias.
struct TorchAttention {
  Array q_weight;  ///< [H_q d_h, d_in]
  Array q_bias;    ///< [H_q d_h]
  Array k_weight;  ///< [H_kv d_h, d_kv]
  Array k_bias;    ///< [H_kv d_h]
  Array v_weight;  ///< [H_kv d_h, d_kv]
  Array v_bias;    ///< [H_kv d_h]
  Array o_weight;  ///< [d_out, H_q d_h]
  Array o_bias;    ///< [d_out]
};

/// The self-attention layer `m` (MHA, GQA or MQA) as separate q, k, v, o projections. A
/// layer with an adapter attached (nn/adapter.hpp) is a ValueError: its term is not in the
/// weights; merge it first.
TorchAttention export_attention(const MultiHeadAttention& m);
/// The cross-attention layer `m` as separate q, k, v, o projections (k, v read the memory).
TorchAttention export_attention(const CrossAttention& m);
/// Loads the projections `w` into the self-attention layer `m`, converted to its dtype. Every
/// shape (ShapeError) and bias presence (ValueError) is checked before the first write.
void import_attention(MultiHeadAttention& m, const TorchAttention& w);
/// Loads the projections `w` into the cross-attention layer `m`, checked as above.
void import_attention(CrossAttention& m, const TorchAttention& w);

/// Array-level form for self attention, e.g. for gradients: `W_QKV` [d, (H_q + 2 H_kv) d_h],
/// `b_QKV`, `W_O`, `b_O` with `H_q` query and `H_kv` key/value heads. Undefined biases stay
/// undefined. The widths must divide as described (ShapeError otherwise).
TorchAttention attention_to_torch(const Array& W_QKV, const Array& b_QKV, const Array& W_O, const Array& b_O,
                                  std::size_t H_q, std::size_t H_kv);
/// Array-level form for cross attention: `W_Q`, `b_Q`, `W_KV` [d_m, 2 H_kv d_h] (K and V
/// packed), `b_KV`, `W_O`, `b_O`; checked as above.
TorchAttention cross_to_torch(const Array& W_Q, const Array& b_Q, const Array& W_KV, const Array& b_KV,
                              const Array& W_O, const Array& b_O);

/// nn.MultiheadAttention(embed_dim, num_heads, bias, kdim, vdim) state, batch_first or not.
struct TorchMHA {
  Array in_proj_weight;   ///< [3 E, E] (undefined for cross attention with kdim != embed_dim)
  Array q_proj_weight;    ///< [E, E]    } defined instead of in_proj_weight when
  Array k_proj_weight;    ///< [E, kdim] } kdim != embed_dim (torch's
  Array v_proj_weight;    ///< [E, vdim] } _qkv_same_embed_dim == False)
  Array in_proj_bias;     ///< [3 E] (undefined without bias)
  Array out_proj_weight;  ///< [E, E]
  Array out_proj_bias;    ///< [E]
};

/// Self attention: requires MHA (H_kv == H_q) with d_head * H_q == d_model, and no adapter
/// attached (ValueError, as for export_attention()).
TorchMHA export_mha(const MultiHeadAttention& m);
/// Loads the PyTorch state `w` into the layer `m`, converted to its dtype (same
/// requirements; shapes and bias presence must match, ShapeError or ValueError otherwise).
/// Everything is checked before the first write: a failed import changes nothing.
void import_mha(MultiHeadAttention& m, const TorchMHA& w);
/// Cross attention `m` as nn.MultiheadAttention state (kdim = vdim = d_m): requires
/// H_kv == H_q, d_head * H_q == d_q and d_out == d_q.
TorchMHA export_mha(const CrossAttention& m);
/// Loads the nn.MultiheadAttention state `w` (packed in_proj_weight, or the separate q/k/v
/// weights when kdim != embed_dim) into the cross-attention layer `m`; checked before the
/// first write.
void import_mha(CrossAttention& m, const TorchMHA& w);

}  // namespace xg::nn::torch_layout
