/// \file
/// LoRA, low-rank adaptation (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
/// Models"; the same definition as Hugging Face peft): a frozen weight W plus a trainable
/// low-rank update,
/// \verbatim
///   y = x W + b + s (x A) B,    A [d_in, r],  B [r, d_out],  s = alpha / r
/// \endverbatim
/// in xgrad's in x out layout: W [d_in, d_out] here is the transpose of PyTorch's weight, and
/// A and B are the transposes of peft's lora_A.weight [r, d_in] and lora_B.weight [d_out, r]
/// (so y = x W^T + s (x A^T) B^T in PyTorch's terms). A starts kaiming-uniform as peft draws
/// it (uniform on +-1/sqrt(d_in)), B starts at zero: an adapted model starts equal to its base
/// model, bit for bit.
///
/// Written over the public API only (Module, ops, nn::Adapter), like a user's custom layer
/// (docs/custom-layers.md). Three pieces:
/// - LoRA: the low-rank term, an nn::Adapter that attaches to a Linear or an attention
///   projection in place (parameters `<layer>.lora_A`, `<layer>.lora_B`);
/// - LoRALinear: a drop-in layer, a frozen Linear's weights plus a LoRA;
/// - add_lora() / merge_lora(): adapters on the q, k, v, o and feed-forward projections of
///   every block of a GPT or Llama model, and folding them back into plain weights.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/nn/adapter.hpp>
#include <xgrad/nn/layers.hpp>
#include <xgrad/nn/transformer.hpp>

namespace xg::nn {

/// The adapted projection y = x W + b + s (x A) B as one recorded op, for x [..., d_in],
/// W [d_in, d_out], b [d_out] or undefined, A [d_in, r], B [r, d_out]. Its tape entry holds
/// only its inputs (x, W, b, A, B) and output: the backward pass recomputes x A [..., r] from
/// x instead of keeping it, and skips the products for inputs that want no gradient (a frozen
/// W costs no x^T g). Cotangents, with g the output's:
/// \verbatim
///   dx = g W^T + s (g B^T) A^T    dW = x^T g    db = sum over rows of g
///   dA = s x^T (g B^T)            dB = s (x A)^T g
/// \endverbatim
/// The composition of matmuls it replaces is its second-order rule and its test oracle
/// (tests/nn/test_lora.cpp). ShapeError / DTypeError for operands that do not fit.
Tensor lora_affine(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& A, const Tensor& B, double s);

/// The sizes of a LoRA adapter.
struct LoRAConfig {
  /// Rank r of the update: positive and at most min(d_in, d_out) of the layer (ValueError).
  std::size_t rank = 8;
  /// The scale is alpha / rank (peft's lora_alpha); positive and finite (ValueError).
  double alpha = 16.0;
  /// add_lora(): whether every parameter of the model that is not an adapter's is frozen
  /// (peft's default: only the adapters train).
  bool freeze_base = true;
};

/// The low-rank term s (x A) B with A [d_in, r] (parameter `lora_A`, kaiming-uniform: uniform
/// on +-1/sqrt(d_in)) and B [r, d_out] (`lora_B`, zeros), s = alpha / r. Attached to a Linear
/// (Linear::set_adapter) or an attention projection (MultiHeadAttention::set_adapter) it
/// adds its term to that projection; on its own it is an ordinary layer.
class LoRA : public Adapter {
 public:
  /// A term for a projection `d_in` -> `d_out` with the rank and alpha of `cfg`, A drawn from
  /// `gen`, in `dtype`. `layer` names the projection in errors: a rank of 0 or above
  /// min(d_in, d_out), or an alpha that is not positive and finite, is a ValueError naming it
  /// and the values.
  LoRA(std::size_t d_in, std::size_t d_out, const LoRAConfig& cfg, Generator& gen, DType dtype = default_dtype(),
       const std::string& layer = "lora");
  /// s (x A) B for x [..., d_in] -> [..., d_out] (ShapeError / DTypeError for another width or
  /// dtype). The scale multiplies the narrow [..., r] intermediate.
  Tensor operator()(const Tensor& x) const override;
  /// s A B [d_in, d_out]: what merging adds to W.
  Array weight_delta() const override;
  /// x W + b + s (x A) B as one op (lora_affine): what a Linear or attention projection with
  /// this adapter computes.
  Tensor project(const Tensor& x, const Tensor& W, const Tensor& b) const override;
  /// A s and B (the scale folded into A, a recorded op on the small factor).
  bool low_rank(Tensor& A, Tensor& B) const override;
  std::size_t d_in() const override { return d_in_; }    ///< Input width.
  std::size_t d_out() const override { return d_out_; }  ///< Output width.
  std::size_t rank() const { return rank_; }              ///< The rank r.
  double alpha() const { return alpha_; }                 ///< alpha.
  double scale() const { return alpha_ / static_cast<double>(rank_); }  ///< s = alpha / r.

  /// The factors: lora_A [d_in, r] and lora_B [r, d_out]. @{
  Tensor lora_A, lora_B;
  /// @}

 private:
  std::size_t d_in_, d_out_, rank_;
  double alpha_;
};

/// A Linear with a LoRA: y = x W + b + s (x A) B with W and b frozen. Its parameters are
/// `W`, `b` (frozen; sharing the arrays of the layer it was made from, no copy) and `lora_A`,
/// `lora_B` (trainable), so a checkpoint tells the adapter's tensors from the base's.
class LoRALinear : public Module {
 public:
  /// Adapts the weights of `base` (W, and b when it has one) with a LoRA of `cfg` drawn from
  /// `gen`. `base` itself is left as it was (and need not outlive this layer).
  LoRALinear(const Linear& base, const LoRAConfig& cfg, Generator& gen);
  /// Adapts given weights: `W` [d_in, d_out] and `b` [d_out] or undefined (checked as
  /// Linear's constructor from weights checks them).
  LoRALinear(const Array& W, const Array& b, const LoRAConfig& cfg, Generator& gen);
  /// x [..., d_in] -> x W + s (x A) B + b, [..., d_out].
  Tensor operator()(const Tensor& x) const;
  /// W + s A B [d_in, d_out]: the weight of the plain layer that computes what this one does
  /// (to rounding).
  Array merged_weight() const;
  /// A plain Linear with merged_weight() and a copy of b: the adapter folded in.
  std::unique_ptr<Linear> merged() const;

  /// The frozen weight W [d_in, d_out] and bias b [d_out] (undefined without one). @{
  Tensor W, b;
  /// @}
  LoRA lora;  ///< The low-rank term; its parameters appear as `lora_A` and `lora_B`.
};

/// The projections add_lora() can adapt in a block, by name: "q", "k", "v", "o" (attention,
/// both architectures); "gate", "up", "down" (Llama's SwiGLU feed-forward); "fc1", "fc2" (the
/// GPT-2 feed-forward). Groups: "attn" = q,k,v,o; "mlp" = the architecture's feed-forward
/// projections; "all" = attn and mlp.
///
/// The names that `targets` (comma-separated names and groups, e.g. "q,v" or "attn,down")
/// selects in a model of architecture `arch`, in block order (q, k, v, o, then the
/// feed-forward's), each once. An empty list, an unknown name, or a name that is no layer of
/// that architecture (e.g. "gate" in a GPT-2 model) is a ValueError naming it and the valid
/// names.
std::vector<std::string> lora_targets(const std::string& targets, Architecture arch);

/// Attaches a LoRA of `cfg` (A drawn from `gen`, block by block in target order) to the
/// projections `targets` (lora_targets()) of every block of `model`; returns how many it
/// attached (blocks x targets). With cfg.freeze_base every other parameter of the model is
/// frozen. The adapters' parameters are named `blocks.L.attn.q.lora_A`, ...,
/// `blocks.L.ffn.gate.lora_A`, ... A projection that has an adapter already, or a rank that
/// does not fit a projection, is a ValueError naming it; nothing is attached then.
std::size_t add_lora(GPT& model, const std::string& targets, const LoRAConfig& cfg, Generator& gen);

/// How many projections of `model` have an adapter attached.
std::size_t count_adapters(const GPT& model);

/// Folds every adapter of `model` into its weight (Linear::merge_adapter,
/// MultiHeadAttention::merge_adapter) and returns how many; the model then has the
/// parameters of its base architecture again (a plain checkpoint) and computes what the
/// adapted model computed, to rounding. Which parameters are frozen is left as it was (with
/// add_lora's freeze_base: all of them). ValueError if the model has no adapter.
std::size_t merge_lora(GPT& model);

}  // namespace xg::nn
