/// \file
/// Internal: the checks Linear and MultiHeadAttention apply to an adapter before attaching it
/// (nn/adapter.hpp).
#pragma once

#include <string>

#include <xgrad/nn/adapter.hpp>

namespace xg::nn::detail {

/// ValueError if `adapter` is null, ShapeError if it does not map `d_in` -> `d_out`,
/// DTypeError if a parameter of it is not of `dtype`; each names `op` and `where` (the
/// projection, e.g. "the layer" or "projection q").
void check_adapter(const std::string& op, const std::string& where, const Adapter* adapter, std::size_t d_in,
                   std::size_t d_out, DType dtype);

}  // namespace xg::nn::detail
