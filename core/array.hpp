// Array: an n-d float32 or float64 array with the dtype known at run time. The data is an
// xtensor xarray (row-major, contiguous, so BLAS reads it without copies) held behind a
// shared pointer: copying an Array shares the data. xgrad never writes into an Array that
// an op has produced or recorded; ops allocate their results.
//
// xtensor itself stays out of this header (compile time); core/xt.hpp gives kernels and
// interested users the underlying xt::xarray<T>.
#pragma once

#include <iosfwd>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/core/shape.hpp>

namespace xg {

namespace detail {
struct Storage;
}

class Array {
 public:
  Array() = default;  // undefined (no data); see defined()

  // Uninitialised contents; every element is written by the caller.
  static Array empty(const Shape& shape, DType dtype);
  static Array zeros(const Shape& shape, DType dtype);
  static Array full(const Shape& shape, double value, DType dtype);
  static Array scalar(double value, DType dtype);
  static Array from_vector(const Shape& shape, const std::vector<double>& values, DType dtype);
  // Nested initializer lists: Array::of({{1, 2}, {3, 4}}); of3 for three levels (a separate
  // name, because {{1, 2}} would be ambiguous between two and three levels). Ragged lists
  // are an error. A column of one-element rows ({{1}, {2}}) is ambiguous in C++ with a
  // 1-d list: build it with from_vector.
  static Array of(std::initializer_list<double> v, DType dtype = default_dtype());
  static Array of(std::initializer_list<std::initializer_list<double>> v,
                  DType dtype = default_dtype());
  static Array of3(std::initializer_list<std::initializer_list<std::initializer_list<double>>> v,
                  DType dtype = default_dtype());

  bool defined() const { return static_cast<bool>(s_); }
  DType dtype() const;
  const Shape& shape() const;
  std::size_t ndim() const { return shape().size(); }
  std::size_t size() const;

  // Typed access; T must match dtype() (DTypeError otherwise).
  template <class T> T* data();
  template <class T> const T* data() const;

  double item() const;                                  // exactly one element
  double at(const std::vector<std::size_t>& idx) const;  // bounds-checked
  double flat(std::size_t i) const;                      // bounds-checked
  void set_flat(std::size_t i, double v);                // only for arrays you own
  std::vector<double> to_vector() const;

  Array clone() const;
  Array astype(DType dtype) const;
  Array reshaped(const Shape& shape) const;  // same data count required; copies
  // Same data count required; shares this array's data (no copy). Neither may then be written
  // through: the engine's rule for every array an op has produced.
  Array view(const Shape& shape) const;
  bool all_finite() const;
  // First non-finite element's flat index, or size() if all finite.
  std::size_t first_nonfinite() const;
  std::string str() const;  // nested-bracket text, up to a few hundred elements

  detail::Storage& storage();
  const detail::Storage& storage() const;

 private:
  explicit Array(std::shared_ptr<detail::Storage> s) : s_(std::move(s)) {}
  std::shared_ptr<detail::Storage> s_;
  friend struct detail::Storage;
};

// Largest |a - b| over all elements; shapes must match (ShapeError otherwise).
double max_abs_diff(const Array& a, const Array& b);

}  // namespace xg

namespace xg {

// Boolean array (conditions, masks): one byte per element, 0 or 1. Not differentiable.
// Masks whose polarity matters (attention visibility) wrap this in a named type instead.
struct BoolArray {
  Shape shape;
  std::vector<unsigned char> data;

  BoolArray() = default;
  BoolArray(Shape s, std::vector<unsigned char> d);  // sizes must agree (ShapeError)
  static BoolArray filled(Shape s, bool value);
  std::size_t size() const { return data.size(); }
};

// Integer index array (token ids, class targets, gather indices). Not differentiable.
struct IndexArray {
  Shape shape;
  std::vector<std::int64_t> data;

  IndexArray() = default;
  IndexArray(Shape s, std::vector<std::int64_t> d);  // sizes must agree (ShapeError)
  IndexArray(std::initializer_list<std::int64_t> v);  // 1-d
  std::size_t size() const { return data.size(); }
};

// Prints a.str(): nested brackets, 6 significant digits, shortened past a few hundred
// elements; "<undefined>" for an undefined Array.
std::ostream& operator<<(std::ostream& os, const Array& a);

}  // namespace xg
