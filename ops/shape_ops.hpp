// Shape ops: reshape, transpose/permute, broadcast_to, squeeze/unsqueeze. ops/shape_ops.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

// One entry may be -1 (inferred), as in PyTorch.
Tensor reshape(const Tensor& x, const std::vector<long>& shape);
Tensor transpose(const Tensor& x, int axis0 = -2, int axis1 = -1);
Tensor permute(const Tensor& x, const std::vector<int>& dims);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor squeeze(const Tensor& x, int axis);  // the axis must have size 1
Tensor unsqueeze(const Tensor& x, int axis);  // axis in [-(ndim+1), ndim]

}  // namespace xg::ops
