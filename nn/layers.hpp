/// \file
/// Basic layers: Linear, Embedding, LayerNorm, RMSNorm, FeedForward (GELU), SwiGLUFeedForward
/// (Llama). Weights in x out.
#pragma once

#include <functional>
#include <memory>

#include <xgrad/core/random.hpp>
#include <xgrad/nn/adapter.hpp>
#include <xgrad/nn/module.hpp>

namespace xg::nn {

/// y = x W + b, W [d_in, d_out] normal(0, init_std), b [d_out] zeros; with an attached
/// adapter (nn/adapter.hpp, e.g. LoRA) y = x W + adapter(x) + b.
class Linear : public Module {
 public:
  /// A layer from `d_in` to `d_out` features (both positive; ValueError otherwise) with W
  /// drawn from `gen` with standard deviation `init_std`, a bias if `bias`, in `dtype`.
  Linear(std::size_t d_in, std::size_t d_out, Generator& gen, bool bias = true, DType dtype = default_dtype(),
         double init_std = 0.02);
  /// From given weights, no generator: `W` [d_in, d_out], `b` [d_out] or undefined (no bias),
  /// one float dtype (ShapeError / DTypeError otherwise). The arrays are copied.
  explicit Linear(const Array& W, const Array& b = Array());
  /// x [..., d_in] -> [..., d_out].
  Tensor operator()(const Tensor& x) const;
  /// x W (plus the adapter's term when one is attached) without the bias, with operator()'s
  /// checks: for fused ops that add the bias themselves.
  Tensor product(const Tensor& x) const;

  /// Attaches `adapter`: the layer then computes x W + adapter(x) + b, and the adapter's
  /// parameters appear among the layer's under their own names (a LoRA's as
  /// `<layer>.lora_A`, `<layer>.lora_B`). A null adapter or a second one is a ValueError, an
  /// adapter whose widths are not W's a ShapeError, one whose parameters are of another dtype a
  /// DTypeError.
  void set_adapter(std::unique_ptr<Adapter> adapter);
  /// The attached adapter, or null.
  Adapter* adapter() const { return adapter_.get(); }
  /// Detaches the adapter and returns it (null if none): the layer computes x W + b again.
  std::unique_ptr<Adapter> remove_adapter();
  /// Folds the adapter into the weight, W = W + adapter()->weight_delta(), and removes it: the
  /// layer is a plain Linear again that computes what it computed with the adapter (to
  /// rounding). W keeps its requires_grad. ValueError if no adapter is attached.
  void merge_adapter();

  /// Parameters: W [d_in, d_out] and b [d_out] (b undefined without bias). @{
  Tensor W, b;
  /// @}

 private:
  std::unique_ptr<Adapter> adapter_;
};

/// Lookup table [V_vocab, d], normal(0, init_std).
class Embedding : public Module {
 public:
  /// A table of `V_vocab` rows of width `d` drawn from `gen` with standard deviation
  /// `init_std`, in `dtype`.
  Embedding(std::size_t V_vocab, std::size_t d, Generator& gen, DType dtype = default_dtype(), double init_std = 0.02);
  /// From a given table `weight` [V_vocab, d] (copied).
  explicit Embedding(const Array& weight);
  /// ids [...] -> [..., d]: the rows named by `ids`.
  Tensor operator()(const IndexArray& ids) const;
  Tensor weight;  ///< The table [V_vocab, d].
};

/// Layer norm over the last axis with affine gamma (ones) and beta (zeros).
class LayerNorm : public Module {
 public:
  /// Normalises `d` features with `eps` added to the variance; parameters in `dtype`. Without
  /// `bias`, no shift: beta is undefined (gamma x-hat, nanoGPT's LayerNorm with bias=False).
  explicit LayerNorm(std::size_t d, DType dtype = default_dtype(), double eps = kDefaultEps, bool bias = true);
  /// From given `gamma` and `beta`, both [d] and of one dtype (copied), with `eps` added to
  /// the variance.
  LayerNorm(const Array& gamma, const Array& beta, double eps = kDefaultEps);
  /// The eps of a LayerNorm made without one (PyTorch's and GPT-2's 1e-5).
  static constexpr double kDefaultEps = 1e-5;
  /// ops::layer_norm(x, gamma, beta, eps) over x's last axis, of width d.
  Tensor operator()(const Tensor& x) const;
  /// Parameters: gain gamma [d] (initially ones) and shift beta [d] (initially zeros; undefined
  /// without bias). @{
  Tensor gamma, beta;
  /// @}

 private:
  double eps_;
};

/// RMS norm over the last axis with a gain `weight` (ones): ops::rms_norm, Llama's RMSNorm.
class RMSNorm : public Module {
 public:
  /// Normalises `d` features (positive; ValueError otherwise) with `eps` (positive and
  /// finite; ValueError otherwise) added to the mean square; the weight in `dtype`.
  explicit RMSNorm(std::size_t d, DType dtype = default_dtype(), double eps = 1e-5);
  /// ops::rms_norm(x, weight, eps) over x's last axis, of width d.
  Tensor operator()(const Tensor& x) const;
  /// The eps added to the mean square.
  double eps() const { return eps_; }
  Tensor weight;  ///< Gain [d] (initially ones).

 private:
  double eps_;
};

/// Position-wise feed-forward: fc2(dropout(gelu(fc1(x)))), d -> d_ff -> d (SPEC-free, GPT-2 style).
class FeedForward : public Module {
 public:
  /// Widths `d` -> `d_ff` -> `d`, weights from `gen` (fc2's with standard deviation
  /// `out_init_std`), dropout probability `dropout` after the GELU in training mode, in `dtype`;
  /// fc1 and fc2 with biases if `bias`.
  FeedForward(std::size_t d, std::size_t d_ff, Generator& gen, double dropout = 0.0, DType dtype = default_dtype(),
              double out_init_std = 0.02, bool bias = true);
  /// From given weights: `W1` [d, d_ff], `b1` [d_ff], `W2` [d_ff, d], `b2` [d] (biases may
  /// be undefined), one dtype (copied); dropout probability `dropout` as above.
  FeedForward(const Array& W1, const Array& b1, const Array& W2, const Array& b2, double dropout = 0.0);
  /// x [..., d] -> [..., d]. `dropout_gen` is needed when training with dropout > 0
  /// (ValueError otherwise).
  Tensor operator()(const Tensor& x, Generator* dropout_gen = nullptr) const;
  /// residual + (*this)(x, dropout_gen) (a residual connection around the layer, `residual` of
  /// x's shape), fc2's bias and the residual added in the same op as fc2's product
  /// (ops::linear) when fc2 has a bias and no adapter: the same bits as the sum of the two.
  Tensor with_residual(const Tensor& x, const Tensor& residual, Generator* dropout_gen = nullptr) const;
  /// The two linear layers, d -> d_ff and d_ff -> d. @{
  Linear fc1, fc2;
  /// @}
  /// The nonlinearity between them: empty is GELU; otherwise fc2(activation(fc1(x))), which must
  /// keep the shape (ShapeError otherwise). A registered activation (nn/layer_registry.hpp).
  std::function<Tensor(const Tensor&)> activation;

 private:
  Tensor hidden(const Tensor& x, Generator* dropout_gen) const;  // the activation of fc1, dropout applied
  double dropout_;
};

/// Llama's SwiGLU feed-forward, no biases: down(swiglu(gate(x), up(x))) with
/// swiglu(a, b) = silu(a) * b (ops::swiglu), d -> d_ff -> d. In llama2.c's names: gate is w1,
/// up is w3 and down is w2 (Hugging Face: gate_proj, up_proj, down_proj); xgrad stores each
/// W in x out, the transpose of their out x in.
class SwiGLUFeedForward : public Module {
 public:
  /// Widths `d` -> `d_ff` -> `d` (positive), gate and up drawn from `gen` with standard
  /// deviation 0.02, down with `down_init_std`, in `dtype`.
  SwiGLUFeedForward(std::size_t d, std::size_t d_ff, Generator& gen, DType dtype = default_dtype(),
                    double down_init_std = 0.02);
  /// x [..., d] -> [..., d].
  Tensor operator()(const Tensor& x) const;
  /// The three bias-free projections: gate (w1) and up (w3) [d, d_ff], down (w2) [d_ff, d]. @{
  Linear gate, up, down;
  /// @}
  /// The gate's nonlinearity: empty is SiLU (ops::swiglu); otherwise
  /// down(activation(gate(x)) * up(x)), the activation keeping the shape (ShapeError otherwise).
  std::function<Tensor(const Tensor&)> activation;
};

}  // namespace xg::nn
