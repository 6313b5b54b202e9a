/// \file
/// Your own layers inside the built-in models: a registry of named sub-layer factories that
/// nn::GPT (arch gpt and llama) builds instead of its own when TransformerConfig names them
/// (docs/custom-layers.md, "Your layer inside GPT or Llama").
/// \verbatim
///   activation  the feed-forward nonlinearity: GELU in fc2(act(fc1 x)) (gpt), SiLU in
///               down(act(gate x) * up x) (llama). Parameter names and counts unchanged.
///   mlp         the whole feed-forward sub-layer "ffn": x [..., d] -> [..., d].
///   norm        every norm of the model: both norms of each block and the final norm.
///   attention   the attention core of every block's self-attention: what turns the heads
///               Q, K, V into O in place of scaled dot-product attention (nn::attention's
///               signature, nn::AttentionFn). The projections W_QKV and W_O, RoPE, the KV
///               cache and LoRA adapters stay the built-in layer's, so parameter names and
///               counts are unchanged and a model with it decodes through the cache.
/// \endverbatim
/// A program registers its layers once (before building or loading a model that uses them);
/// TransformerConfig::activation, TransformerConfig::mlp, TransformerConfig::norm and
/// TransformerConfig::attention name them (empty: the built-in layer). A model built with a
/// registered layer records the names in its checkpoint metadata (keys layer_activation,
/// layer_mlp, layer_norm, layer_attention): loading it where the name is not registered
/// is a FormatError naming the layer, never a model that computes something else.
/// The registry is global to the process and guarded by a mutex.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/nn/module.hpp>
#include <xgrad/nn/sdpa.hpp>

namespace xg::nn {

struct TransformerConfig;

/// A norm sub-layer: x [..., d] -> [..., d]. Registered norms derive from it.
class NormLayer : public Module {
 public:
  /// The normalised x, the shape of x.
  virtual Tensor operator()(const Tensor& x) const = 0;
};

/// A feed-forward sub-layer: x [..., d_model] -> [..., d_model]. Registered MLPs derive from it.
class MLPLayer : public Module {
 public:
  /// The sub-layer's output, the shape of x. `dropout_gen` is the block's dropout source
  /// (null outside training); the layer may ignore it.
  virtual Tensor operator()(const Tensor& x, Generator* dropout_gen) const = 0;
};

/// An elementwise activation (any function of a tensor that keeps its shape, on the tape).
using ActivationFn = std::function<Tensor(const Tensor&)>;
/// Builds a norm of width `width` for the model `resolved` (its dtype, norm_eps, ...).
using NormFactory = std::function<std::unique_ptr<NormLayer>(const TransformerConfig& resolved, std::size_t width)>;
/// Builds a feed-forward sub-layer for the model `resolved` (d_model, d_ff, dtype, layers,
/// dropout), drawing its initial weights from `init`.
using MLPFactory = std::function<std::unique_ptr<MLPLayer>(const TransformerConfig& resolved, Generator& init)>;

/// The kinds of registered layer.
enum class LayerKind {
  activation,  ///< An element-wise function in place of GELU (gpt) or SiLU (llama's gate).
  mlp,         ///< The whole feed-forward sub-layer.
  norm,        ///< Every norm of the model.
  attention,   ///< The attention core of every block's self-attention (nn::AttentionFn).
};
/// "activation", "mlp", "norm" or "attention".
std::string layer_kind_name(LayerKind k);

/// Registers `f` as the activation `name`. A name is 1..64 characters of [A-Za-z0-9_.-]; a
/// bad name, an empty function or a name already registered for this kind is a ValueError.
void register_activation(const std::string& name, ActivationFn f);
/// Registers the feed-forward factory `name` (rules of register_activation).
void register_mlp(const std::string& name, MLPFactory f);
/// Registers the norm factory `name` (rules of register_activation).
void register_norm(const std::string& name, NormFactory f);
/// Registers the attention core `name` (rules of register_activation). Inside a block it is
/// called with the heads after RoPE, the block's visibility (causal, the model's window and
/// ALiBi bias, a call's extra visibility; Visibility::bias gives it as an additive mask) and
/// SdpaOptions carrying the scale (unset: 1/sqrt(d_k)), dropout probability, training flag and
/// generator. It must return O [B, H_q, T, d_v] in Q's dtype (ShapeError / DTypeError naming it
/// otherwise). While decoding with the KV cache, K and V hold every cached position.
void register_attention(const std::string& name, AttentionFn f);
/// Removes the layer `name` of kind `k`; returns whether it was registered. Models already
/// built keep what they built.
bool unregister_layer(LayerKind k, const std::string& name);
/// Whether `name` is registered for kind `k`.
bool is_registered(LayerKind k, const std::string& name);
/// The names registered for kind `k`, sorted.
std::vector<std::string> registered_layers(LayerKind k);

/// The activation `name`; ValueError naming it and the registered ones when it is not.
ActivationFn make_activation(const std::string& name);
/// A new feed-forward sub-layer from the factory `name` (ValueError as for make_activation;
/// a factory returning null is a ValueError naming it).
std::unique_ptr<MLPLayer> make_mlp(const std::string& name, const TransformerConfig& resolved, Generator& init);
/// The attention core `name` (ValueError as for make_activation).
AttentionFn make_attention(const std::string& name);
/// A new norm of width `width` from the factory `name` (errors as for make_mlp).
std::unique_ptr<NormLayer> make_norm(const std::string& name, const TransformerConfig& resolved, std::size_t width);

/// ValueError naming the first layer `c` names that is not registered (activation, mlp, norm,
/// attention),
/// or naming both when `c` sets mlp and activation together (a registered MLP has its own).
void check_registered_layers(const TransformerConfig& c);

}  // namespace xg::nn
