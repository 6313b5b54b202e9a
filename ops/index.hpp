// Integer indexing: index_select, gather, embedding. Index arrays are not differentiable;
// they are captured by the VJP. Out-of-range indices are errors naming the position.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

// Rows of x along axis picked by a 1-d index: out.shape = x.shape with shape[axis] = idx.size.
Tensor index_select(const Tensor& x, int axis, const IndexArray& idx);

// torch.gather: idx has x's rank; out[i..., j, k...] = x[i..., idx[i..., j, k...], k...] with
// j on `axis`; idx's other dimensions may not exceed x's.
Tensor gather(const Tensor& x, int axis, const IndexArray& idx);

// Embedding lookup: weight [V_vocab, D], ids of any shape -> ids.shape + [D].
Tensor embedding(const Tensor& weight, const IndexArray& ids);

}  // namespace xg::ops
