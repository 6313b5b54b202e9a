/// \file
/// The built-in checks of `xgrad gradcheck` (docs/gradcheck.md): every op, the attention core
/// (masks, GQA, MQA, invalid rows, dropout), the layers and models, the spec's closed-form
/// attention gradients (SPEC 9) against the tape, and the spec's invariants (SPEC 3, 5, 9, 11, 12).
///
/// The attention checks take the attention core as an argument, so the same gradient,
/// reference and invariant checks run against any implementation with nn::attention's
/// signature: yours, or a deliberately broken one in the suite's own tests.
#pragma once

#include <functional>
#include <string>

#include <xgrad/checks/suite.hpp>
#include <xgrad/nn/sdpa.hpp>
#include <xgrad/nn/visibility.hpp>

/// The built-in checks of `xgrad gradcheck`: functions that register them in a GradcheckSuite.
namespace xg::checks {

/// The default set: every group below; the attention checks run against nn::attention
/// ("attention/...") and against its composed implementation ("attention-composed/...").
void register_builtin_checks(GradcheckSuite& suite);

/// "ops/...": a gradient check of every op against central differences (checks/op_checks.cpp).
void register_op_checks(GradcheckSuite& suite);
/// The attention layers: MHA, GQA, MQA and cross-attention ("layers/..."), with dropout and
/// permutation, against their closed forms ("reference/...-layer"), and the KV cache
/// (checks/layer_checks.cpp).
void register_attention_layer_checks(GradcheckSuite& suite);
/// Linear, embedding, layer norm, feed-forward and the transformer blocks ("layers/..."); the
/// GPT and encoder-decoder losses and KV caches ("models/...") (checks/model_checks.cpp).
void register_model_checks(GradcheckSuite& suite);
/// Sliding-window attention (gradients and a reference) and the GPT's windowed KV cache
/// (checks/window_checks.cpp).
void register_window_checks(GradcheckSuite& suite);
/// "positions/...": RoPE in both layouts, attention layers with RoPE and ALiBi, and a KV cache
/// with them (checks/position_checks.cpp).
void register_position_checks(GradcheckSuite& suite);

/// An attention core under test: Q [B, H_q, T, d_k], K [B, H_kv, S, d_k], V [B, H_kv, S, d_v]
/// -> O [B, H_q, T, d_v], with query head h reading kv head floor(h / (H_q / H_kv)) (5.36).
/// It must honour vis, opts.scale and opts.query_valid; dropout is not asked of it.
using AttentionFn = std::function<Tensor(const Tensor& Q, const Tensor& K, const Tensor& V,
                                         const nn::Visibility& vis, const nn::SdpaOptions& opts)>;

/// "<prefix>/grad-...": the tape against central differences on masks (none, causal, causal
/// suffix, random per head, soft bias, documents, key padding), GQA, MQA, invalid rows,
/// cross shapes, and a larger case in random-projection mode. checks/attention_checks.cpp.
void register_attention_gradient_checks(GradcheckSuite& suite, const std::string& prefix, AttentionFn attn);
/// "<prefix>/reference-closed-form": output and Q, K, V gradients of random configurations
/// against SPEC 9's closed form (checks/attention_reference.hpp), 1e-10 in float64.
void register_attention_reference_checks(GradcheckSuite& suite, const std::string& prefix, AttentionFn attn);
/// "<prefix>/invariant-...": score-gradient rows sum to zero, forbidden positions and invalid
/// rows get exactly zero gradient, a row with one visible key, equal values, prefix
/// isolation, permutation equivariance, the GQA head mapping. checks/invariant_checks.cpp.
void register_attention_invariant_checks(GradcheckSuite& suite, const std::string& prefix, AttentionFn attn);

/// nn::scaled_dot_product_attention with dropout on the weights: a gradient check with a fixed
/// mask and the closed form with the forward pass's m / q ("attention/...-dropout").
void register_attention_dropout_checks(GradcheckSuite& suite);

/// nn::attention as an AttentionFn, with the options' implementation (automatic by default).
AttentionFn library_attention();
/// nn::attention forced onto one implementation (nn/sdpa.hpp SdpaImpl).
AttentionFn attention_with(nn::SdpaImpl impl);
/// The fused path against the composed path on every visibility kind, with dropout.
void register_attention_implementation_checks(GradcheckSuite& suite);

}  // namespace xg::checks
