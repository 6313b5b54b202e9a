/// \file
/// Mask ops built on select, never on multiply: a NaN or Inf at a forbidden position can
/// never reach the result or the gradient. ops/mask.cpp. (Attention's polarity-safe
/// visibility types are built on these.)
#pragma once

#include <string>

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// Additive mask (5.11): out = x + bias, bias 0 = allowed, -inf = forbidden, a finite
/// negative value = a soft bias. `bias` broadcasts to x and is a constant. At -inf positions
/// the result is exactly -inf whatever x holds there, and x's gradient there is exactly 0.
Tensor add_mask(const Tensor& x, const Array& bias);

/// Throws ValueError naming `op` and the position if an additive `bias` holds NaN or +inf
/// (allowed values: finite, or -inf for forbidden).
void check_additive_bias(const std::string& op, const Array& bias);

/// out = fill_where ? value : x (torch.masked_fill polarity: true means "replace");
/// `fill_where` broadcasts to x.
Tensor masked_fill(const Tensor& x, const BoolArray& fill_where, double value);

}  // namespace xg::ops
