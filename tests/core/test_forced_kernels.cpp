// XGRAD_KERNELS: every kernel choice forced from one variable (core/detail/blas.hpp,
// forced_kernel), beside each choice's own variable. The parsing here, on a saved and restored
// environment; ctest runs the kernel tests again with XGRAD_KERNELS forcing every choice
// (kernels_forced_openblas_off, kernels_forced_xgrad_on), and the CLI cases check the one-line
// errors of `xgrad --version --verbose`.
#include "tests/support/helpers.hpp"

#include <cstdlib>
#include <optional>
#include <string>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/error.hpp>

using namespace xg;

using xgt::EnvScope;

TEST_CASE("XGRAD_KERNELS forces each named choice and leaves the others to their variables", "[forced_kernels]") {
  const EnvScope own("XGRAD_FLOAT32_GEMV", std::nullopt), own2("XGRAD_BF16_GEMM", std::nullopt),
      own3("XGRAD_FLOAT64_GEMM", "xgrad"), own4("XGRAD_BF16_ATTENTION", std::nullopt);
  {
    const EnvScope all("XGRAD_KERNELS", std::nullopt);
    const blas::ForcedKernel f = blas::forced_kernel("XGRAD_BF16_GEMM", "bf16_gemm");
    CHECK(f.value.empty());
    CHECK(blas::forced_kernel("XGRAD_FLOAT64_GEMM", "float64_gemm").setting() == "XGRAD_FLOAT64_GEMM=xgrad");
  }
  const EnvScope all("XGRAD_KERNELS", "bf16_gemm=off,float32_gemv=openblas,float64_gemm=xgrad");
  const blas::ForcedKernel b = blas::forced_kernel("XGRAD_BF16_GEMM", "bf16_gemm");
  CHECK(b.value == "off");
  CHECK(b.setting() == "XGRAD_KERNELS bf16_gemm=off");
  CHECK(blas::forced_kernel("XGRAD_FLOAT32_GEMV", "float32_gemv").value == "openblas");
  // the same value in both places is no conflict; the name not listed keeps its own variable
  CHECK(blas::forced_kernel("XGRAD_FLOAT64_GEMM", "float64_gemm").value == "xgrad");
  CHECK(blas::forced_kernel("XGRAD_BF16_ATTENTION", "bf16_attention").value.empty());
}

TEST_CASE("XGRAD_KERNELS: a bad entry is a ValueError naming it", "[forced_kernels]") {
  const EnvScope own("XGRAD_BF16_GEMM", "on");
  const auto error_of = [](const std::string& value) {
    const EnvScope all("XGRAD_KERNELS", value);
    try {
      blas::forced_kernel("XGRAD_BF16_GEMM", "bf16_gemm");
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of("bf16_gemm=off"),
             Catch::Contains("[XGRAD_KERNELS]") && Catch::Contains("bf16_gemm=off conflicts with XGRAD_BF16_GEMM=on"));
  CHECK_THAT(error_of("sgemm=oneDNN"), Catch::Contains("unknown kernel 'sgemm' (float64_gemm, float32_gemv"));
  CHECK_THAT(error_of("bf16_gemm"), Catch::Contains("entry 'bf16_gemm' of 'bf16_gemm' is not name=value"));
  CHECK_THAT(error_of("bf16_gemm=on,,float32_gemv=xgrad"), Catch::Contains("entry '' of"));
  CHECK_THAT(error_of("bf16_gemm=on,bf16_gemm=on"), Catch::Contains("'bf16_gemm' is set twice"));
  // an unknown name elsewhere in the list fails every choice, not only its own
  CHECK_THAT(error_of("bf16_gemm=on,gemv=xgrad"), Catch::Contains("unknown kernel 'gemv'"));
  CHECK(error_of("bf16_gemm=on") == "no error");
}
