// Reductions. g = cotangent of the output, B(.) = broadcast back to x's shape.
//   sum:  y = sum_axes x                  x_bar = B(g)
//   mean: y = sum_axes x / N              x_bar = B(g) / N
//   max:  y = max_axes x                  x_bar = B(g) * [x == B(y)] / B(count of ties)
//   var:  composed from mean, sub, mul, sum; its VJP follows by composition.
//   sum_to: y = x summed down to a shape      x_bar = B(g)
// Second-order rules: the same with recorded reshape and broadcast_to (max's weights
// [x == B(y)] / ties are constants: max is piecewise linear).
#include <xgrad/ops/reduce.hpp>

#include <limits>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/detail/strided.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/shape_ops.hpp>

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

// The reduced axes as a bit mask (what a second-order rule captures: 8 bytes); 0 when x has
// more than 64 axes, which then gets no second-order rule.
std::uint64_t axes_mask(const Reduction& r, std::size_t ndim) {
  if (ndim > 64) return 0;
  std::uint64_t m = 0;
  for (std::size_t a : r.axes) m |= std::uint64_t{1} << a;
  return m;
}

// x's shape with the axes in `mask` set to 1 (the keepdims shape of the reduction).
Shape kept_shape(const Shape& x, std::uint64_t mask) {
  Shape k = x;
  for (std::size_t a = 0; a < k.size(); ++a)
    if (mask >> a & 1) k[a] = 1;
  return k;
}

std::vector<long> long_shape(const Shape& s) { return std::vector<long>(s.begin(), s.end()); }

// g (the reduction's output shape) broadcast back to x's shape, recorded.
Tensor unreduce(const Tensor& g, const Shape& x, std::uint64_t mask) {
  return broadcast_to(reshape(g, long_shape(kept_shape(x, mask))), x);
}

}  // namespace

Tensor sum_to(const Tensor& x, const Shape& shape) {
  check::defined("sum_to", "x", x);
  const Shape b = broadcast_shapes("sum_to", "shape", shape, "x", x.shape());
  if (b != x.shape())
    throw ShapeError(op_message("sum_to", "shape " + shape_str(shape) + " does not broadcast to x's shape " +
                                              shape_str(x.shape())));
  if (shape == x.shape()) return x;
  return record(
      "sum_to", kernels::sum_to_shape(x.value(), shape), {x},
      [](const VjpContext& c) { return Cotangents{kernels::broadcast_to(c.grad_output, c.inputs[0].shape())}; },
      second_order([](const DiffVjpContext& c) { return DiffCotangents{broadcast_to(c.grad_output, c.inputs[0].shape())}; }));
}

Tensor sum(const Tensor& x, const Axes& axes, bool keepdims) {
  const Reduction r = plan("sum", x, axes, keepdims);
  Array y = kernels::sum_to_shape(x.value(), r.kept).view(r.out);
  const std::uint64_t mask = axes_mask(r, x.ndim());
  auto vjp = [r](const VjpContext& c) {
    return Cotangents{kernels::broadcast_to(c.grad_output.view(r.kept), c.inputs[0].shape())};
  };
  if (mask == 0 && !r.axes.empty()) return record("sum", std::move(y), {x}, vjp);
  return record("sum", std::move(y), {x}, vjp, second_order([mask](const DiffVjpContext& c) {
                  return DiffCotangents{unreduce(c.grad_output, c.inputs[0].shape(), mask)};
                }));
}

Tensor mean(const Tensor& x, const Axes& axes, bool keepdims) {
  const Reduction r = plan("mean", x, axes, keepdims);
  if (r.count == 0)
    throw ShapeError(op_message("mean", "reduces over zero elements: x has shape " +
                                            shape_str(x.shape())));
  const double inv = 1.0 / static_cast<double>(r.count);
  Array y = kernels::scale(kernels::sum_to_shape(x.value(), r.kept), inv).view(r.out);
  const std::uint64_t mask = axes_mask(r, x.ndim());
  auto vjp = [r, inv](const VjpContext& c) {
    return Cotangents{kernels::broadcast_to(kernels::scale(c.grad_output, inv).view(r.kept),
                                            c.inputs[0].shape())};
  };
  if (mask == 0 && !r.axes.empty()) return record("mean", std::move(y), {x}, vjp);
  return record("mean", std::move(y), {x}, vjp, second_order([mask, inv](const DiffVjpContext& c) {
                  return DiffCotangents{unreduce(c.grad_output * inv, c.inputs[0].shape(), mask)};
                }));
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
  const std::uint64_t mask = axes_mask(r, x.ndim());
  auto vjp = [r](const VjpContext& c) {
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
  };
  if (mask == 0 && !r.axes.empty()) return record("max", y.view(r.out), {x}, vjp);
  return record("max", y.view(r.out), {x}, vjp, second_order([mask](const DiffVjpContext& c) {
                  // The weights [x == max] / ties, a constant: max is linear where it is differentiable.
                  const Array& X = c.inputs[0].value();
                  const Shape kept = kept_shape(X.shape(), mask);
                  const Array y_kept = c.output.value().view(kept);
                  Array ties = Array::zeros(kept, X.dtype());
                  Array w = Array::empty(X.shape(), X.dtype());
                  detail::dispatch(X.dtype(), [&](auto t) {
                    using T = decltype(t);
                    const T* px = X.data<T>();
                    const T* py = y_kept.data<T>();
                    T* pt = ties.data<T>();
                    T* pw = w.data<T>();
                    const auto st = broadcast_strides(kept, X.shape());
                    detail::for_each_strided(X.shape(), st, st, [&](std::size_t i, std::ptrdiff_t o, std::ptrdiff_t) {
                      if (px[i] == py[o]) pt[o] += 1;
                    });
                    detail::for_each_strided(X.shape(), st, st, [&](std::size_t i, std::ptrdiff_t o, std::ptrdiff_t) {
                      pw[i] = px[i] == py[o] ? T(1) / pt[o] : T(0);
                    });
                  });
                  return DiffCotangents{unreduce(c.grad_output, X.shape(), mask) * Tensor(w)};
                }));
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
