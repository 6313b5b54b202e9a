// index_select: y = x[..., idx, ...]     x_bar = zeros, then x_bar[..., idx[k], ...] += g[..., k, ...]
// gather:       y = x[.., idx[..], ..]   x_bar = scatter-add of g at the gathered positions
// embedding:    index_select on axis 0 of the weight, the ids reshaped to 1-d.
// Repeated indices receive the sum of their gradients (scatter-add, not scatter).
// Second-order rules: the scatter-adds as recorded ops (index_select_backward,
// gather_backward) whose own VJPs are the selects again.
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

// Offsets of gathered elements: out[i] = x[offsets[i]].
using Offsets = std::shared_ptr<const std::vector<std::size_t>>;

Array scatter_offsets(const Array& g, const Shape& x_shape, const std::vector<std::size_t>& offsets) {
  Array gx = Array::zeros(x_shape, g.dtype());
  detail::dispatch(g.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pg = g.data<T>();
    T* px = gx.data<T>();
    for (std::size_t i = 0; i < offsets.size(); ++i) px[offsets[i]] += pg[i];
  });
  return gx;
}

Array gather_offsets_value(const Array& x, const Shape& out_shape, const std::vector<std::size_t>& offsets) {
  Array out = Array::empty(out_shape, x.dtype());
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for (std::size_t i = 0; i < offsets.size(); ++i) po[i] = px[offsets[i]];
  });
  return out;
}

Tensor scatter_recorded(const Tensor& g, const Shape& x_shape, const Offsets& offsets);

// out[i] = x[offsets[i]], recorded (gather's and index_select's building block under create_graph).
Tensor gather_recorded(const Tensor& x, const Shape& out_shape, const Offsets& offsets) {
  return record(
      "gather_offsets", gather_offsets_value(x.value(), out_shape, *offsets), {x},
      [offsets](const VjpContext& c) { return Cotangents{scatter_offsets(c.grad_output, c.inputs[0].shape(), *offsets)}; },
      [offsets](const DiffVjpContext& c) {
        return DiffCotangents{scatter_recorded(c.grad_output, c.inputs[0].shape(), offsets)};
      });
}

// zeros(x_shape) with g[i] added at offsets[i], recorded.
Tensor scatter_recorded(const Tensor& g, const Shape& x_shape, const Offsets& offsets) {
  return record(
      "scatter_offsets", scatter_offsets(g.value(), x_shape, *offsets), {g},
      [offsets](const VjpContext& c) {
        return Cotangents{gather_offsets_value(c.grad_output, c.inputs[0].shape(), *offsets)};
      },
      [offsets](const DiffVjpContext& c) {
        return DiffCotangents{gather_recorded(c.grad_output, c.inputs[0].shape(), offsets)};
      });
}

// The flat offsets in x of index_select's output elements.
Offsets select_offsets(const IndexArray& idx, std::size_t outer, std::size_t inner, std::size_t len) {
  auto off = std::make_shared<std::vector<std::size_t>>();
  off->reserve(outer * idx.size() * inner);
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t k = 0; k < idx.size(); ++k)
      for (std::size_t i = 0; i < inner; ++i)
        off->push_back((o * len + static_cast<std::size_t>(idx.data[k])) * inner + i);
  return off;
}

// index_select's and gather's VJPs as named types: their second-order rules read the indices.
struct IndexSelectVjp {
  std::shared_ptr<IndexArray> keep;
  std::size_t outer, inner, len;
  Cotangents operator()(const VjpContext& c) const {
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
  }
};

struct GatherVjp {
  std::shared_ptr<std::vector<std::size_t>> offsets;
  Cotangents operator()(const VjpContext& c) const {
    return Cotangents{scatter_offsets(c.grad_output, c.inputs[0].shape(), *offsets)};
  }
};

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
  return record("index_select", std::move(out), {x}, IndexSelectVjp{keep, outer, inner, len},
                second_order([](const DiffVjpContext& c) {
                  const IndexSelectVjp& v = c.first_order_as<IndexSelectVjp>();
                  return DiffCotangents{scatter_recorded(c.grad_output, c.inputs[0].shape(),
                                                         select_offsets(*v.keep, v.outer, v.inner, v.len))};
                }));
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
  return record("gather", std::move(out), {x}, GatherVjp{offsets}, second_order([](const DiffVjpContext& c) {
                  return DiffCotangents{scatter_recorded(c.grad_output, c.inputs[0].shape(),
                                                         c.first_order_as<GatherVjp>().offsets)};
                }));
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
