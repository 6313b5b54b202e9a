// The one place xgrad includes xtensor. Kernels (.cpp files) include this; public headers
// do not. Upgrading xtensor (0.26 moved headers into subfolders) touches only this file.
#pragma once

// xgrad's arrays use xtensor's SIMD-aligned allocator (xsimd). The macro changes the type
// xt::xarray<T> itself, so every translation unit must agree on it or the program mixes two
// allocators (an ODR violation AddressSanitizer reports as alloc-dealloc-mismatch). The xgrad
// target exports it publicly; this guard covers code that includes this header directly.
#ifndef XTENSOR_USE_XSIMD
#define XTENSOR_USE_XSIMD
#endif

#include <type_traits>
#include <variant>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include "core/array.hpp"
#include "core/error.hpp"

namespace xg {
namespace detail {

struct Storage {
  Shape shape;
  DType dtype;
  std::variant<xt::xarray<float>, xt::xarray<double>> data;

  static Array make(const Shape& shape, DType dtype);  // uninitialised
  template <class T> static Array wrap(xt::xarray<T>&& a);
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::float32; }
template <> constexpr DType dtype_of<double>() { return DType::float64; }

template <class T> Array Storage::wrap(xt::xarray<T>&& a) {
  auto s = std::make_shared<Storage>();
  s->shape.assign(a.shape().begin(), a.shape().end());
  s->dtype = dtype_of<T>();
  s->data = std::move(a);
  return Array(std::move(s));
}

// Calls f(T{}) with T = float or double according to dtype.
template <class F> decltype(auto) dispatch(DType dtype, F&& f) {
  if (dtype == DType::float32) return f(float{});
  return f(double{});
}

}  // namespace detail

// The xtensor array behind an Array (dtype must be T).
template <class T> xt::xarray<T>& xarray(Array& a) {
  return std::get<xt::xarray<T>>(a.storage().data);
}
template <class T> const xt::xarray<T>& xarray(const Array& a) {
  return std::get<xt::xarray<T>>(a.storage().data);
}
template <class T> Array from_xarray(xt::xarray<T> a) {
  return detail::Storage::wrap<T>(std::move(a));
}

// A 1-d xtensor view over an Array's contiguous data (for vectorised elementwise math).
template <class T> auto flat_view(Array& a) {
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(),
                   std::vector<std::size_t>{a.size()});
}
template <class T> auto flat_view(const Array& a) {
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(),
                   std::vector<std::size_t>{a.size()});
}

}  // namespace xg
