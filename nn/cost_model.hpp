// Attention cost model (SPEC 11): FLOPs by term (5.34), bytes of a materialised weight
// tensor (5.35), KV sharing, cache size and parameter counts (5.36). One multiply-add counts
// as 2 FLOPs; biases and elementwise work are not counted, as in the spec.
#pragma once

#include <cstdint>

namespace xg::nn::cost {

struct AttentionShape {
  std::uint64_t B = 1, T = 1, S = 1;  // batch, query length, key length
  std::uint64_t d_model = 0;          // input width d (d_q = d_m = d_out = d)
  std::uint64_t H_q = 1, H_kv = 1;    // query heads, key/value heads
  std::uint64_t d_h = 0;              // head width (d_k = d_v = d_h); 0 means d_model / H_q
};

struct Flops {
  std::uint64_t q_proj = 0, k_proj = 0, v_proj = 0, o_proj = 0, scores = 0, weighted_sum = 0;
  std::uint64_t total() const { return q_proj + k_proj + v_proj + o_proj + scores + weighted_sum; }
};

// (5.34), generalised to GQA: Q projection 2 B T d (H_q d_h); K and V projections
// 2 B S d (H_kv d_h) each; output 2 B T (H_q d_h) d; QK^T 2 B H_q T S d_h; AV 2 B H_q T S d_h.
// With H_kv = H_q and d_h = d / H these are the spec's 2BTd^2, 4BSd^2 (K+V), 2BTd^2,
// 2BHTSd_k, 2BHTSd_v.
Flops attention_flops(const AttentionShape& s);

// (5.35) bytes of an explicit weight tensor A: B H T S elements.
std::uint64_t weight_matrix_bytes(std::uint64_t B, std::uint64_t H, std::uint64_t T, std::uint64_t S,
                                  std::uint64_t bytes_per_element);

// (5.36) KV cache of one layer: 2 S H_kv d_h elements per sample.
std::uint64_t kv_cache_bytes(std::uint64_t batch, std::uint64_t S, std::uint64_t H_kv, std::uint64_t d_h,
                             std::uint64_t bytes_per_element);

// (5.36) K and V projection parameters: 2 d H_kv d_h (no bias).
std::uint64_t kv_projection_params(std::uint64_t d_model, std::uint64_t H_kv, std::uint64_t d_h);

// All parameters of one attention layer: W_Q, W_K, W_V, W_O (and biases if bias).
std::uint64_t attention_params(std::uint64_t d_model, std::uint64_t H_q, std::uint64_t H_kv, std::uint64_t d_h,
                               bool bias);

}  // namespace xg::nn::cost
