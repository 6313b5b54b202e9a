// index_select: y = x[..., idx, ...]     x_bar = zeros, then x_bar[..., idx[k], ...] += g[..., k, ...]
// gather:       y = x[.., idx[..], ..]   x_bar = scatter-add of g at the gathered positions
// embedding:    index_select on axis 0 of the weight, the ids reshaped to 1-d.
// Repeated indices receive the sum of their gradients (scatter-add, not scatter).
#include <xgrad/ops/index.hpp>

#include <cstring>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/strided.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/ops/shape_ops.hpp>

namespace xg::ops {

namespace {

void check_index_range(const std::string& op, const IndexArray& idx, std::size_t limit,
                       const std::string& what) {
  for (std::size_t i = 0; i < idx.data.size(); ++i)
    if (idx.data[i] < 0 || static_cast<std::size_t>(idx.data[i]) >= limit)
      throw ValueError(op_message(op, "index " + std::to_string(idx.data[i]) + " at position " +
                                          std::to_string(i) + " is out of range for " + what +
                                          " of size " + std::to_string(limit)));
}

}  // namespace

Tensor index_select(const Tensor& x, int axis, const IndexArray& idx) {
  check::defined("index_select", "x", x);
  const std::size_t ax = normalize_axis("index_select", "axis", axis, x.ndim());
  if (idx.shape.size() != 1)
    throw ShapeError(op_message("index_select", "index must be 1-d, has shape " + shape_str(idx.shape)));
  check_index_range("index_select", idx, x.shape()[ax], "axis " + std::to_string(axis));
  const AxisSplit sp = split_at_axis(x.shape(), ax);
  const std::size_t outer = sp.outer, inner = sp.inner, len = sp.len, n = idx.size();
  Shape out_shape = x.shape();
  out_shape[ax] = n;
  Array out = Array::empty(out_shape, x.dtype());
  if (out.size() > 0) detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.value().data<T>();
    T* po = out.data<T>();
    for (std::size_t o = 0; o < outer; ++o)
      for (std::size_t k = 0; k < n; ++k)
        std::memcpy(po + (o * n + k) * inner,
                    px + (o * len + static_cast<std::size_t>(idx.data[k])) * inner, inner * sizeof(T));
  });
  auto keep = std::make_shared<IndexArray>(idx);
  return record("index_select", std::move(out), {x}, [keep, outer, inner, len](const VjpContext& c) {
    const Array& X = c.inputs[0];
    Array gx = Array::zeros(X.shape(), X.dtype());
    const std::size_t n = keep->size();
    detail::dispatch(X.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* pg = c.grad_output.data<T>();
      T* px = gx.data<T>();
      for (std::size_t o = 0; o < outer; ++o)
        for (std::size_t k = 0; k < n; ++k) {
          T* dst = px + (o * len + static_cast<std::size_t>(keep->data[k])) * inner;
          const T* src = pg + (o * n + k) * inner;
          for (std::size_t i = 0; i < inner; ++i) dst[i] += src[i];
        }
    });
    return Cotangents{gx};
  });
}

Tensor gather(const Tensor& x, int axis, const IndexArray& idx) {
  check::defined("gather", "x", x);
  const std::size_t ax = normalize_axis("gather", "axis", axis, x.ndim());
  if (idx.shape.size() != x.ndim())
    throw ShapeError(op_message("gather", "index has shape " + shape_str(idx.shape) +
                                              ", x has shape " + shape_str(x.shape()) +
                                              "; they need the same rank"));
  for (std::size_t d = 0; d < x.ndim(); ++d)
    if (d != ax && idx.shape[d] > x.shape()[d])
      throw ShapeError(op_message("gather", "index has shape " + shape_str(idx.shape) +
                                                ", larger than x's shape " + shape_str(x.shape()) +
                                                " on axis " + std::to_string(d)));
  check_index_range("gather", idx, x.shape()[ax], "axis " + std::to_string(axis));
  // Offset of each gathered element in x: x strides, with the axis coordinate replaced.
  const auto xs = contiguous_strides(x.shape());
  std::vector<std::ptrdiff_t> st = xs;
  st[ax] = 0;
  auto offsets = std::make_shared<std::vector<std::size_t>>(idx.size());
  detail::for_each_strided(idx.shape, st, st, [&](std::size_t i, std::ptrdiff_t o, std::ptrdiff_t) {
    (*offsets)[i] = static_cast<std::size_t>(o + idx.data[i] * xs[ax]);
  });
  Array out = Array::empty(idx.shape, x.dtype());
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.value().data<T>();
    T* po = out.data<T>();
    for (std::size_t i = 0; i < offsets->size(); ++i) po[i] = px[(*offsets)[i]];
  });
  return record("gather", std::move(out), {x}, [offsets](const VjpContext& c) {
    const Array& X = c.inputs[0];
    Array gx = Array::zeros(X.shape(), X.dtype());
    detail::dispatch(X.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* pg = c.grad_output.data<T>();
      T* px = gx.data<T>();
      for (std::size_t i = 0; i < offsets->size(); ++i) px[(*offsets)[i]] += pg[i];
    });
    return Cotangents{gx};
  });
}

Tensor embedding(const Tensor& weight, const IndexArray& ids) {
  check::rank("embedding", "weight", weight, 2);
  check_index_range("embedding", ids, weight.shape()[0], "the vocabulary (weight rows)");
  const IndexArray flat({ids.size()}, ids.data);
  Tensor rows = index_select(weight, 0, flat);
  std::vector<long> shape(ids.shape.begin(), ids.shape.end());
  shape.push_back(static_cast<long>(weight.shape()[1]));
  return reshape(rows, shape);
}

}  // namespace xg::ops
