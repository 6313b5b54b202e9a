/// \file
/// Array: an n-d float32 or float64 array with the dtype known at run time. The data is a
/// row-major contiguous buffer (so BLAS reads it without copies; from the caching allocator,
/// core/allocator.hpp) held by a reference count: copying an Array shares the data. xgrad
/// never writes into an Array that an op has produced or recorded; ops allocate their results.
///
/// xtensor itself stays out of this header (compile time); the optional <xgrad/xtensor.hpp>
/// views an Array as an xtensor expression and builds Arrays from xtensor expressions.
#pragma once

#include <atomic>
#include <cstddef>
#include <iosfwd>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/core/shape.hpp>

namespace xg {

namespace detail {
struct Storage;
/// Internal: the reference count at the head of every Storage (core/detail/storage.hpp). An
/// Array counts its Storage in the descriptor itself: copying one touches no other memory, and
/// making one allocates no control block (as std::shared_ptr's custom-deleter form does).
struct StorageCount {
  std::atomic<std::size_t> refs{1};
};
/// Internal: gives back a Storage whose count reached zero (core/array.cpp).
void release_storage(StorageCount* s) noexcept;
}  // namespace detail

/// An n-d array of float32 or float64 values, row-major and contiguous, whose dtype is known
/// at run time. Copies share the data (a reference count); clone() copies it. An Array that an
/// op produced or the tape saved is never written to.
class Array {
 public:
  Array() = default;  ///< An undefined array (no data); see defined().
  /// Shares `o`'s data.
  Array(const Array& o) noexcept : s_(o.s_) {
    if (s_) s_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  /// Takes `o`'s data; `o` becomes undefined.
  Array(Array&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  /// Shares `o`'s data, letting go of this array's.
  Array& operator=(const Array& o) noexcept {
    if (o.s_) o.s_->refs.fetch_add(1, std::memory_order_relaxed);
    drop();
    s_ = o.s_;
    return *this;
  }
  /// Takes `o`'s data, letting go of this array's; `o` becomes undefined.
  Array& operator=(Array&& o) noexcept {
    if (this != &o) {
      drop();
      s_ = o.s_;
      o.s_ = nullptr;
    }
    return *this;
  }
  ~Array() { drop(); }  ///< Lets go of the data (freed with its last Array).

  /// An array of `shape` and `dtype` with uninitialised contents; every element is written by
  /// the caller.
  static Array empty(const Shape& shape, DType dtype);
  /// An array of `shape` and `dtype` filled with zeros.
  static Array zeros(const Shape& shape, DType dtype);
  /// An array of `shape` and `dtype` with every element equal to `value`.
  static Array full(const Shape& shape, double value, DType dtype);
  /// A 0-d array (shape ()) holding `value` in `dtype`.
  static Array scalar(double value, DType dtype);
  /// An array of `shape` and `dtype` holding `values` in row-major order; their count must be
  /// numel(shape) (ShapeError otherwise).
  static Array from_vector(const Shape& shape, const std::vector<double>& values, DType dtype);
  /// Nested initializer lists: Array::of({{1, 2}, {3, 4}}); of3 for three levels (a separate
  /// name, because {{1, 2}} would be ambiguous between two and three levels). Ragged lists
  /// are an error. A column of one-element rows ({{1}, {2}}) is ambiguous in C++ with a
  /// 1-d list: build it with from_vector. This overload: a 1-d array of the values `v` in
  /// `dtype`.
  static Array of(std::initializer_list<double> v, DType dtype = default_dtype());
  /// A 2-d array from the rows `v` (all of one length; ShapeError otherwise) in `dtype`.
  static Array of(std::initializer_list<std::initializer_list<double>> v,
                  DType dtype = default_dtype());
  /// A 3-d array from the nested lists `v` (matrices of one shape; ShapeError otherwise) in
  /// `dtype`.
  static Array of3(std::initializer_list<std::initializer_list<std::initializer_list<double>>> v,
                  DType dtype = default_dtype());

  /// Whether this array holds data (false for a default-constructed Array).
  bool defined() const { return s_ != nullptr; }
  /// Element type. The accessors below throw ValueError on an undefined array.
  DType dtype() const;
  /// Extents, outermost first.
  const Shape& shape() const;
  /// Number of dimensions (0 for a scalar).
  std::size_t ndim() const { return shape().size(); }
  /// Number of elements.
  std::size_t size() const;

  /// Typed pointer to the first element; T must match dtype() (DTypeError otherwise):
  /// `float` for float32, `double` for float64.
  template <class T> T* data();
  /// Typed read-only pointer to the first element; T must match dtype() (DTypeError otherwise).
  template <class T> const T* data() const;

  /// The value of an array with exactly one element (ShapeError otherwise).
  double item() const;
  /// The element at the multi-index `idx` (one index per dimension), bounds-checked
  /// (ShapeError).
  double at(const std::vector<std::size_t>& idx) const;
  /// The element at row-major position `i`, bounds-checked (ShapeError).
  double flat(std::size_t i) const;
  /// Writes `v` at row-major position `i` (bounds-checked). Only for arrays you own: never for
  /// one an op produced or the tape saved.
  void set_flat(std::size_t i, double v);
  /// Every element as double, row-major.
  std::vector<double> to_vector() const;

  /// A copy with its own data.
  Array clone() const;
  /// The values converted to `dtype`; this array itself (shared, no copy) if it already has it.
  Array astype(DType dtype) const;
  /// A copy with shape `shape`; the element count must be the same (ShapeError otherwise).
  Array reshaped(const Shape& shape) const;
  /// Same data count required; shares this array's data (no copy) under `shape`. Neither may
  /// then be written through: the engine's rule for every array an op has produced.
  Array view(const Shape& shape) const;
  /// Whether every element is finite (no NaN or infinity).
  bool all_finite() const;
  /// First non-finite element's flat index, or size() if all finite.
  std::size_t first_nonfinite() const;
  /// Nested-bracket text of the values, up to a few hundred elements ("<undefined>" for an
  /// undefined array).
  std::string str() const;

  /// Internal: the storage descriptor (shape, dtype, buffer), for xgrad's kernels
  /// (core/detail/storage.hpp).
  detail::Storage& storage();
  /// Internal: the storage descriptor, read-only.
  const detail::Storage& storage() const;

 private:
  explicit Array(detail::StorageCount* s) noexcept : s_(s) {}  // adopts s's count of 1
  void drop() noexcept {
    if (s_ && s_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) detail::release_storage(s_);
  }
  detail::Storage* st() const;  // s_ as its Storage (core/array.cpp)
  detail::StorageCount* s_ = nullptr;
  friend struct detail::Storage;
};

/// Largest |a - b| over all elements of `a` and `b` (NaN if any difference is NaN); shapes
/// must match (ShapeError otherwise).
double max_abs_diff(const Array& a, const Array& b);

}

namespace xg {

/// Boolean array (conditions, masks): one byte per element, 0 or 1. Not differentiable.
/// Masks whose polarity matters (attention visibility) wrap this in a named type instead.
struct BoolArray {
  Shape shape;                     ///< Extents, outermost first.
  std::vector<unsigned char> data;  ///< One byte per element, row-major: 0 or 1.

  BoolArray() = default;  ///< No elements (size() == 0): "not given" where an argument is optional.
  /// An array of shape `s` holding the flags `d` row-major (non-zero bytes become 1); the
  /// sizes must agree (ShapeError).
  BoolArray(Shape s, std::vector<unsigned char> d);
  /// An array of shape `s` with every element equal to `value`.
  static BoolArray filled(Shape s, bool value);
  /// Number of elements.
  std::size_t size() const { return data.size(); }
};

/// Integer index array (token ids, class targets, gather indices). Not differentiable.
struct IndexArray {
  Shape shape;                    ///< Extents, outermost first.
  std::vector<std::int64_t> data;  ///< The indices, row-major.

  IndexArray() = default;  ///< No elements (size() == 0).
  /// An array of shape `s` holding the indices `d` row-major; the sizes must agree
  /// (ShapeError).
  IndexArray(Shape s, std::vector<std::int64_t> d);
  /// A 1-d array of the indices `v`.
  IndexArray(std::initializer_list<std::int64_t> v);
  /// Number of elements.
  std::size_t size() const { return data.size(); }
};

/// Prints a.str() of Array `a` to `os`: nested brackets, 6 significant digits, shortened
/// past a few hundred elements; "<undefined>" for an undefined Array. Returns `os`.
std::ostream& operator<<(std::ostream& os, const Array& a);

}
