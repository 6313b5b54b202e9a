/// \file
/// Scaled dot-product attention, the one attention core (SPEC 1-4, Algorithm 5.1, (5.36)).
/// Composed from the engine's ops (matmul, add_mask, softmax, dropout, where), so the tape
/// derives its backward; checks/attention_reference.hpp holds the closed-form backward of SPEC 9
/// that the tests compare with it.
///
/// \verbatim
///   Q [B, H_q, T, d_k], K [B, H_kv, S, d_k], V [B, H_kv, S, d_v]  ->  O [B, H_q, T, d_v]
///   U = Q K^T * scale (scale = 1/sqrt(d_k) by default), A = softmax(U + M), O = A V
/// \endverbatim
///
/// GQA/MQA (5.36): query head h reads kv head g(h) = floor(h / r), r = H_q / H_kv. It is
/// implemented by grouping query heads, not by repeating K and V: Q is viewed as
/// [B, H_kv, r*T, d_k] (heads g*r .. g*r+r-1 stacked along the rows), so each kv head is
/// read by one GEMM and its gradient is summed over its group by the matmul VJP.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/nn/visibility.hpp>

namespace xg::nn {

/// Which implementation computes attention (docs/performance.md).
enum class SdpaImpl { automatic, composed, fused };

/// \var SdpaImpl::automatic
/// fused where it is supported (not when the weights are requested), else composed.
/// \var SdpaImpl::composed
/// The chapter's composition of engine ops (matmul, add_mask, softmax, dropout); the tape
/// derives its backward. The reference the closed-form gradients check.
/// \var SdpaImpl::fused
/// One tiled op with its own VJP (nn/detail/flash_attention.hpp): never materialises the
/// [B, H, T, S] scores; forward keeps O and the per-row log-sum-exp, backward recomputes the
/// weights block by block.

/// What the fused path's tile products run on under bfloat16 mixed precision
/// (xg::set_matmul_dtype), and why: "AMX bfloat16 tiles (AMX tile products measured at 2.90x
/// float32)", "AVX512_BF16 dot products (AVX512_BF16 dot products measured at 1.45x float32)"
/// (no AMX), or "float32 (<why not>)" where they keep float32 inputs (neither, or measured
/// slower). Chosen once per process at the first call, or at the first fused attention under
/// bfloat16, by a short calibration; XGRAD_BF16_ATTENTION=auto|on|off|amx|dpbf16 (or
/// XGRAD_KERNELS=bf16_attention=...) forces it, another value
/// throws ValueError (docs/performance.md, "bfloat16 mixed precision"). The composed path's
/// products follow ops::matmul.
std::string bfloat16_attention_kernels();

/// Options of scaled_dot_product_attention().
struct SdpaOptions {
  std::optional<double> scale = std::nullopt;  ///< Score scale; default 1 / sqrt(d_k).
  /// Query validity b_i, [B, T], true = a real query. Empty = every query valid. Invalid
  /// queries output exact zero rows and send exact zero gradients (SPEC 3.8).
  BoolArray query_valid = {};
  /// Dropout on the weights (SPEC 2), only when training and dropout_p > 0. The mask drawn
  /// from `generator` is reused by the backward pass (it is the dropout op's saved mask).
  double dropout_p = 0.0;
  bool training = false;           ///< Training mode: dropout applies (see dropout_p).
  Generator* generator = nullptr;  ///< Dropout source, needed when training with dropout_p > 0.
  bool return_weights = false;  ///< Also return A (before dropout; invalid rows zero).
  /// Algorithm 5.1 step 1: non-finite Q, K or V is an error, as is a non-finite score. Costs a
  /// pass over the inputs and scores; set false to skip it when inputs are known finite.
  bool check_finite = true;
  SdpaImpl impl = SdpaImpl::automatic;  ///< Which implementation computes attention.
};

/// What scaled_dot_product_attention() returns.
struct SdpaResult {
  Tensor output;       ///< O [B, H_q, T, d_v].
  Tensor weights;      ///< A [B, H_q, T, S] if return_weights (composed path).
  Array dropout_mask;  ///< m / q [B, H_q, T, S] if dropout was applied (composed path).
  /// The seed the dropout mask was drawn from (both paths; 0 without dropout): the fused path
  /// never forms the mask, attention_dropout_mask(BHTS, p, seed, dtype) regenerates it.
  std::uint64_t dropout_seed = 0;
  /// The implementation that computed this result: SdpaImpl::composed or SdpaImpl::fused, never
  /// automatic (what automatic chose). Tests read it to prove which path ran.
  SdpaImpl path = SdpaImpl::composed;
};

/// Attention of queries `Q` over keys `K` and values `V` (shapes above) with the allowed sets
/// and soft biases of `visibility` (broadcast to [B, H_q, T, S]) and the options `opts`.
/// Shapes, dtypes, H_q % H_kv and (with check_finite) finiteness are checked first, with
/// errors naming the argument; a valid query that may see no key is a VisibilityError.
SdpaResult scaled_dot_product_attention(const Tensor& Q, const Tensor& K, const Tensor& V,
                                        const Visibility& visibility, const SdpaOptions& opts = {});

/// The output alone: scaled_dot_product_attention(Q, K, V, visibility, opts).output.
Tensor attention(const Tensor& Q, const Tensor& K, const Tensor& V, const Visibility& visibility,
                 const SdpaOptions& opts = {});

/// An attention core: a function of attention()'s signature, Q [B, H_q, T, d_k], K
/// [B, H_kv, S, d_k], V [B, H_kv, S, d_v], the visibility and options -> O [B, H_q, T, d_v], on
/// the tape. A program registers one by name (nn::register_attention, nn/layer_registry.hpp) to
/// put it in place of scaled dot-product attention inside GPT and Llama blocks.
using AttentionFn = std::function<Tensor(const Tensor& Q, const Tensor& K, const Tensor& V,
                                         const Visibility& visibility, const SdpaOptions& opts)>;

}  // namespace xg::nn
