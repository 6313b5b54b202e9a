// Internal: an Array's storage descriptor and the dtype dispatch every kernel uses. No
// xtensor here: most of the engine's translation units need only this (core/detail/xt.hpp adds the
// xtensor adaptors for the few kernels that use xtensor; docs/architecture.md).
#pragma once

#include <memory>

#include <xgrad/core/array.hpp>

namespace xg::detail {

// An Array's storage: a shape and a contiguous row-major buffer from the caching allocator
// (core/allocator.hpp). Several Storages may share one buffer (Array::view): reshapes cost
// no copy. Nothing writes into a buffer once an op has produced it. The reference count its
// Arrays share comes first (StorageCount, core/array.hpp); the fields fit one cache line and
// the inline buffer the next: 128 bytes.
struct Storage : StorageCount {
  Shape shape;
  DType dtype = DType::float32;
  std::size_t size = 0;
  void* ptr = nullptr;  // small, a buffer of size elements this Storage owns, or base's buffer
  Array base;           // a view: the Array whose buffer ptr points into (undefined otherwise)
  // Arrays of up to 64 bytes live here: no allocation. 64-byte aligned as the allocator's blocks
  // are (core/allocator.cpp): xtensor's SIMD assignment splits an array at its first aligned
  // address, and the scalar and vector paths of exp and tanh differ in the last bit, so the same
  // values must meet the same split wherever the descriptor lies (`new` honours the alignment).
  alignas(64) unsigned char small[64];

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  static Array make(const Shape& shape, DType dtype);  // uninitialised
  static Array view(const Array& a, const Shape& shape);
  // `shape`'s elements of a's buffer from element `offset` on (ShapeError where they do not
  // fit), sharing it as view() does: Module::pack_parameters' parameters.
  static Array view_at(const Array& a, std::size_t offset, const Shape& shape);
};

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::float32; }
template <> constexpr DType dtype_of<double>() { return DType::float64; }

// Calls f(T{}) with T = float or double according to dtype.
template <class F> decltype(auto) dispatch(DType dtype, F&& f) {
  if (dtype == DType::float32) return f(float{});
  return f(double{});
}

}  // namespace xg::detail
