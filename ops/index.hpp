/// \file
/// Integer indexing: index_select, gather, embedding. Index arrays are not differentiable;
/// they are captured by the VJP. Out-of-range indices are errors naming the position.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// Rows of x along `axis` picked by a 1-d index `idx`: out.shape = x.shape with shape[axis] =
/// idx.size. Repeated indices are allowed (their gradients add).
Tensor index_select(const Tensor& x, int axis, const IndexArray& idx);

/// torch.gather: `idx` has x's rank; out[i..., j, k...] = x[i..., idx[i..., j, k...], k...]
/// with j on `axis`; idx's other dimensions may not exceed x's.
Tensor gather(const Tensor& x, int axis, const IndexArray& idx);

/// Embedding lookup: rows of `weight` [V_vocab, D] picked by `ids` of any shape -> ids.shape
/// + [D]. Each id must be in [0, V_vocab).
Tensor embedding(const Tensor& weight, const IndexArray& ids);

}  // namespace xg::ops
