// Layer normalisation over the last axis. ops/layer_norm.cpp.
#pragma once

#include "core/tensor.hpp"

namespace xg::ops {

// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis (population variance,
// as torch.nn.LayerNorm). gamma and beta have shape [D] or are undefined (no affine part).
Tensor layer_norm(const Tensor& x, const Tensor& gamma = Tensor(), const Tensor& beta = Tensor(),
                  double eps = 1e-5);

}  // namespace xg::ops
