// Forward (SPEC 2):  y = x * m / q,  m ~ Bernoulli(q), q = 1 - p
// VJP:               x_bar = g * m / q  (the mask saved by the forward pass)
#include <xgrad/ops/dropout.hpp>

#include <xgrad/core/check.hpp>
#include <xgrad/core/kernels.hpp>
#include <xgrad/core/tape.hpp>

namespace xg::ops {

Array dropout_mask(const Shape& shape, double p, Generator& gen, DType dtype) {
  if (!(p >= 0.0 && p < 1.0))  // p = 1: everything zeroed, scaled by 1 / (1 - p) = inf
    throw ValueError(op_message("dropout", "p must be in [0, 1), got " + std::to_string(p)));
  const double q = 1.0 - p;
  Array m = Array::empty(shape, dtype);
  for (std::size_t i = 0; i < m.size(); ++i) m.set_flat(i, (q > 0 && gen.uniform() < q) ? 1.0 / q : 0.0);
  return m;
}

Tensor apply_dropout_mask(const Tensor& x, const Array& scaled_mask) {
  check::defined("dropout", "x", x);
  check::same_shape("dropout", "x", x.shape(), "mask", scaled_mask.shape());
  if (scaled_mask.dtype() != x.dtype())
    throw DTypeError(op_message("dropout", std::string("mask is ") + dtype_name(scaled_mask.dtype()) +
                                               ", x is " + dtype_name(x.dtype())));
  return record("dropout", kernels::mul(x.value(), scaled_mask), {x}, [scaled_mask](const VjpContext& c) {
    return Cotangents{kernels::mul(c.grad_output, scaled_mask)};
  });
}

Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  check::defined("dropout", "x", x);
  if (!(p >= 0.0 && p < 1.0))  // p = 1: everything zeroed, scaled by 1 / (1 - p) = inf
    throw ValueError(op_message("dropout", "p must be in [0, 1), got " + std::to_string(p)));
  if (!training || p == 0.0) return x;
  return apply_dropout_mask(x, dropout_mask(x.shape(), p, gen, x.dtype()));
}

}  // namespace xg::ops
