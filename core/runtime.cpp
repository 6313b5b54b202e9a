#include <xgrad/core/runtime.hpp>

#include <string>

#include <xgrad/core/error.hpp>

#include <xgrad/core/detail/bf16_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/parallel.hpp>

namespace xg::detail {
void set_pool_threads(int n);
int configured_pool_threads();
}  // namespace xg::detail

namespace xg {

void set_num_threads(int n) {
  if (n < 1) throw ValueError(op_message("set_num_threads", "n must be >= 1, got " + std::to_string(n)));
  detail::set_pool_threads(n);
}

int num_threads() { return detail::configured_pool_threads(); }

void set_max_isa(const std::string& isa) { blas::set_max_isa(isa); }

std::string float32_gemm_kernels() {
  const blas::Backend b = blas::sgemm_backend();
  return b == blas::Backend::onednn ? std::string(blas::backend_name(b)) + " " + blas::sgemm_isa()
                                    : std::string(blas::backend_name(b));
}

std::string float64_gemm_kernels() {
  return std::string(blas::f64_kernel_name(blas::dgemm_kernel())) + " (" + blas::dgemm_reason() + ")";
}

std::string float32_gemv_kernels() {
  return std::string(blas::gemv_kernel_name(blas::sgemv_kernel())) + " (" + blas::sgemv_reason() + ")";
}

std::string bfloat16_gemm_kernels() {
  const std::string why_not = blas::bf16_unavailable_reason();
  if (!why_not.empty()) return "none (" + why_not + ")";
  const blas::Bf16Kernel k = blas::bf16_kernel();
  return std::string(blas::bf16_kernel_name(k)) + (k == blas::Bf16Kernel::onednn ? " " + blas::bf16::onednn_impl() : "") +
         " (" + blas::bf16_kernel_reason() + ")";
}

std::string openblas_core() { return blas::openblas_corename(); }

std::string openblas_config() { return blas::openblas_config(); }

void set_blas_threads(int n) { set_num_threads(n); }

void tune_allocator_for_training() {}

}  // namespace xg
