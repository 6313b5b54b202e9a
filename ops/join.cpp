// concat: y = [x_0, x_1, ...] along axis      x_k_bar = the k-th block of g
// slice:  y = x[start:stop:step] along axis   x_bar = zeros with g scattered back
// A tensor viewed as [outer, axis, inner] makes both a loop of contiguous copies.
// Second-order rules: concat's slices g (recorded slice); slice's scatters g back with the
// recorded op slice_backward, whose own VJP is the slice again.
#include <xgrad/ops/join.hpp>

#include <algorithm>
#include <cstring>

#include <xgrad/core/check.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>

namespace xg::ops {

namespace {

// Copies n rows along the axis, starting at src_off and taking every step-th one, into
// rows [dst_off, dst_off + n) of dst.
void copy_rows(const Array& src, AxisSplit s, std::size_t src_off, std::size_t step, Array& dst,
               AxisSplit d, std::size_t dst_off, std::size_t n) {
  if (n == 0 || s.inner == 0 || s.outer == 0) return;  // nothing to copy (buffers may be null)
  detail::dispatch(src.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* ps = src.data<T>();
    T* pd = dst.data<T>();
    detail::parallel_for(s.outer, std::max<std::size_t>(1, (std::size_t{1} << 15) / (n * s.inner + 1)),
                         [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t o = lo; o < hi; ++o) {
        if (step == 1) {  // n adjacent rows: one block (splitting the last axis: inner == 1)
          std::memcpy(pd + (o * d.len + dst_off) * d.inner, ps + (o * s.len + src_off) * s.inner,
                      n * s.inner * sizeof(T));
          continue;
        }
        for (std::size_t k = 0; k < n; ++k)
          std::memcpy(pd + (o * d.len + dst_off + k) * d.inner, ps + (o * s.len + src_off + k * step) * s.inner,
                      s.inner * sizeof(T));
      }
    });
  });
}

// Inverse of copy_rows for the VJP: writes g's rows back to strided positions of dst.
void scatter_rows(const Array& g, AxisSplit gs, Array& dst, AxisSplit ds, std::size_t start,
                  std::size_t step) {
  if (g.size() == 0) return;
  detail::dispatch(g.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pg = g.data<T>();
    T* pd = dst.data<T>();
    for (std::size_t o = 0; o < gs.outer; ++o) {
      if (step == 1) {
        std::memcpy(pd + (o * ds.len + start) * ds.inner, pg + o * gs.len * gs.inner, gs.len * gs.inner * sizeof(T));
        continue;
      }
      for (std::size_t k = 0; k < gs.len; ++k)
        std::memcpy(pd + (o * ds.len + start + k * step) * ds.inner,
                    pg + (o * gs.len + k) * gs.inner, gs.inner * sizeof(T));
    }
  });
}

// concat's and slice's VJPs as named types: their second-order rules read the offsets.
struct ConcatVjp {
  std::size_t ax;
  std::vector<std::size_t> offsets;
  AxisSplit d;
  Cotangents operator()(const VjpContext& c) const {
    Cotangents cot(c.inputs.size());
    for (std::size_t k = 0; k < c.inputs.size(); ++k) {
      if (!c.needs(k)) continue;
      Array gk = Array::empty(c.inputs[k].shape(), c.grad_output.dtype());
      const AxisSplit s = split_at_axis(c.inputs[k].shape(), ax);
      copy_rows(c.grad_output, d, offsets[k], 1, gk, s, 0, s.len);
      cot[k] = std::move(gk);
    }
    return cot;
  }
};

Array scatter_slice(const Array& g, const Shape& x_shape, std::size_t ax, std::size_t start, std::size_t step) {
  Array gx = Array::zeros(x_shape, g.dtype());
  scatter_rows(g, split_at_axis(g.shape(), ax), gx, split_at_axis(x_shape, ax), start, step);
  return gx;
}

struct SliceVjp {
  std::size_t ax, start, step;
  Cotangents operator()(const VjpContext& c) const {
    return Cotangents{scatter_slice(c.grad_output, c.inputs[0].shape(), ax, start, step)};
  }
};

// g placed into zeros of x_shape at rows start, start + step, ... of axis ax (recorded).
Tensor slice_backward(const Tensor& g, const Shape& x_shape, std::size_t ax, std::size_t start, std::size_t step) {
  const long stop = static_cast<long>(start + step * g.shape()[ax]);
  return record(
      "slice_backward", scatter_slice(g.value(), x_shape, ax, start, step), {g},
      [ax, start, step, stop](const VjpContext& c) {
        // The slice of the cotangent (slice() is recorded only under create_graph; here values).
        NoGradGuard values_only;
        return Cotangents{slice(Tensor(c.grad_output), static_cast<int>(ax), static_cast<long>(start), stop,
                                static_cast<long>(step)).value()};
      },
      [ax, start, step, stop](const DiffVjpContext& c) {
        return DiffCotangents{slice(c.grad_output, static_cast<int>(ax), static_cast<long>(start), stop,
                                    static_cast<long>(step))};
      });
}

}  // namespace

Tensor concat(const std::vector<Tensor>& xs, int axis) {
  if (xs.empty()) throw ValueError(op_message("concat", "needs at least one tensor"));
  check::defined("concat", "xs[0]", xs[0]);
  const std::size_t ax = normalize_axis("concat", "axis", axis, xs[0].ndim());
  Shape out_shape = xs[0].shape();
  out_shape[ax] = 0;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    const std::string name = "xs[" + std::to_string(k) + "]";
    check::same_dtype("concat", "xs[0]", xs[0], name, xs[k]);
    Shape a = xs[0].shape(), b = xs[k].shape();
    if (a.size() == b.size()) a[ax] = b[ax] = 0;
    if (a != b)
      throw ShapeError(op_message("concat", "shapes differ outside axis " + std::to_string(axis) +
                                                ": xs[0] has shape " + shape_str(xs[0].shape()) +
                                                ", " + name + " has shape " + shape_str(xs[k].shape())));
    out_shape[ax] += xs[k].shape()[ax];
  }
  Array out = Array::empty(out_shape, xs[0].dtype());
  const AxisSplit d = split_at_axis(out_shape, ax);
  std::size_t off = 0;
  std::vector<std::size_t> offsets;
  for (const Tensor& x : xs) {
    const AxisSplit s = split_at_axis(x.shape(), ax);
    copy_rows(x.value(), s, 0, 1, out, d, off, s.len);
    offsets.push_back(off);
    off += s.len;
  }
  return record("concat", std::move(out), xs, ConcatVjp{ax, offsets, d}, second_order([](const DiffVjpContext& c) {
                  const ConcatVjp& v = c.first_order_as<ConcatVjp>();
                  DiffCotangents cot(c.inputs.size());
                  for (std::size_t k = 0; k < c.inputs.size(); ++k)
                    if (c.needs(k)) {
                      const long off = static_cast<long>(v.offsets[k]);
                      cot[k] = slice(c.grad_output, static_cast<int>(v.ax), off,
                                     off + static_cast<long>(c.inputs[k].shape()[v.ax]));
                    }
                  return cot;
                }));
}

Tensor slice(const Tensor& x, int axis, long start, long stop, long step) {
  check::defined("slice", "x", x);
  const std::size_t ax = normalize_axis("slice", "axis", axis, x.ndim());
  if (step <= 0)
    throw ValueError(op_message("slice", "step must be positive, got " + std::to_string(step)));
  const long len = static_cast<long>(x.shape()[ax]);
  auto clampi = [len](long v) { return std::clamp(v < 0 ? v + len : v, 0L, len); };
  const long b = clampi(start), e = clampi(stop);
  const std::size_t n = e > b ? static_cast<std::size_t>((e - b - 1) / step + 1) : 0;  // no overflow for huge step
  Shape out_shape = x.shape();
  out_shape[ax] = n;
  Array out = Array::empty(out_shape, x.dtype());
  const AxisSplit s = split_at_axis(x.shape(), ax), d = split_at_axis(out_shape, ax);
  copy_rows(x.value(), s, static_cast<std::size_t>(b), static_cast<std::size_t>(step), out, d, 0, n);
  const std::size_t ub = static_cast<std::size_t>(b), us = static_cast<std::size_t>(step);
  return record("slice", std::move(out), {x}, SliceVjp{ax, ub, us}, second_order([](const DiffVjpContext& c) {
                  const SliceVjp& v = c.first_order_as<SliceVjp>();
                  return DiffCotangents{slice_backward(c.grad_output, c.inputs[0].shape(), v.ax, v.start, v.step)};
                }));
}

std::vector<Tensor> split(const Tensor& x, const std::vector<std::size_t>& sizes, int axis) {
  check::defined("split", "x", x);
  const std::size_t ax = normalize_axis("split", "axis", axis, x.ndim());
  std::size_t total = 0;
  for (std::size_t s : sizes) total += s;
  if (total != x.shape()[ax])
    throw ShapeError(op_message("split", "sizes add up to " + std::to_string(total) + " but axis " +
                                             std::to_string(axis) + " of x has length " +
                                             std::to_string(x.shape()[ax]) + " (shape " +
                                             shape_str(x.shape()) + ")"));
  std::vector<Tensor> out;
  long off = 0;
  for (std::size_t s : sizes) {
    out.push_back(slice(x, axis, off, off + static_cast<long>(s)));
    off += static_cast<long>(s);
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, std::size_t n, int axis) {
  check::defined("chunk", "x", x);
  const std::size_t ax = normalize_axis("chunk", "axis", axis, x.ndim());
  if (n == 0 || x.shape()[ax] % n != 0)
    throw ShapeError(op_message("chunk", "axis " + std::to_string(axis) + " of x has length " +
                                             std::to_string(x.shape()[ax]) +
                                             ", not divisible into " + std::to_string(n) + " pieces"));
  return split(x, std::vector<std::size_t>(n, x.shape()[ax] / n), axis);
}

}  // namespace xg::ops
