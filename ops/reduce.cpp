// Reductions. g = cotangent of the output, B(.) = broadcast back to x's shape.
//   sum:  y = sum_axes x                  x_bar = B(g)
//   mean: y = sum_axes x / N              x_bar = B(g) / N
//   max:  y = max_axes x                  x_bar = B(g) * [x == B(y)] / B(count of ties)
//   var:  composed from mean, sub, mul, sum; its VJP follows by composition.
#include <xgrad/ops/reduce.hpp>

#include <limits>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/detail/strided.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/ops/elementwise.hpp>

namespace xg::ops {

namespace {

struct Reduction {
  std::vector<std::size_t> axes;
  Shape kept;  // output shape with keepdims
  Shape out;   // output shape as requested
  std::size_t count = 1;
};

Reduction plan(const std::string& op, const Tensor& x, const Axes& axes, bool keepdims) {
  check::defined(op, "x", x);
  Reduction r;
  r.axes = normalize_axes(op, "axis", axes, x.ndim());
  r.kept = kernels::reduced_shape(x.shape(), r.axes, true);
  r.out = kernels::reduced_shape(x.shape(), r.axes, keepdims);
  for (std::size_t a : r.axes) r.count *= x.shape()[a];
  return r;
}

}  // namespace

Tensor sum(const Tensor& x, const Axes& axes, bool keepdims) {
  const Reduction r = plan("sum", x, axes, keepdims);
  Array y = kernels::sum_to_shape(x.value(), r.kept).view(r.out);
  return record("sum", std::move(y), {x}, [r](const VjpContext& c) {
    return Cotangents{kernels::broadcast_to(c.grad_output.view(r.kept), c.inputs[0].shape())};
  });
}

Tensor mean(const Tensor& x, const Axes& axes, bool keepdims) {
  const Reduction r = plan("mean", x, axes, keepdims);
  if (r.count == 0)
    throw ShapeError(op_message("mean", "reduces over zero elements: x has shape " +
                                            shape_str(x.shape())));
  const double inv = 1.0 / static_cast<double>(r.count);
  Array y = kernels::scale(kernels::sum_to_shape(x.value(), r.kept), inv).view(r.out);
  return record("mean", std::move(y), {x}, [r, inv](const VjpContext& c) {
    return Cotangents{kernels::broadcast_to(kernels::scale(c.grad_output, inv).view(r.kept),
                                            c.inputs[0].shape())};
  });
}

Tensor max(const Tensor& x, const Axes& axes, bool keepdims) {
  const Reduction r = plan("max", x, axes, keepdims);
  if (r.count == 0)
    throw ShapeError(op_message("max", "reduces over zero elements: x has shape " +
                                           shape_str(x.shape())));
  Array y = Array::full(r.kept, -std::numeric_limits<double>::infinity(), x.dtype());
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.value().data<T>();
    T* py = y.data<T>();
    const auto st = broadcast_strides(r.kept, x.shape());
    detail::for_each_strided(x.shape(), st, st, [&](std::size_t i, std::ptrdiff_t o, std::ptrdiff_t) {
      const T v = px[i];
      if (v > py[o] || std::isnan(v)) py[o] = v;
    });
  });
  return record("max", y.view(r.out), {x}, [r](const VjpContext& c) {
    const Array& X = c.inputs[0];
    const Array y_kept = c.output.view(r.kept);
    const Array g_kept = c.grad_output.view(r.kept);
    Array ties = Array::zeros(r.kept, X.dtype());  // number of maximal elements per slice
    Array xb = Array::empty(X.shape(), X.dtype());
    detail::dispatch(X.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* px = X.data<T>();
      const T* py = y_kept.data<T>();
      const T* pg = g_kept.data<T>();
      T* pt = ties.data<T>();
      T* po = xb.data<T>();
      const auto st = broadcast_strides(r.kept, X.shape());
      detail::for_each_strided(X.shape(), st, st, [&](std::size_t i, std::ptrdiff_t o, std::ptrdiff_t) {
        if (px[i] == py[o]) pt[o] += 1;
      });
      detail::for_each_strided(X.shape(), st, st, [&](std::size_t i, std::ptrdiff_t o, std::ptrdiff_t) {
        po[i] = px[i] == py[o] ? pg[o] / pt[o] : T(0);
      });
    });
    return Cotangents{xb};
  });
}

Tensor var(const Tensor& x, const Axes& axes, int correction, bool keepdims) {
  const Reduction r = plan("var", x, axes, keepdims);
  if (correction < 0)
    throw ValueError(op_message("var", "correction must be >= 0, got " + std::to_string(correction)));
  if (static_cast<long>(r.count) - correction <= 0)
    throw ShapeError(op_message("var", "needs more than " + std::to_string(correction) +
                                           " element(s) per reduced slice, x has shape " +
                                           shape_str(x.shape()) + " and the slice has " +
                                           std::to_string(r.count)));
  const Tensor d = x - mean(x, axes, true);
  return sum(d * d, axes, keepdims) / static_cast<double>(static_cast<long>(r.count) - correction);
}

}  // namespace xg::ops
