#include <xgrad/nn/layers.hpp>

#include <xgrad/core/error.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/index.hpp>
#include <xgrad/ops/layer_norm.hpp>
#include <xgrad/ops/matmul.hpp>
#include <xgrad/ops/unary.hpp>

namespace xg::nn {

Linear::Linear(std::size_t d_in, std::size_t d_out, Generator& gen, bool bias, DType dtype, double init_std) {
  if (d_in == 0 || d_out == 0) throw ValueError(op_message("linear", "d_in and d_out must be positive"));
  W = register_parameter("W", random_normal({d_in, d_out}, gen, dtype, 0.0, init_std));
  if (bias) b = register_parameter("b", Array::zeros({d_out}, dtype));
}

Tensor Linear::operator()(const Tensor& x) const {
  if (!x.defined() || x.ndim() == 0 || x.shape().back() != W.shape()[0])
    throw ShapeError(op_message("linear", "x must be [..., " + std::to_string(W.shape()[0]) + "], has shape " +
                                              (x.defined() ? shape_str(x.shape()) : "undefined")));
  const Tensor y = ops::matmul(x, W);
  return b.defined() ? y + b : y;
}

Embedding::Embedding(std::size_t V_vocab, std::size_t d, Generator& gen, DType dtype, double init_std) {
  if (V_vocab == 0 || d == 0) throw ValueError(op_message("embedding", "V_vocab and d must be positive"));
  weight = register_parameter("weight", random_normal({V_vocab, d}, gen, dtype, 0.0, init_std));
}

Tensor Embedding::operator()(const IndexArray& ids) const { return ops::embedding(weight, ids); }

LayerNorm::LayerNorm(std::size_t d, DType dtype, double eps) : eps_(eps) {
  gamma = register_parameter("gamma", Array::full({d}, 1.0, dtype));
  beta = register_parameter("beta", Array::zeros({d}, dtype));
}

Tensor LayerNorm::operator()(const Tensor& x) const { return ops::layer_norm(x, gamma, beta, eps_); }

FeedForward::FeedForward(std::size_t d, std::size_t d_ff, Generator& gen, double dropout, DType dtype,
                         double out_init_std)
    : fc1(d, d_ff, gen, true, dtype), fc2(d_ff, d, gen, true, dtype, out_init_std), dropout_(dropout) {
  register_module("fc1", fc1);
  register_module("fc2", fc2);
}

Tensor FeedForward::operator()(const Tensor& x, Generator* dropout_gen) const {
  Tensor h = ops::gelu(fc1(x));
  if (training() && dropout_ > 0) {
    if (!dropout_gen) throw ValueError(op_message("feed_forward", "dropout in training needs a generator"));
    h = ops::dropout(h, dropout_, *dropout_gen, true);
  }
  return fc2(h);
}

}  // namespace xg::nn
