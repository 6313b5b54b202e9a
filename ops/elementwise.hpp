/// \file
/// Binary elementwise ops with NumPy broadcasting, and select. Forward and VJP side by side
/// in ops/elementwise.cpp; broadcasting is undone by kernels::sum_to_shape.
#pragma once

#include <xgrad/core/tensor.hpp>

/// Differentiable operations: each computes its forward value and records its VJP on the
/// current tape (core/tape.hpp). Operands must share a dtype; shapes broadcast as in NumPy
/// where an op says so.
namespace xg::ops {

/// a + b, elementwise with broadcasting.
Tensor add(const Tensor& a, const Tensor& b);
/// a - b, elementwise with broadcasting.
Tensor sub(const Tensor& a, const Tensor& b);
/// a * b, elementwise with broadcasting.
Tensor mul(const Tensor& a, const Tensor& b);
/// a / b, elementwise with broadcasting; 0/0 is a ValueError.
Tensor div(const Tensor& a, const Tensor& b);

/// out = cond ? a : b (cond broadcasts with a and b; not differentiable). Gradients are
/// selected too, so a NaN or Inf in the unselected branch never reaches the result or any
/// gradient.
Tensor where(const BoolArray& cond, const Tensor& a, const Tensor& b);

/// A constant scalar tensor holding `value` with x's dtype.
Tensor scalar_like(const Tensor& x, double value);

}  // namespace xg::ops

namespace xg {

/// ops::add(a, b).
Tensor operator+(const Tensor& a, const Tensor& b);
/// ops::sub(a, b).
Tensor operator-(const Tensor& a, const Tensor& b);
/// ops::mul(a, b).
Tensor operator*(const Tensor& a, const Tensor& b);
/// ops::div(a, b).
Tensor operator/(const Tensor& a, const Tensor& b);
/// ops::neg(a).
Tensor operator-(const Tensor& a);
// The forms with a number: `s` is rounded to a's dtype, and the values and gradients are those
// of the binary op against ops::scalar_like(a, s), bit for bit. All but s - a and s / a are
// recorded as one op with one input (the number is a constant), not as a 0-d tensor and a
// broadcast.

/// a + s, the scalar `s` in a's dtype.
Tensor operator+(const Tensor& a, double s);
/// a - s, the scalar `s` in a's dtype.
Tensor operator-(const Tensor& a, double s);
/// a * s, the scalar `s` in a's dtype.
Tensor operator*(const Tensor& a, double s);
/// a / s, the scalar `s` in a's dtype.
Tensor operator/(const Tensor& a, double s);
/// s + a, the scalar `s` in a's dtype.
Tensor operator+(double s, const Tensor& a);
/// s - a, the scalar `s` in a's dtype.
Tensor operator-(double s, const Tensor& a);
/// s * a, the scalar `s` in a's dtype.
Tensor operator*(double s, const Tensor& a);
/// s / a, the scalar `s` in a's dtype.
Tensor operator/(double s, const Tensor& a);

}  // namespace xg
