/// \file
/// Attention cost model (SPEC 11): FLOPs by term (the projections: the text before (5.34);
/// the interactions: (5.34)), bytes of a materialised weight tensor (5.35), KV sharing (5.36),
/// cache size and parameter counts (the text after (5.36)). One multiply-add counts as 2
/// FLOPs; biases and elementwise work are not counted, as in the spec.
#pragma once

#include <cstdint>

/// The attention cost model: FLOPs, bytes and parameter counts (docs/attention.md).
namespace xg::nn::cost {

/// The sizes of one attention layer's computation.
struct AttentionShape {
  /// Batch, query length, key length. @{
  std::uint64_t B = 1, T = 1, S = 1;
  /// @}
  std::uint64_t d_model = 0;          ///< Input width d (d_q = d_m = d_out = d).
  /// Query heads, key/value heads. @{
  std::uint64_t H_q = 1, H_kv = 1;
  /// @}
  std::uint64_t d_h = 0;              ///< Head width (d_k = d_v = d_h); 0 means d_model / H_q.
};

/// FLOPs of one attention layer by term.
struct Flops {
  /// The Q, K, V and output projections, Q K^T (scores) and A V (weighted_sum). @{
  std::uint64_t q_proj = 0, k_proj = 0, v_proj = 0, o_proj = 0, scores = 0, weighted_sum = 0;
  /// @}
  /// The sum of all terms.
  std::uint64_t total() const { return q_proj + k_proj + v_proj + o_proj + scores + weighted_sum; }
};

/// FLOPs of the layer of shape `s`, generalised to GQA. Projections (the text before (5.34)):
/// Q projection 2 B T d (H_q d_h); K and V projections 2 B S d (H_kv d_h) each; output
/// 2 B T (H_q d_h) d. Interactions (5.34): QK^T 2 B H_q T S d_h; AV 2 B H_q T S d_h.
/// With H_kv = H_q and d_h = d / H these are the spec's 2BTd^2, 4BSd^2 (K+V), 2BTd^2,
/// 2BHTSd_k, 2BHTSd_v.
Flops attention_flops(const AttentionShape& s);

/// (5.35) bytes of an explicit weight tensor A: B H T S elements of `bytes_per_element` each.
std::uint64_t weight_matrix_bytes(std::uint64_t B, std::uint64_t H, std::uint64_t T, std::uint64_t S,
                                  std::uint64_t bytes_per_element);

/// KV cache of one layer (the text after (5.36)): 2 S H_kv d_h elements per sample, for
/// `batch` samples and `S` positions, of `bytes_per_element` each.
std::uint64_t kv_cache_bytes(std::uint64_t batch, std::uint64_t S, std::uint64_t H_kv, std::uint64_t d_h,
                             std::uint64_t bytes_per_element);

/// K and V projection parameters (the text after (5.36)): 2 d H_kv d_h (no bias), with
/// d = `d_model`.
std::uint64_t kv_projection_params(std::uint64_t d_model, std::uint64_t H_kv, std::uint64_t d_h);

/// All parameters of one attention layer of width `d_model` with `H_q` query heads, `H_kv`
/// key/value heads of width `d_h`: W_Q, W_K, W_V, W_O (and their biases if `bias`).
std::uint64_t attention_params(std::uint64_t d_model, std::uint64_t H_q, std::uint64_t H_kv, std::uint64_t d_h,
                               bool bias);

}  // namespace xg::nn::cost
