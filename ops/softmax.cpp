// Forward (5.11), stable (SPEC 1.2):  a = exp(u - c) / z,  c = max u,  z = sum exp(u - c) >= 1
// VJP (5.25):                         u_bar = a * (a_bar - sum(a * a_bar))
//   Each row of u_bar sums to zero because J 1 = 0 (5.24, exercise 5.4).
// log_softmax forward:                y = u - c - log z
// log_softmax VJP:                    u_bar = y_bar - exp(y) * sum(y_bar)
// Both VJPs need only the output, which the tape keeps; the closures capture the axis.
// Second-order rules: the same formulas with recorded ops on the recorded output.
#include <xgrad/ops/softmax.hpp>

#include <cmath>
#include <limits>

#include <xgrad/core/check.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/unary.hpp>

namespace xg::ops {

namespace {

// Computes softmax (log_space = false) or log-softmax into y, row by row.
template <class T>
void forward_rows(const std::string& op, const Shape& shape, const AxisSplit& r, const T* u, T* y,
                  bool log_space) {
  for (std::size_t o = 0; o < r.outer; ++o)
    for (std::size_t i = 0; i < r.inner; ++i) {
      const T* ur = u + o * r.len * r.inner + i;
      T* yr = y + o * r.len * r.inner + i;
      T c = -std::numeric_limits<T>::infinity();
      for (std::size_t s = 0; s < r.len; ++s) {
        const T v = ur[s * r.inner];
        if (std::isnan(v) || v == std::numeric_limits<T>::infinity())
          throw ValueError(op_message(op, "u has " + std::to_string(v) + " in row " +
                                              std::to_string(o * r.inner + i) + " (shape " +
                                              shape_str(shape) + "); softmax needs finite or -inf scores"));
        c = std::max(c, v);
      }
      if (c == -std::numeric_limits<T>::infinity())
        throw ValueError(op_message(op, "row " + std::to_string(o * r.inner + i) + " of u (shape " +
                                            shape_str(shape) +
                                            ") has no finite entry: every position is masked"));
      T z = 0;
      for (std::size_t s = 0; s < r.len; ++s) {
        const T e = std::exp(ur[s * r.inner] - c);
        yr[s * r.inner] = e;
        z += e;
      }
      if (log_space) {
        const T lz = std::log(z);
        for (std::size_t s = 0; s < r.len; ++s) yr[s * r.inner] = ur[s * r.inner] - c - lz;
      } else {
        const T inv = T(1) / z;
        for (std::size_t s = 0; s < r.len; ++s) yr[s * r.inner] *= inv;
      }
    }
}

Tensor run(const std::string& op, const Tensor& u, int axis, bool log_space) {
  check::rank_at_least(op, "u", u, 1);
  const std::size_t ax = normalize_axis(op, "axis", axis, u.ndim());
  const AxisSplit r = split_at_axis(u.shape(), ax);  // u as [outer, S, inner]
  if (r.len == 0 && r.outer * r.inner > 0)  // rows exist but have no entries
    throw ShapeError(op_message(op, "axis " + std::to_string(axis) + " of u has length 0 (shape " +
                                        shape_str(u.shape()) + "): a softmax over no entries is undefined"));
  Array y = Array::empty(u.shape(), u.dtype());
  detail::dispatch(u.dtype(), [&](auto t) {
    using T = decltype(t);
    forward_rows<T>(op, u.shape(), r, u.value().data<T>(), y.data<T>(), log_space);
  });
  return record(op, std::move(y), {u}, [r, log_space](const VjpContext& c) {
    Array ub = Array::empty(c.output.shape(), c.output.dtype());
    detail::dispatch(c.output.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* y = c.output.data<T>();
      const T* g = c.grad_output.data<T>();
      T* d = ub.data<T>();
      for (std::size_t o = 0; o < r.outer; ++o)
        for (std::size_t i = 0; i < r.inner; ++i) {
          const std::size_t base = o * r.len * r.inner + i;
          T dot = 0;
          for (std::size_t s = 0; s < r.len; ++s) {
            const std::size_t k = base + s * r.inner;
            dot += log_space ? g[k] : y[k] * g[k];
          }
          for (std::size_t s = 0; s < r.len; ++s) {
            const std::size_t k = base + s * r.inner;
            d[k] = log_space ? g[k] - std::exp(y[k]) * dot  // log-softmax VJP
                             : y[k] * (g[k] - dot);          // (5.25)
          }
        }
    });
    return Cotangents{ub};
  }, second_order([ax = static_cast<int>(ax), log_space](const DiffVjpContext& c) {
    const Tensor &y = c.output, &g = c.grad_output;
    if (log_space) return DiffCotangents{g - exp(y) * sum(g, {ax}, true)};
    return DiffCotangents{y * (g - sum(g * y, {ax}, true))};
  }));
}

}  // namespace

Tensor softmax(const Tensor& u, int axis) { return run("softmax", u, axis, false); }
Tensor log_softmax(const Tensor& u, int axis) { return run("log_softmax", u, axis, true); }

}  // namespace xg::ops
