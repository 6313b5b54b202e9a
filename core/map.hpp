// Internal: elementwise maps over contiguous Arrays of one dtype (no broadcasting).
#pragma once

#include "core/xt.hpp"

namespace xg::detail {

// out[i] = f(a[i]); f is called with T-typed values.
template <class F> Array map1(const Array& a, F f) {
  Array out = Array::empty(a.shape(), a.dtype());
  dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* p = a.data<T>();
    T* o = out.data<T>();
    for (std::size_t i = 0, n = a.size(); i < n; ++i) o[i] = f(p[i]);
  });
  return out;
}

// out[i] = f(a[i], b[i]); a and b have the same shape.
template <class F> Array map2(const Array& a, const Array& b, F f) {
  Array out = Array::empty(a.shape(), a.dtype());
  dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* o = out.data<T>();
    for (std::size_t i = 0, n = a.size(); i < n; ++i) o[i] = f(pa[i], pb[i]);
  });
  return out;
}

}  // namespace xg::detail
