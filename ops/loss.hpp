// Losses: cross-entropy from logits and mean squared error. ops/loss.cpp.
#pragma once

#include <cstdint>

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;  // targets equal to this contribute nothing
  Array weights;  // optional per-target weights, shape of targets, >= 0
};

// logits [..., C], targets [...] with values in [0, C) or ignore_index. Returns the weighted
// mean of -log softmax(logits)[target] over non-ignored targets:
//   L = sum_i w_i * nll_i / sum_i w_i   (w_i = 1 without weights; torch's 'mean' reduction).
// If nothing is left to average (all ignored or zero weight) it is a ValueError, not NaN.
Tensor cross_entropy(const Tensor& logits, const IndexArray& targets,
                     const CrossEntropyOptions& opts = {});

// mean((a - b)^2); shapes must match exactly (no silent broadcasting of a loss).
Tensor mse(const Tensor& a, const Tensor& b);

}  // namespace xg::ops
