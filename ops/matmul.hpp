/// \file
/// Batched matrix product on OpenBLAS sgemm/dgemm, NumPy matmul semantics: a [..., M, K],
/// b [..., K, N] -> [..., M, N] with the leading (batch) dimensions broadcast; a 1-d a is a
/// row vector and a 1-d b a column vector (that dimension is dropped from the result).
/// transpose_a / transpose_b use the last two axes transposed, passed to BLAS as flags
/// rather than copied (matmul(Q, K, {false, true}) is Q K^T). ops/matmul.cpp.
#pragma once

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// Options of matmul(): operands read with their last two axes transposed.
struct MatmulOptions {
  bool transpose_a = false;  ///< Use a's last two axes transposed (no copy).
  bool transpose_b = false;  ///< Use b's last two axes transposed (no copy).
};

/// The matrix product a b (NumPy matmul semantics, see above), with the transposes `opts`.
Tensor matmul(const Tensor& a, const Tensor& b, MatmulOptions opts = {});

/// x W + b as one op (a linear layer's product and bias), plus a `residual` when given:
/// residual + (x W + b). x [..., K] (at least 2-d), W [K, N], b [N] (undefined: no bias), residual
/// of the output's shape [..., N] (undefined: none). The same values and gradients, bit for bit,
/// as add(residual, add(matmul(x, W), b)), without the adds' passes and arrays; other shapes (or
/// dtypes) go through matmul and add, which report bad input.
Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& residual = Tensor());

}  // namespace xg::ops
