/// \file
/// Layer normalisation over the last axis. ops/layer_norm.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis of `x` (population
/// variance, as torch.nn.LayerNorm). `gamma` and `beta` have shape [D] or are undefined (no
/// affine part); `eps` is added to the variance.
/// One op with a hand-written VJP (ops/layer_norm.cpp).
Tensor layer_norm(const Tensor& x, const Tensor& gamma = Tensor(), const Tensor& beta = Tensor(),
                  double eps = 1e-5);

/// The same function (same arguments) composed from mean, sub, mul, sqrt and div (the tape
/// derives its VJP): the oracle the fused op is tested against.
Tensor layer_norm_composed(const Tensor& x, const Tensor& gamma = Tensor(), const Tensor& beta = Tensor(),
                           double eps = 1e-5);

}  // namespace xg::ops
