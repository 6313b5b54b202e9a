// Linked into every xgrad benchmark program (bench/CMakeLists.txt): adds the GEMM kernels xgrad
// chose on this CPU to the program's header (bench::print_library_lines, after the OpenBLAS core).
#include "bench/common.hpp"
#include <xgrad/core/runtime.hpp>
#include <xgrad/nn/sdpa.hpp>

namespace {

struct Register {
  Register() {
    bench::add_header_lines([] {
      return std::vector<std::string>{"float32 GEMM: " + xg::float32_gemm_kernels(),
                                      "float32 matrix-vector: " + xg::float32_gemv_kernels(),
                                      "float64 GEMM: " + xg::float64_gemm_kernels(),
                                      "bfloat16 products: " + xg::bfloat16_gemm_kernels(),
                                      "bfloat16 attention: " + xg::nn::bfloat16_attention_kernels()};
    });
  }
} const register_lines;

}  // namespace
