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

#include <algorithm>
#include <memory>
#include <type_traits>

#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include <xgrad/core/array.hpp>
#include <xgrad/core/error.hpp>

namespace xg {
namespace detail {

// An Array's storage: a shape and a contiguous row-major buffer from the caching allocator
// (core/allocator.hpp). Several Storages may share one buffer (Array::view): reshapes cost
// no copy. Nothing writes into a buffer once an op has produced it.
struct Storage {
  Shape shape;
  DType dtype = DType::float32;
  std::size_t size = 0;
  void* ptr = nullptr;
  std::size_t bytes = 0;               // of the buffer this Storage owns (0 for a view)
  std::shared_ptr<const Storage> base;  // a view: the Storage whose buffer ptr points into
  alignas(16) unsigned char small[64];  // arrays of up to 64 bytes live here: no allocation

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  static Array make(const Shape& shape, DType dtype);  // uninitialised
  static Array view(const Array& a, const Shape& shape);
  template <class T> static Array wrap(const xt::xarray<T>& a);
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::float32; }
template <> constexpr DType dtype_of<double>() { return DType::float64; }

template <class T> Array Storage::wrap(const xt::xarray<T>& a) {
  Array out = make(Shape(a.shape().begin(), a.shape().end()), dtype_of<T>());
  std::copy(a.begin(), a.end(), out.data<T>());
  return out;
}

// Calls f(T{}) with T = float or double according to dtype.
template <class F> decltype(auto) dispatch(DType dtype, F&& f) {
  if (dtype == DType::float32) return f(float{});
  return f(double{});
}

}  // namespace detail

// An xtensor view with the Array's shape over its data (no copy; dtype must be T).
template <class T> auto xarray(Array& a) {
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(), a.shape());
}
template <class T> auto xarray(const Array& a) {
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(), a.shape());
}
// A copy of an xtensor expression's values as an Array.
template <class T> Array from_xarray(const xt::xarray<T>& a) { return detail::Storage::wrap<T>(a); }

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
