/// \file
/// Softmax and log-softmax along an axis, numerically stable (SPEC 1.2: subtract the maximum
/// before exp), each with a dedicated VJP (5.24)-(5.25). ops/softmax.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// Softmax of `u` along `axis`: u [..., S] (any axis) -> a, rows sum to 1. -inf entries get
/// weight exactly 0 (additive masks). A row with no finite entry, or with +inf or NaN, is a
/// ValueError: it has no well-defined softmax and would otherwise turn into NaN.
Tensor softmax(const Tensor& u, int axis = -1);
/// log(softmax(u)) along `axis`, computed stably (u - max - log sum exp); the same row rules.
Tensor log_softmax(const Tensor& u, int axis = -1);

}  // namespace xg::ops
