/// \file
/// xtensor at the door: xgrad Arrays as xtensor expressions, and Arrays and Tensors from any
/// xtensor expression. Optional: this is the only installed header that includes xtensor, so
/// a program that never includes it never parses xtensor (and needs no xtensor at all). A
/// program that does includes it as `<xgrad/xtensor.hpp>` and puts xtensor on its include
/// path (CMake: `find_package(xtensor)` and link `xtensor`; docs/install.md).
///
/// - as_xtensor<T>(array): a zero-copy view of the Array's data as an xtensor expression with
///   the Array's shape and row-major strides; writes through a mutable view are seen by every
///   Array sharing the data, and the reverse. T must be the Array's element type (`float` for
///   float32, `double` for float64; DTypeError otherwise).
/// - from_xtensor(expression [, dtype]): a new Array holding the values of any xtensor
///   expression (an xt::xarray or xt::xtensor in either layout, a strided or transposed view,
///   a lazy expression such as `a + 2.0 * b`), evaluated once, straight into the Array's own
///   row-major buffer. tensor_from_xtensor does the same for a Tensor (a leaf).
///
/// No xtensor object crosses into the xgrad library: everything here is an inline template
/// over the public Array API, so it does not matter whether the program defines
/// XTENSOR_USE_XSIMD (xgrad's own build does).
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>

#include <xtensor/xadapt.hpp>
#include <xtensor/xexpression.hpp>
#include <xtensor/xnoalias.hpp>

#include <xgrad/core/array.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/shape.hpp>
#include <xgrad/core/tensor.hpp>

namespace xg {

/// \cond INTERNAL
namespace xtensor_door {

template <class T> struct dtype_for {
  static_assert(std::is_same<T, float>::value || std::is_same<T, double>::value,
                "xgrad arrays hold float (float32) or double (float64)");
};
template <> struct dtype_for<float> { static constexpr DType value = DType::float32; };
template <> struct dtype_for<double> { static constexpr DType value = DType::float64; };

// The Array `a` checked for a view of element type T: defined, and of T's dtype.
template <class T> void check_view(const char* op, const Array& a) {
  if (!a.defined()) throw ValueError(op_message(op, "the array is undefined (default-constructed)"));
  const DType want = dtype_for<T>::value;
  if (a.dtype() != want)
    throw DTypeError(op_message(op, std::string("the array is ") + dtype_name(a.dtype()) + ", the view asks for " +
                                        dtype_name(want) + " elements: use " +
                                        (a.dtype() == DType::float32 ? "as_xtensor<float>" : "as_xtensor<double>") +
                                        ", or convert first with astype()"));
}

}  // namespace xtensor_door
/// \endcond

/// A zero-copy, writable xtensor view of `a` (an xt::xarray_adaptor over its data) with a's
/// shape and row-major strides. T is `float` for a float32 array, `double` for float64
/// (DTypeError otherwise; ValueError for an undefined array). Write only into an Array you
/// own: never into one an op produced or the tape saved (core/array.hpp). The view is valid
/// while some Array holds the data.
template <class T> auto as_xtensor(Array& a) {
  xtensor_door::check_view<T>("as_xtensor", a);
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(), a.shape());
}

/// A zero-copy, read-only xtensor view of `a` (an xt::xarray_adaptor over its const data);
/// as above.
template <class T> auto as_xtensor(const Array& a) {
  xtensor_door::check_view<T>("as_xtensor", a);
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(), a.shape());
}

/// A zero-copy, read-only xtensor view of a Tensor's value (a Tensor's value is never
/// written); as above. ValueError for an undefined tensor.
template <class T> auto as_xtensor(const Tensor& t) {
  if (!t.defined()) throw ValueError(op_message("as_xtensor", "the tensor is undefined (default-constructed)"));
  return as_xtensor<T>(static_cast<const Array&>(t.value()));
}

/// A new Array of `dtype` holding the values of the xtensor expression `e` (any expression:
/// a container of either layout, a view, a lazy expression), converted to `dtype` if its
/// value type differs (integer expressions too). The expression is evaluated once, into the
/// Array's buffer; its shape becomes the Array's.
template <class E> Array from_xtensor(const xt::xexpression<E>& e, DType dtype) {
  const E& expr = e.derived_cast();
  using V = typename E::value_type;
  static_assert(std::is_arithmetic<V>::value, "from_xtensor: the expression's values must be numbers");
  if (dtype != DType::float32 && dtype != DType::float64)
    throw DTypeError(op_message("from_xtensor", "dtype must be float32 or float64, got the value " +
                                                    std::to_string(static_cast<int>(dtype))));
  const Shape shape(expr.shape().begin(), expr.shape().end());
  Array out = Array::empty(shape, dtype);
  if (dtype == DType::float32) {
    auto view = as_xtensor<float>(out);
    xt::noalias(view) = expr;
  } else {
    auto view = as_xtensor<double>(out);
    xt::noalias(view) = expr;
  }
  return out;
}

/// A new Array holding the values of the xtensor expression `e`, float32 for `float` values
/// and float64 for `double` (other value types: pass a DType, a compile-time error here).
template <class E> Array from_xtensor(const xt::xexpression<E>& e) {
  using V = std::decay_t<typename E::value_type>;
  static_assert(std::is_same<V, float>::value || std::is_same<V, double>::value,
                "from_xtensor(e): the expression's values are neither float nor double; pass the DType "
                "to convert to: from_xtensor(e, xg::DType::float32)");
  return from_xtensor(e, xtensor_door::dtype_for<V>::value);
}

/// A new leaf Tensor holding the values of the xtensor expression `e` (as from_xtensor(e)),
/// requiring grad if `requires_grad`.
template <class E> Tensor tensor_from_xtensor(const xt::xexpression<E>& e, bool requires_grad = false) {
  return Tensor(from_xtensor(e), requires_grad);
}

/// A new leaf Tensor of `dtype` holding the values of `e` (as from_xtensor(e, dtype)),
/// requiring grad if `requires_grad`.
template <class E> Tensor tensor_from_xtensor(const xt::xexpression<E>& e, DType dtype, bool requires_grad = false) {
  return Tensor(from_xtensor(e, dtype), requires_grad);
}

}  // namespace xg
