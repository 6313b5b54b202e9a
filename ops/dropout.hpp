/// \file
/// Inverted dropout with an explicit generator (SPEC 2). ops/dropout.cpp.
#pragma once

#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// The scaled keep mask m / q (q = 1 - p) of `shape` and `dtype`, drawn from `gen`: each
/// element is 1/q with probability q, else 0. p must be in [0, 1) (ValueError otherwise).
Array dropout_mask(const Shape& shape, double p, Generator& gen, DType dtype);

/// out = x * m / q with the mask drawn from `gen` with drop probability `p`. The backward
/// multiplies by the same m / q (never resampled). Identity (the same tensor, nothing drawn
/// from gen) when p == 0 or `training` is false. p must be in [0, 1) (ValueError otherwise;
/// p == 1 would scale by infinity).
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training = true);

/// Applies a given scaled mask `scaled_mask` (as produced by dropout_mask; x's shape and
/// dtype) to `x`; for code that must reuse or inspect the mask, such as the attention
/// reference gradients.
Tensor apply_dropout_mask(const Tensor& x, const Array& scaled_mask);

}  // namespace xg::ops
