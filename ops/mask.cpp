// add_mask:    out = (bias == -inf) ? -inf : x + bias      x_bar = (bias == -inf) ? 0 : g
// masked_fill: out = m ? value : x                         x_bar = m ? 0 : g
// Both are selects; broadcasting of x against the mask is undone by sum_to_shape.
// Second-order rules: the same selects, recorded (masked_fill of the cotangent, then sum_to).
#include <xgrad/ops/mask.hpp>

#include <cmath>
#include <limits>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/ops/reduce.hpp>

namespace xg::ops {

namespace {

// masked_fill's and add_mask's VJPs as named types: their second-order rules read the mask.
struct FillVjp {
  std::shared_ptr<const BoolArray> m;
  Cotangents operator()(const VjpContext& c) const {
    const Array& g = c.grad_output;
    return Cotangents{kernels::sum_to_shape(
        kernels::select(m->data, m->shape, Array::zeros({}, g.dtype()), g), c.inputs[0].shape())};
  }
};

struct AddMaskVjp {
  Array bias;
  Cotangents operator()(const VjpContext& c) const {
    return Cotangents{kernels::sum_to_shape(kernels::masked_grad(c.grad_output, bias), c.inputs[0].shape())};
  }
};

Tensor fill_select(const std::string& op, const Tensor& x, std::shared_ptr<const BoolArray> m,
                   const Array& replacement) {
  Array out = kernels::select(m->data, m->shape, replacement, x.value());
  return record(op, std::move(out), {x}, FillVjp{m}, second_order([](const DiffVjpContext& c) {
                  return DiffCotangents{masked_fill(c.grad_output, *c.first_order_as<FillVjp>().m, 0.0)};
                }));
}

}  // namespace

void check_additive_bias(const std::string& op, const Array& bias) {
  detail::dispatch(bias.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* b = bias.data<T>();
    for (std::size_t i = 0, n = bias.size(); i < n; ++i)
      if (std::isnan(b[i]) || b[i] == std::numeric_limits<T>::infinity())
        throw ValueError(op_message(op, "additive bias has " + std::to_string(b[i]) + " at flat index " +
                                            std::to_string(i) + "; use 0 (allowed), -inf (forbidden) or a finite bias"));
  });
}

Tensor add_mask(const Tensor& x, const Array& bias) {
  check::defined("add_mask", "x", x);
  if (bias.dtype() != x.dtype())
    throw DTypeError(op_message("add_mask", std::string("bias is ") + dtype_name(bias.dtype()) +
                                                ", x is " + dtype_name(x.dtype())));
  broadcast_shapes("add_mask", "x", x.shape(), "bias", bias.shape());
  check_additive_bias("add_mask", bias);
  // One pass each way: forbidden positions selected to -inf (never x + -inf, which is NaN for
  // x = +inf); the VJP passes g where the bias is finite.
  return record("add_mask", kernels::masked_add(x.value(), bias), {x}, AddMaskVjp{bias},
                second_order([](const DiffVjpContext& c) {
                  const Array& b = c.first_order_as<AddMaskVjp>().bias;
                  BoolArray forbidden(b.shape(), std::vector<unsigned char>(b.size()));
                  for (std::size_t i = 0; i < b.size(); ++i) forbidden.data[i] = std::isinf(b.flat(i)) ? 1 : 0;
                  return DiffCotangents{sum_to(masked_fill(c.grad_output, forbidden, 0.0), c.inputs[0].shape())};
                }));
}

Tensor masked_fill(const Tensor& x, const BoolArray& fill_where, double value) {
  check::defined("masked_fill", "x", x);
  const Shape out = broadcast_shapes("masked_fill", "x", x.shape(), "fill_where", fill_where.shape);
  if (out != x.shape())
    throw ShapeError(op_message("masked_fill", "fill_where of shape " + shape_str(fill_where.shape) +
                                                   " does not broadcast to x's shape " + shape_str(x.shape())));
  return fill_select("masked_fill", x, std::make_shared<const BoolArray>(fill_where),
                     Array::scalar(value, x.dtype()));
}

}  // namespace xg::ops
