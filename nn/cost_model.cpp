#include <xgrad/nn/cost_model.hpp>

#include <string>

#include <xgrad/core/error.hpp>

namespace xg::nn::cost {

Flops attention_flops(const AttentionShape& s) {
  if (s.H_q == 0 || s.H_kv == 0 || s.H_q % s.H_kv != 0)
    throw ValueError(op_message("cost", "H_q (" + std::to_string(s.H_q) + ") must be a multiple of H_kv (" +
                                            std::to_string(s.H_kv) + ")"));
  const std::uint64_t d_h = s.d_h ? s.d_h : s.d_model / s.H_q;
  Flops f;
  f.q_proj = 2 * s.B * s.T * s.d_model * (s.H_q * d_h);
  f.k_proj = 2 * s.B * s.S * s.d_model * (s.H_kv * d_h);
  f.v_proj = 2 * s.B * s.S * s.d_model * (s.H_kv * d_h);
  f.o_proj = 2 * s.B * s.T * (s.H_q * d_h) * s.d_model;
  f.scores = 2 * s.B * s.H_q * s.T * s.S * d_h;
  f.weighted_sum = 2 * s.B * s.H_q * s.T * s.S * d_h;
  return f;
}

std::uint64_t weight_matrix_bytes(std::uint64_t B, std::uint64_t H, std::uint64_t T, std::uint64_t S,
                                  std::uint64_t bytes_per_element) {
  return B * H * T * S * bytes_per_element;
}

std::uint64_t kv_cache_bytes(std::uint64_t batch, std::uint64_t S, std::uint64_t H_kv, std::uint64_t d_h,
                             std::uint64_t bytes_per_element) {
  return batch * 2 * S * H_kv * d_h * bytes_per_element;
}

std::uint64_t kv_projection_params(std::uint64_t d_model, std::uint64_t H_kv, std::uint64_t d_h) {
  return 2 * d_model * H_kv * d_h;
}

std::uint64_t attention_params(std::uint64_t d_model, std::uint64_t H_q, std::uint64_t H_kv, std::uint64_t d_h,
                               bool bias) {
  const std::uint64_t weights = d_model * H_q * d_h + kv_projection_params(d_model, H_kv, d_h) + H_q * d_h * d_model;
  const std::uint64_t biases = bias ? H_q * d_h + 2 * H_kv * d_h + d_model : 0;
  return weights + biases;
}

}  // namespace xg::nn::cost
