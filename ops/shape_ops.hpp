/// \file
/// Shape ops: reshape, transpose/permute, broadcast_to, squeeze/unsqueeze. ops/shape_ops.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// x with the same elements in a new `shape`. One entry may be -1 (inferred), as in PyTorch.
Tensor reshape(const Tensor& x, const std::vector<long>& shape);
/// x with axes `axis0` and `axis1` swapped (by default the last two).
Tensor transpose(const Tensor& x, int axis0 = -2, int axis1 = -1);
/// x with its axes reordered: output axis i is input axis dims[i] (a permutation of all axes).
Tensor permute(const Tensor& x, const std::vector<int>& dims);
/// x broadcast (NumPy rules) to `shape`; the gradient sums over the broadcast axes.
Tensor broadcast_to(const Tensor& x, const Shape& shape);
/// x without axis `axis`, which must have size 1.
Tensor squeeze(const Tensor& x, int axis);
/// x with a new axis of size 1 at `axis`, in [-(ndim+1), ndim].
Tensor unsqueeze(const Tensor& x, int axis);

}  // namespace xg::ops
