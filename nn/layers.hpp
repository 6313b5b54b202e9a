// Basic layers: Linear, Embedding, LayerNorm, FeedForward (GELU). Weights in x out.
#pragma once

#include <xgrad/core/random.hpp>
#include <xgrad/nn/module.hpp>

namespace xg::nn {

// y = x W + b, W [d_in, d_out] normal(0, init_std), b [d_out] zeros.
class Linear : public Module {
 public:
  Linear(std::size_t d_in, std::size_t d_out, Generator& gen, bool bias = true, DType dtype = default_dtype(),
         double init_std = 0.02);
  // From given weights, no generator: W [d_in, d_out], b [d_out] or undefined (no bias), one
  // float dtype (ShapeError / DTypeError otherwise). The arrays are copied.
  explicit Linear(const Array& W, const Array& b = Array());
  Tensor operator()(const Tensor& x) const;  // [..., d_in] -> [..., d_out]
  Tensor W, b;  // b undefined without bias
};

// Lookup table [V_vocab, d], normal(0, init_std).
class Embedding : public Module {
 public:
  Embedding(std::size_t V_vocab, std::size_t d, Generator& gen, DType dtype = default_dtype(), double init_std = 0.02);
  // From a given table [V_vocab, d] (copied).
  explicit Embedding(const Array& weight);
  Tensor operator()(const IndexArray& ids) const;  // ids [...] -> [..., d]
  Tensor weight;
};

// Layer norm over the last axis with affine gamma (ones) and beta (zeros).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(std::size_t d, DType dtype = default_dtype(), double eps = 1e-5);
  // From given gamma and beta, both [d] and of one dtype (copied).
  LayerNorm(const Array& gamma, const Array& beta, double eps = 1e-5);
  Tensor operator()(const Tensor& x) const;
  Tensor gamma, beta;

 private:
  double eps_;
};

// Position-wise feed-forward: fc2(dropout(gelu(fc1(x)))), d -> d_ff -> d (SPEC-free, GPT-2 style).
class FeedForward : public Module {
 public:
  FeedForward(std::size_t d, std::size_t d_ff, Generator& gen, double dropout = 0.0, DType dtype = default_dtype(),
              double out_init_std = 0.02);
  // From given weights: W1 [d, d_ff], b1 [d_ff], W2 [d_ff, d], b2 [d] (biases may be
  // undefined), one dtype (copied).
  FeedForward(const Array& W1, const Array& b1, const Array& W2, const Array& b2, double dropout = 0.0);
  Tensor operator()(const Tensor& x, Generator* dropout_gen = nullptr) const;
  Linear fc1, fc2;

 private:
  double dropout_;
};

}  // namespace xg::nn
