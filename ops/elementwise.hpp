// Binary elementwise ops with NumPy broadcasting, and select. Forward and VJP side by side
// in ops/elementwise.cpp; broadcasting is undone by kernels::sum_to_shape.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

Tensor add(const Tensor& a, const Tensor& b);  // a + b
Tensor sub(const Tensor& a, const Tensor& b);  // a - b
Tensor mul(const Tensor& a, const Tensor& b);  // a * b
Tensor div(const Tensor& a, const Tensor& b);  // a / b; 0/0 is a ValueError

// out = cond ? a : b (cond broadcasts with a and b; not differentiable). Gradients are
// selected too, so a NaN or Inf in the unselected branch never reaches the result or any
// gradient.
Tensor where(const BoolArray& cond, const Tensor& a, const Tensor& b);

// A constant scalar tensor with x's dtype.
Tensor scalar_like(const Tensor& x, double value);

}  // namespace xg::ops

namespace xg {

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);

}  // namespace xg
