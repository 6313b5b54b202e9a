/// \file
/// Adapter: a trainable term that a projection adds to its output. A layer that computes
/// y = x W (+ b) computes y = x W (+ b) + adapter(x) while an adapter is attached to it
/// (Linear::set_adapter, MultiHeadAttention::set_adapter). LoRA (nn/lora.hpp) is one: the
/// low-rank term s (x A) B next to a frozen W. The hook exists because the built-in blocks
/// hold their projections by value (a Linear member, a packed W_QKV): an adapter attached
/// in place changes what the block computes without replacing the layer, and its parameters
/// appear among the layer's.
#pragma once

#include <cstddef>

#include <xgrad/nn/module.hpp>

namespace xg::nn {

/// Base of the terms attached to a projection x W. A subclass registers its own parameters;
/// the host registers the adapter as a child, so they appear among the host's parameters.
class Adapter : public Module {
 public:
  /// The term for the projection's input `x` [..., d_in()]: [..., d_out()], recorded on the
  /// tape like any layer's output.
  virtual Tensor operator()(const Tensor& x) const = 0;
  /// The same term as a weight: Delta [d_in(), d_out()] with x Delta = operator()(x) up to
  /// rounding, in the dtype of the adapter's parameters. Merging adds it to W.
  virtual Array weight_delta() const = 0;
  /// Input width d_in.
  virtual std::size_t d_in() const = 0;
  /// Output width d_out.
  virtual std::size_t d_out() const = 0;
  /// The whole adapted projection x W + b + operator()(x) for the host's weight `W`
  /// [d_in, d_out] and bias `b` (undefined: none); the host has checked x. This default
  /// composes it from recorded ops (the tape then keeps the term's intermediates); an adapter
  /// may override it with one op of its own (LoRA: nn::lora_affine).
  virtual Tensor project(const Tensor& x, const Tensor& W, const Tensor& b) const;
  /// A low-rank adapter's factors with its scale folded in: operator()(x) = (x A) B. Returns
  /// false (the default) for an adapter that is not low-rank; a host that packs several
  /// projections into one weight (attention's W_QKV) fuses adapters that have them into one op.
  virtual bool low_rank(Tensor& A, Tensor& B) const;
};

}  // namespace xg::nn
