// Unary elementwise ops. Forward and VJP side by side in ops/unary.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);   // x < 0 is a ValueError; log(0) = -inf
Tensor sqrt(const Tensor& x);  // x < 0 is a ValueError
Tensor pow(const Tensor& x, double p);  // negative base with non-integer p is a ValueError
Tensor abs(const Tensor& x);   // d|x|/dx = sign(x), 0 at x = 0
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);  // derivative 0 at x = 0 (as PyTorch)

enum class GeluApprox { none, tanh };  // none: exact x * Phi(x) with erf
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::none);

// Clamp into [lo, hi]; gradient passes where lo <= x <= hi (as PyTorch), else 0.
Tensor clamp(const Tensor& x, double lo, double hi);

}  // namespace xg::ops
