// Linked into every xgrad benchmark program (bench/CMakeLists.txt): adds the GEMM kernels xgrad
// chose on this CPU to the program's header (bench::print_library_lines, after the OpenBLAS core).
#include "bench/common.hpp"

#include <fstream>
#include <xgrad/core/runtime.hpp>
#include <xgrad/nn/sdpa.hpp>

namespace {

// "on (transparent huge pages: always [madvise] never)": xgrad's setting and the kernel's.
std::string huge_pages_line() {
  std::string thp;
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!in || !std::getline(in, thp)) thp = "not available";
  return std::string(xg::huge_pages() ? "on" : "off") + " (transparent huge pages: " + thp + ")";
}

struct Register {
  Register() {
    bench::add_header_lines([] {
      return std::vector<std::string>{"float32 GEMM: " + xg::float32_gemm_kernels(),
                                      "float32 matrix-vector: " + xg::float32_gemv_kernels(),
                                      "float64 GEMM: " + xg::float64_gemm_kernels(),
                                      "bfloat16 products: " + xg::bfloat16_gemm_kernels(),
                                      "bfloat16 attention: " + xg::nn::bfloat16_attention_kernels(),
                                      "huge pages: " + huge_pages_line()};
    });
  }
} const register_lines;

}  // namespace
