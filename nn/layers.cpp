#include <xgrad/nn/layers.hpp>

#include <cmath>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/nn/detail/adapter_check.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/index.hpp>
#include <xgrad/ops/layer_norm.hpp>
#include <xgrad/ops/matmul.hpp>
#include <xgrad/ops/rms_norm.hpp>
#include <xgrad/ops/unary.hpp>

namespace xg::nn {

namespace {

// A given weight array: defined, float, of `rank` dimensions; its dtype must match `dtype`
// when that is set (the first array of a layer sets it).
void check_weight(const std::string& op, const std::string& name, const Array& a, std::size_t rank,
                  const Array* same_dtype_as = nullptr, const std::string& other = "") {
  if (!a.defined()) throw ValueError(op_message(op, name + " is an undefined Array"));
  if (a.ndim() != rank)
    throw ShapeError(op_message(op, name + " must have " + std::to_string(rank) + " dimension" + (rank == 1 ? "" : "s") +
                                        ", has shape " + shape_str(a.shape())));
  if (same_dtype_as && a.dtype() != same_dtype_as->dtype())
    throw DTypeError(op_message(op, name + " is " + dtype_name(a.dtype()) + ", " + other + " is " +
                                        dtype_name(same_dtype_as->dtype()) + ": one dtype per layer"));
}

void check_input_dtype(const std::string& op, const Tensor& x, const Tensor& param, const std::string& param_name) {
  if (x.defined() && x.dtype() != param.dtype())
    throw DTypeError(op_message(op, "input x is " + std::string(dtype_name(x.dtype())) + ", the layer's " + param_name +
                                        " is " + dtype_name(param.dtype()) +
                                        "; convert one of them (Array::astype) so both are the same dtype"));
}

// A Linear layer's input x [..., d_in] against its W [d_in, d_out].
void check_linear_input(const Tensor& x, const Tensor& W) {
  if (!x.defined() || x.ndim() == 0 || x.shape().back() != W.shape()[0])
    throw ShapeError(op_message("linear", "x must be [..., " + std::to_string(W.shape()[0]) + "], has shape " +
                                              (x.defined() ? shape_str(x.shape()) : "undefined")));
  check_input_dtype("linear", x, W, "W");
}

}  // namespace

Linear::Linear(std::size_t d_in, std::size_t d_out, Generator& gen, bool bias, DType dtype, double init_std) {
  if (d_in == 0 || d_out == 0) throw ValueError(op_message("linear", "d_in and d_out must be positive"));
  W = register_parameter("W", random_normal({d_in, d_out}, gen, dtype, 0.0, init_std));
  if (bias) b = register_parameter("b", Array::zeros({d_out}, dtype));
}

Linear::Linear(const Array& W_, const Array& b_) {
  check_weight("linear", "W", W_, 2);
  if (W_.shape()[0] == 0 || W_.shape()[1] == 0) throw ValueError(op_message("linear", "W must not be empty, has shape " + shape_str(W_.shape())));
  if (b_.defined()) {
    check_weight("linear", "b", b_, 1, &W_, "W");
    if (b_.shape()[0] != W_.shape()[1])
      throw ShapeError(op_message("linear", "b has shape " + shape_str(b_.shape()) + ", W " + shape_str(W_.shape()) +
                                                " needs b of shape (" + std::to_string(W_.shape()[1]) + ")"));
  }
  W = register_parameter("W", W_.clone());
  if (b_.defined()) b = register_parameter("b", b_.clone());
}

Tensor Linear::operator()(const Tensor& x) const {
  if (adapter_) {  // the adapter computes the whole projection (one op for LoRA)
    if (!x.defined() || x.ndim() == 0 || x.shape().back() != W.shape()[0])
      throw ShapeError(op_message("linear", "x must be [..., " + std::to_string(W.shape()[0]) + "], has shape " +
                                                (x.defined() ? shape_str(x.shape()) : "undefined")));
    check_input_dtype("linear", x, W, "W");
    return adapter_->project(x, W, b);
  }
  if (!b.defined()) return product(x);
  check_linear_input(x, W);
  return ops::linear(x, W, b);  // x W + b as one op (the bits of matmul then add)
}

Tensor Linear::product(const Tensor& x) const {
  check_linear_input(x, W);
  const Tensor y = ops::matmul(x, W);
  return adapter_ ? y + (*adapter_)(x) : y;
}

Tensor Adapter::project(const Tensor& x, const Tensor& W, const Tensor& b) const {
  const Tensor y = ops::matmul(x, W) + (*this)(x);
  return b.defined() ? y + b : y;
}

bool Adapter::low_rank(Tensor&, Tensor&) const { return false; }

void detail::check_adapter(const std::string& op, const std::string& where, const Adapter* adapter, std::size_t d_in,
                   std::size_t d_out, DType dtype) {
  if (!adapter) throw ValueError(op_message(op, "set_adapter: the adapter for " + where + " is null"));
  if (adapter->d_in() != d_in || adapter->d_out() != d_out)
    throw ShapeError(op_message(op, "set_adapter: the adapter maps " + std::to_string(adapter->d_in()) + " -> " +
                                        std::to_string(adapter->d_out()) + " features, " + where + " maps " +
                                        std::to_string(d_in) + " -> " + std::to_string(d_out)));
  for (const auto& [name, p] : adapter->named_parameters())
    if (p.dtype() != dtype)
      throw DTypeError(op_message(op, "set_adapter: the adapter's " + name + " is " + dtype_name(p.dtype()) + ", " +
                                          where + " is " + dtype_name(dtype)));
}

void Linear::set_adapter(std::unique_ptr<Adapter> adapter) {
  if (adapter_)
    throw ValueError(op_message("linear", "set_adapter: the layer has an adapter already; merge or remove it first"));
  detail::check_adapter("linear", "the layer", adapter.get(), W.shape()[0], W.shape()[1], W.dtype());
  register_module("", *adapter);
  adapter_ = std::move(adapter);
}

std::unique_ptr<Adapter> Linear::remove_adapter() {
  if (adapter_) unregister_module(*adapter_);
  return std::move(adapter_);
}

void Linear::merge_adapter() {
  if (!adapter_) throw ValueError(op_message("linear", "merge_adapter: the layer has no adapter"));
  Array sum;
  {
    NoGradGuard ng;
    sum = (Tensor(W.value()) + Tensor(adapter_->weight_delta())).value();
  }
  W.set_value(sum);
  remove_adapter();
}

Embedding::Embedding(std::size_t V_vocab, std::size_t d, Generator& gen, DType dtype, double init_std) {
  if (V_vocab == 0 || d == 0) throw ValueError(op_message("embedding", "V_vocab and d must be positive"));
  weight = register_parameter("weight", random_normal({V_vocab, d}, gen, dtype, 0.0, init_std));
}

Embedding::Embedding(const Array& weight_) {
  check_weight("embedding", "weight", weight_, 2);
  if (weight_.size() == 0)
    throw ValueError(op_message("embedding", "weight must not be empty, has shape " + shape_str(weight_.shape())));
  weight = register_parameter("weight", weight_.clone());
}

Tensor Embedding::operator()(const IndexArray& ids) const { return ops::embedding(weight, ids); }

LayerNorm::LayerNorm(std::size_t d, DType dtype, double eps, bool bias) : eps_(eps) {
  gamma = register_parameter("gamma", Array::full({d}, 1.0, dtype));
  if (bias) beta = register_parameter("beta", Array::zeros({d}, dtype));
}

LayerNorm::LayerNorm(const Array& gamma_, const Array& beta_, double eps) : eps_(eps) {
  check_weight("layer_norm", "gamma", gamma_, 1);
  check_weight("layer_norm", "beta", beta_, 1, &gamma_, "gamma");
  if (beta_.shape() != gamma_.shape())
    throw ShapeError(op_message("layer_norm", "gamma has shape " + shape_str(gamma_.shape()) + ", beta " +
                                                  shape_str(beta_.shape()) + ": they must be equal"));
  gamma = register_parameter("gamma", gamma_.clone());
  beta = register_parameter("beta", beta_.clone());
}

Tensor LayerNorm::operator()(const Tensor& x) const {
  check_input_dtype("layer_norm", x, gamma, "gamma");
  return ops::layer_norm(x, gamma, beta, eps_);
}

RMSNorm::RMSNorm(std::size_t d, DType dtype, double eps) : eps_(eps) {
  if (d == 0) throw ValueError(op_message("rms_norm", "d must be positive"));
  if (!(eps > 0.0) || !std::isfinite(eps))
    throw ValueError(op_message("rms_norm", "eps must be positive and finite, got " + std::to_string(eps)));
  weight = register_parameter("weight", Array::full({d}, 1.0, dtype));
}

Tensor RMSNorm::operator()(const Tensor& x) const {
  check_input_dtype("rms_norm", x, weight, "weight");
  return ops::rms_norm(x, weight, eps_);
}

namespace {
// A registered activation's output, which must keep its input's shape.
Tensor activated(const std::function<Tensor(const Tensor&)>& f, const Tensor& x, const char* op) {
  Tensor y = f(x);
  if (!y.defined() || y.shape() != x.shape())
    throw ShapeError(op_message(op, "the activation turned shape " + shape_str(x.shape()) + " into " +
                                        (y.defined() ? shape_str(y.shape()) : std::string("nothing")) +
                                        ": an activation keeps the shape"));
  return y;
}
}  // namespace

FeedForward::FeedForward(std::size_t d, std::size_t d_ff, Generator& gen, double dropout, DType dtype,
                         double out_init_std, bool bias)
    : fc1(d, d_ff, gen, bias, dtype), fc2(d_ff, d, gen, bias, dtype, out_init_std), dropout_(dropout) {
  register_module("fc1", fc1);
  register_module("fc2", fc2);
}

FeedForward::FeedForward(const Array& W1, const Array& b1, const Array& W2, const Array& b2, double dropout)
    : fc1(W1, b1), fc2(W2, b2), dropout_(dropout) {
  if (W2.dtype() != W1.dtype())
    throw DTypeError(op_message("feed_forward", "W1 is " + std::string(dtype_name(W1.dtype())) + ", W2 is " +
                                                    dtype_name(W2.dtype()) + ": one dtype per layer"));
  if (W2.shape()[0] != W1.shape()[1] || W2.shape()[1] != W1.shape()[0])
    throw ShapeError(op_message("feed_forward", "W1 " + shape_str(W1.shape()) + " and W2 " + shape_str(W2.shape()) +
                                                    " must be [d, d_ff] and [d_ff, d]"));
  register_module("fc1", fc1);
  register_module("fc2", fc2);
}

Tensor FeedForward::hidden(const Tensor& x, Generator* dropout_gen) const {
  // bias + GELU as one op (ops::bias_gelu; the same function as gelu(fc1(x)))
  Tensor h = activation ? activated(activation, fc1(x), "feed_forward")
             : fc1.b.defined() ? ops::bias_gelu(fc1.product(x), fc1.b) : ops::gelu(fc1(x));
  if (training() && dropout_ > 0) {
    if (!dropout_gen) throw ValueError(op_message("feed_forward", "dropout in training needs a generator"));
    h = ops::dropout(h, dropout_, *dropout_gen, true);
  }
  return h;
}

Tensor FeedForward::operator()(const Tensor& x, Generator* dropout_gen) const { return fc2(hidden(x, dropout_gen)); }

Tensor FeedForward::with_residual(const Tensor& x, const Tensor& residual, Generator* dropout_gen) const {
  const Tensor h = hidden(x, dropout_gen);
  if (fc2.adapter() || !fc2.b.defined()) return residual + fc2(h);
  check_linear_input(h, fc2.W);
  return ops::linear(h, fc2.W, fc2.b, residual);  // residual + (h W2 + b2): one op, the same bits
}

SwiGLUFeedForward::SwiGLUFeedForward(std::size_t d, std::size_t d_ff, Generator& gen, DType dtype,
                                     double down_init_std)
    : gate(d, d_ff, gen, false, dtype), up(d, d_ff, gen, false, dtype), down(d_ff, d, gen, false, dtype, down_init_std) {
  register_module("gate", gate);
  register_module("up", up);
  register_module("down", down);
}

namespace {
// Decoding's one-row case of gate(x) and up(x): x is a single float32 row [1, .., 1, d], no gradient is
// wanted, neither layer has an adapter and products run in float32. Then both products run as
// one (blas::row_products: x read once, one pool hand-off for the two), each output bit for bit
// what ops::matmul(x, W) gives (the same kernel and chains). False otherwise: the caller takes
// the op-by-op path (which also reports any bad input).
bool gate_up_one_row(const Tensor& x, const Linear& gate, const Linear& up, Tensor& g, Tensor& u) {
  if (!x.defined() || x.dtype() != DType::float32 || x.ndim() < 2 || gate.adapter() || up.adapter()) return false;
  const Shape& wg = gate.W.shape();
  const std::size_t d = wg[0], n = wg[1];
  if (x.shape().back() != d || x.size() != d || up.W.shape() != wg || gate.W.dtype() != DType::float32 ||
      up.W.dtype() != DType::float32)
    return false;
  if (grad_enabled() && (x.requires_grad() || gate.W.requires_grad() || up.W.requires_grad())) return false;
  if (effective_matmul_dtype() != MatmulDtype::float32) return false;
  Shape out = x.shape();
  out.back() = n;
  Array ga = Array::empty(out, DType::float32), ua = Array::empty(out, DType::float32);
  const Array xv = x.value(), gw = gate.W.value(), uw = up.W.value();
  const blas::RowProduct ps[2] = {{gw.data<float>(), n, ga.data<float>()}, {uw.data<float>(), n, ua.data<float>()}};
  blas::row_products(xv.data<float>(), d, ps, 2);
  g = Tensor(ga);
  u = Tensor(ua);
  return true;
}
}  // namespace

Tensor SwiGLUFeedForward::operator()(const Tensor& x) const {
  Tensor g, u;
  if (!gate_up_one_row(x, gate, up, g, u)) {
    g = gate(x);
    u = up(x);
  }
  if (activation) return down(activated(activation, g, "swiglu_feed_forward") * u);
  return down(ops::swiglu(g, u));
}

}  // namespace xg::nn
