/// \file
/// Joining and cutting along an axis: concat, slice, split, chunk. ops/join.cpp.
#pragma once

#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// The tensors `xs` (at least one) joined along `axis`. All inputs share dtype and every
/// dimension but `axis`.
Tensor concat(const std::vector<Tensor>& xs, int axis);

/// x[start:stop:step] along `axis`, Python semantics for negative and out-of-range start/stop;
/// step must be positive.
Tensor slice(const Tensor& x, int axis, long start, long stop, long step = 1);

/// Pieces of x of the given `sizes` along `axis`; the sizes must add up to the axis length.
std::vector<Tensor> split(const Tensor& x, const std::vector<std::size_t>& sizes, int axis);
/// `n` equal pieces of x along `axis`; the axis length must be divisible by n.
std::vector<Tensor> chunk(const Tensor& x, std::size_t n, int axis);

}  // namespace xg::ops
