// Array-level kernels: plain (non-differentiable) computations on Arrays, shared by the
// forward passes and the VJPs in ops/. Operands must already be checked (same dtype,
// broadcastable shapes); the differentiable ops in ops/ do those checks and name the op.
#pragma once

#include <vector>

#include <xgrad/core/array.hpp>

namespace xg::kernels {

// NumPy-broadcasting binary arithmetic.
Array add(const Array& a, const Array& b);
Array sub(const Array& a, const Array& b);
Array mul(const Array& a, const Array& b);
Array div(const Array& a, const Array& b);
Array scale(const Array& a, double s);  // a * s
// a + s, a - s and a / s, s converted to a's dtype first: the values of add, sub and div
// against a 0-d array holding s, without making one.
Array add_scalar(const Array& a, double s);
Array sub_scalar(const Array& a, double s);
Array div_scalar(const Array& a, double s);
// Additive masking with broadcasting of bias against x: bias == -inf gives -inf (whatever x
// is), otherwise x + bias. And its VJP before un-broadcasting: g where bias != -inf, else 0.
Array masked_add(const Array& x, const Array& bias);
Array masked_grad(const Array& g, const Array& bias);

// The one helper that undoes broadcasting: sums g over the axes along which an input of
// shape `target` was broadcast, giving an array of shape `target`.
Array sum_to_shape(const Array& g, const Shape& target);

// Shape after reducing sorted, distinct `axes` (kept as size 1 with keepdims).
Shape reduced_shape(const Shape& s, const std::vector<std::size_t>& axes, bool keepdims);

Array broadcast_to(const Array& a, const Shape& shape);
Array permute(const Array& a, const std::vector<std::size_t>& perm);
Array transpose_last2(const Array& a);

// out = cond ? a : b, elementwise with broadcasting of all three (cond: 0/1 bytes with
// shape cond_shape). A selected-away value never reaches the result, NaN included.
Array select(const std::vector<unsigned char>& cond, const Shape& cond_shape, const Array& a,
             const Array& b);

}  // namespace xg::kernels
