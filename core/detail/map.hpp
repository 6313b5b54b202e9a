// Internal: elementwise maps over contiguous Arrays of one dtype (no broadcasting).
#pragma once

#include <xgrad/core/parallel.hpp>
#include <xgrad/core/detail/storage.hpp>

namespace xg::detail {

// out[i] = f(a[i]); f is called with T-typed values, from several threads (it must be pure).
template <class F> Array map1(const Array& a, F f) {
  Array out = Array::empty(a.shape(), a.dtype());
  dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* p = a.data<T>();
    T* o = out.data<T>();
    parallel_for(a.size(), std::size_t{1} << 14, [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t i = lo; i < hi; ++i) o[i] = f(p[i]);
    });
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
    parallel_for(a.size(), std::size_t{1} << 14, [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t i = lo; i < hi; ++i) o[i] = f(pa[i], pb[i]);
    });
  });
  return out;
}

}  // namespace xg::detail
