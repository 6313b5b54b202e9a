/// \file
/// Unary elementwise ops. Forward and VJP side by side in ops/unary.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// -x.
Tensor neg(const Tensor& x);
/// e^x.
Tensor exp(const Tensor& x);
/// Natural logarithm of x: x < 0 is a ValueError; log(0) = -inf.
Tensor log(const Tensor& x);
/// Square root of x: x < 0 is a ValueError.
Tensor sqrt(const Tensor& x);
/// x to the power `p`: a negative base with non-integer p is a ValueError.
Tensor pow(const Tensor& x, double p);
/// |x|, with d|x|/dx = sign(x), 0 at x = 0.
Tensor abs(const Tensor& x);
/// Hyperbolic tangent of x.
Tensor tanh(const Tensor& x);
/// Logistic sigmoid 1 / (1 + e^-x).
Tensor sigmoid(const Tensor& x);
/// max(x, 0), with derivative 0 at x = 0 (as PyTorch).
Tensor relu(const Tensor& x);

/// Which GELU gelu() computes.
enum class GeluApprox { none, tanh };
/// \var GeluApprox::none
/// The exact x * Phi(x) with erf.
/// \var GeluApprox::tanh
/// The tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).

/// GELU of x, exact or approximated as `approx` says.
Tensor gelu(const Tensor& x, GeluApprox approx = GeluApprox::none);

/// gelu(x + b) (exact GELU) with the bias b [C] added along the last axis of x [..., C]: one
/// fused op (issue 21) that reads x once forward and once backward (keeping Phi(x + b) for the
/// VJP, as gelu() does) and gives b's cotangent (the column sums of x's) in the same pass.
/// bias_gelu_composed() is gelu(x + b) from the two ops: its test oracle.
Tensor bias_gelu(const Tensor& x, const Tensor& b);
/// gelu(x + b) from add and gelu (the oracle of bias_gelu()).
Tensor bias_gelu_composed(const Tensor& x, const Tensor& b);

/// SiLU (swish) x * sigmoid(x). Finite for every finite x (no exp overflow for large |x|);
/// silu(-inf) = 0 and silu(inf) = inf, with derivatives 0 and 1 there.
Tensor silu(const Tensor& x);

/// SwiGLU's gate, silu(a) * b, as one op with both gradients (Shazeer 2020; Llama's feed-forward
/// computes swiglu(x W_1, x W_3) W_2). `a` and `b` have the same shape (no broadcasting) and
/// dtype.
Tensor swiglu(const Tensor& a, const Tensor& b);

/// The same function composed from silu and mul (the tape derives its VJP): the oracle the
/// fused op is tested against.
Tensor swiglu_composed(const Tensor& a, const Tensor& b);

/// Clamp x into [lo, hi]; gradient passes where lo <= x <= hi (as PyTorch), else 0.
Tensor clamp(const Tensor& x, double lo, double hi);

}  // namespace xg::ops
