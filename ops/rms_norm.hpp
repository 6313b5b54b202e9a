/// \file
/// Root-mean-square normalisation over the last axis (Llama's RMSNorm). ops/rms_norm.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// y = x / sqrt(mean(x^2) + eps) * weight over the last axis of `x` (Zhang and Sennrich 2019;
/// no mean subtraction, no bias, as Llama and llama2.c). `weight` has shape [D] or is
/// undefined (no scale); `eps` must be positive and finite and is added to the mean square,
/// so a row of zeros gives zeros. float32 or float64; x and weight share the dtype.
/// One op with a hand-written VJP (ops/rms_norm.cpp).
Tensor rms_norm(const Tensor& x, const Tensor& weight = Tensor(), double eps = 1e-5);

/// The same function (same arguments and checks) composed from mul, mean, add, sqrt and div
/// (the tape derives its VJP): the oracle the fused op is tested against.
Tensor rms_norm_composed(const Tensor& x, const Tensor& weight = Tensor(), double eps = 1e-5);

}  // namespace xg::ops
