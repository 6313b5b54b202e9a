#include "core/kernels.hpp"

#include <algorithm>

#include "core/strided.hpp"
#include "core/xt.hpp"

namespace xg::kernels {

namespace {

template <class F> Array binary(const Array& a, const Array& b, F f) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const Shape out_shape = sa == sb ? sa : broadcast_shapes("broadcast", "a", sa, "b", sb);
  Array out = Array::empty(out_shape, a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    if (sa == sb) {
      for (std::size_t i = 0, n = out.size(); i < n; ++i) po[i] = f(pa[i], pb[i]);
    } else if (b.size() == 1) {
      const T s = pb[0];
      for (std::size_t i = 0, n = out.size(); i < n; ++i) po[i] = f(pa[i], s);
    } else {
      detail::for_each_strided(out_shape, broadcast_strides(sa, out_shape),
                               broadcast_strides(sb, out_shape),
                               [&](std::size_t i, std::ptrdiff_t ia, std::ptrdiff_t ib) {
                                 po[i] = f(pa[ia], pb[ib]);
                               });
    }
  });
  return out;
}

}  // namespace

Array add(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x + y; }); }
Array sub(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x - y; }); }
Array mul(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x * y; }); }
Array div(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x / y; }); }

Array scale(const Array& a, double s) {
  Array out = Array::empty(a.shape(), a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* p = a.data<T>();
    T* o = out.data<T>();
    const T c = static_cast<T>(s);
    for (std::size_t i = 0, n = a.size(); i < n; ++i) o[i] = p[i] * c;
  });
  return out;
}

Array sum_to_shape(const Array& g, const Shape& target) {
  if (g.shape() == target) return g;
  // Checks that target broadcasts to g's shape (an engine invariant when called from VJPs).
  const Shape b = broadcast_shapes("sum_to_shape", "target", target, "gradient", g.shape());
  if (b != g.shape())
    throw InternalError(op_message("sum_to_shape", "target " + shape_str(target) +
                                                       " does not broadcast to gradient shape " +
                                                       shape_str(g.shape())));
  Array out = Array::zeros(target, g.dtype());
  detail::dispatch(g.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    const auto st = broadcast_strides(target, g.shape());
    detail::for_each_strided(g.shape(), st, st,
                             [&](std::size_t i, std::ptrdiff_t io, std::ptrdiff_t) {
                               po[io] += pg[i];
                             });
  });
  return out;
}

Shape reduced_shape(const Shape& s, const std::vector<std::size_t>& axes, bool keepdims) {
  Shape out;
  for (std::size_t d = 0; d < s.size(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced)
      out.push_back(s[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

Array broadcast_to(const Array& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  Array out = Array::empty(shape, a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.data<T>();
    T* po = out.data<T>();
    const auto st = broadcast_strides(a.shape(), shape);
    detail::for_each_strided(shape, st, st, [&](std::size_t i, std::ptrdiff_t ia, std::ptrdiff_t) {
      po[i] = pa[ia];
    });
  });
  return out;
}

Array permute(const Array& a, const std::vector<std::size_t>& perm) {
  const Shape& s = a.shape();
  Shape out_shape(s.size());
  const auto cs = contiguous_strides(s);
  std::vector<std::ptrdiff_t> st(s.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    out_shape[i] = s[perm[i]];
    st[i] = cs[perm[i]];
  }
  Array out = Array::empty(out_shape, a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.data<T>();
    T* po = out.data<T>();
    detail::for_each_strided(out_shape, st, st, [&](std::size_t i, std::ptrdiff_t ia, std::ptrdiff_t) {
      po[i] = pa[ia];
    });
  });
  return out;
}

Array transpose_last2(const Array& a) {
  std::vector<std::size_t> perm(a.ndim());
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return permute(a, perm);
}

Array select(const std::vector<unsigned char>& cond, const Shape& cond_shape, const Array& a,
             const Array& b) {
  const Shape ab = broadcast_shapes("select", "a", a.shape(), "b", b.shape());
  const Shape out_shape = broadcast_shapes("select", "condition", cond_shape, "values", ab);
  Array ba = broadcast_to(a, out_shape);
  Array bb = broadcast_to(b, out_shape);
  Array out = Array::empty(out_shape, a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = ba.data<T>();
    const T* pb = bb.data<T>();
    T* po = out.data<T>();
    const auto sc = broadcast_strides(cond_shape, out_shape);
    detail::for_each_strided(out_shape, sc, sc, [&](std::size_t i, std::ptrdiff_t ic, std::ptrdiff_t) {
      po[i] = cond[static_cast<std::size_t>(ic)] ? pa[i] : pb[i];
    });
  });
  return out;
}

}  // namespace xg::kernels
