/// \file
/// bfloat16 mixed precision for float32 matrix products (what PyTorch's autocast to bfloat16 does
/// to matmuls on a CPU). Off by default. When on, every float32 `ops::matmul` (forward and the
/// products of its backward pass, batched head matmuls included) rounds its two inputs to
/// bfloat16 (round to nearest even) and multiplies them with float32 accumulation on the CPU's
/// AVX512_BF16 dot-product instructions. Results, parameters, gradients, optimizer state and
/// every reduction stay float32; float64 is never affected. The fused attention (nn/sdpa.hpp)
/// runs its tile products with bfloat16 inputs on AMX tiles where they measure faster
/// (nn::bfloat16_attention_kernels()), else in float32. docs/performance.md, "bfloat16 mixed
/// precision".
#pragma once

#include <string>

namespace xg {

/// The precision of the inputs of float32 matrix products.
enum class MatmulDtype {
  float32,   ///< float32 inputs (the default).
  bfloat16,  ///< inputs rounded to bfloat16, float32 accumulation and result.
};

/// "float32" or "bfloat16".
std::string matmul_dtype_name(MatmulDtype d);

/// Sets the precision of float32 matrix products, process-wide (all threads). Where the CPU cannot
/// run bfloat16 products, or runs them slower than float32 (a short calibration at the first
/// bfloat16 request measures it; XGRAD_BF16_GEMM=on|off|auto forces the choice), the products
/// stay float32: effective_matmul_dtype() tells which, bfloat16_matmul_unavailable_reason() why. An op records the precision when it runs
/// forward; its backward products use the same.
void set_matmul_dtype(MatmulDtype d);
/// The precision set_matmul_dtype() asked for.
MatmulDtype matmul_dtype();
/// The precision float32 matrix products run in now: matmul_dtype(), or float32 where bfloat16
/// is unavailable.
MatmulDtype effective_matmul_dtype();

/// Empty when this CPU runs bfloat16 products; otherwise the one-line reason, e.g. "this CPU has
/// no AVX512_BF16 instructions", "the float32 kernels are capped at avx2 (XGRAD_ISA or
/// set_max_isa)" or "bfloat16 dot products measured at 0.38x the float32 FMA rate on this CPU
/// ...".
std::string bfloat16_matmul_unavailable_reason();

/// Sets the matmul precision for its lifetime and restores the previous one when it ends.
class MatmulDtypeScope {
 public:
  /// Sets `d` (set_matmul_dtype), remembering the precision set before.
  explicit MatmulDtypeScope(MatmulDtype d);
  /// Restores the precision set before.
  ~MatmulDtypeScope();
  /// Not copyable: one scope restores the precision once.
  MatmulDtypeScope(const MatmulDtypeScope&) = delete;
  /// Not copyable.
  MatmulDtypeScope& operator=(const MatmulDtypeScope&) = delete;

 private:
  MatmulDtype previous_;
};

}  // namespace xg
