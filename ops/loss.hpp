/// \file
/// Losses: cross-entropy from logits and mean squared error. ops/loss.cpp.
#pragma once

#include <cstdint>

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// Options of cross_entropy().
struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;  ///< Targets equal to this contribute nothing.
  Array weights;  ///< Optional per-target weights, shape of targets, >= 0 (undefined: all 1).
};

/// `logits` [..., C], `targets` [...] with values in [0, C) or ignore_index. Returns the
/// weighted mean of -log softmax(logits)[target] over non-ignored targets:
///     L = sum_i w_i * nll_i / sum_i w_i   (w_i = 1 without weights; torch's 'mean' reduction).
///
/// If nothing is left to average (all ignored or zero weight) it is a ValueError, not NaN.
/// `opts` sets ignore_index and weights.
Tensor cross_entropy(const Tensor& logits, const IndexArray& targets,
                     const CrossEntropyOptions& opts = {});
/// cross_entropy() composed from log_softmax, gather, mul and sum (the fused op's test oracle).
Tensor cross_entropy_composed(const Tensor& logits, const IndexArray& targets,
                              const CrossEntropyOptions& opts = {});

/// mean((a - b)^2); shapes of `a` and `b` must match exactly (no silent broadcasting of a loss).
Tensor mse(const Tensor& a, const Tensor& b);

}  // namespace xg::ops
