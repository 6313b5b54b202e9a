/// \file
/// Reductions over any set of axes (empty = all axes), with keepdims. ops/reduce.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// Sum of x over `axes` (empty = all); reduced axes are kept with size 1 if `keepdims`.
Tensor sum(const Tensor& x, const Axes& axes = {}, bool keepdims = false);
/// x summed down to `shape`, the inverse of broadcasting: x's shape must be `shape` broadcast
/// (NumPy rules); the axes x was broadcast along are summed. The gradient broadcasts back.
/// (The reduction in every broadcasting op's VJP, as a recorded op for create_graph.)
Tensor sum_to(const Tensor& x, const Shape& shape);
/// Mean of x over `axes` (empty = all); reduced axes are kept with size 1 if `keepdims`.
Tensor mean(const Tensor& x, const Axes& axes = {}, bool keepdims = false);

/// Maximum of x over `axes` (empty = all), keeping reduced axes if `keepdims`. Tie rule: the
/// gradient is split equally among the elements that attain the maximum (as torch.amax and
/// jax.numpy.max), so the VJP is the same whatever order ties appear in. A NaN in a reduced
/// slice makes that maximum NaN.
Tensor max(const Tensor& x, const Axes& axes = {}, bool keepdims = false);

/// Variance sum((x - mean)^2) / (N - correction) over `axes` (empty = all), keeping reduced
/// axes if `keepdims`. correction = 1 (the default, as torch.var) is the unbiased estimate;
/// correction = 0 is the population variance (NumPy's and JAX's default, and what layer_norm
/// uses).
Tensor var(const Tensor& x, const Axes& axes = {}, int correction = 1, bool keepdims = false);

}  // namespace xg::ops
