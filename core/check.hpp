/// \file
/// Entry checks shared by ops. Each takes the op name and argument names so the message
/// says which call and which argument is wrong, and shows the shapes involved.
#pragma once

#include <string>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tensor.hpp>

/// Entry checks for ops (built-in and custom): each names the op and the argument in its error.
namespace xg::check {

/// ValueError "[op] name is an undefined Tensor" unless `t` (argument `name` of op `op`) is defined.
inline void defined(const std::string& op, const std::string& name, const Tensor& t) {
  if (!t.defined()) throw ValueError(op_message(op, name + " is an undefined Tensor"));
}

/// Tensors `a` and `b` (arguments `a_name`, `b_name` of op `op`) must be defined and share a
/// dtype; DTypeError naming both, with their dtypes and shapes, otherwise.
inline void same_dtype(const std::string& op, const std::string& a_name, const Tensor& a,
                       const std::string& b_name, const Tensor& b) {
  defined(op, a_name, a);
  defined(op, b_name, b);
  if (a.dtype() != b.dtype())
    throw DTypeError(op_message(op, "dtypes differ: " + a_name + " is " + dtype_name(a.dtype()) +
                                        " with shape " + shape_str(a.shape()) + ", " + b_name +
                                        " is " + dtype_name(b.dtype()) + " with shape " +
                                        shape_str(b.shape())));
}

/// Tensor `t` (argument `name` of op `op`) must be defined with at least `n` dimensions;
/// ShapeError with its shape otherwise.
inline void rank_at_least(const std::string& op, const std::string& name, const Tensor& t,
                          std::size_t n) {
  defined(op, name, t);
  if (t.ndim() < n)
    throw ShapeError(op_message(op, name + " must have at least " + std::to_string(n) +
                                        " dimension(s), has shape " + shape_str(t.shape())));
}

/// Tensor `t` (argument `name` of op `op`) must be defined with exactly `n` dimensions;
/// ShapeError with its shape otherwise.
inline void rank(const std::string& op, const std::string& name, const Tensor& t, std::size_t n) {
  defined(op, name, t);
  if (t.ndim() != n)
    throw ShapeError(op_message(op, name + " must have " + std::to_string(n) +
                                        " dimension(s), has shape " + shape_str(t.shape())));
}

/// Shapes `a` and `b` (of arguments `a_name`, `b_name` of op `op`) must be equal; ShapeError
/// naming both with their shapes otherwise.
inline void same_shape(const std::string& op, const std::string& a_name, const Shape& a,
                       const std::string& b_name, const Shape& b) {
  if (a != b)
    throw ShapeError(op_message(op, "shapes differ: " + a_name + " has shape " + shape_str(a) +
                                        ", " + b_name + " has shape " + shape_str(b)));
}

}  // namespace xg::check
