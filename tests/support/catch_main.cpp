// Catch2's runner, alone in this file (the slowest file to compile; rarely edited).
// The suite runs with float64 as the default dtype (xg::set_default_dtype), as PyTorch's own
// gradient tests set torch.set_default_dtype(torch.float64): values written without a dtype
// are float64 references. Tests of float32 behaviour name float32 explicitly, and the
// default itself (float32 at program start) is checked by tests/downstream/consumer.cpp, a
// fresh process. Before the session starts, every check of `xgrad gradcheck` is registered
// as a test case of its own (tests/checks/test_builtin_checks.cpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <xgrad/core/shape.hpp>

namespace xgt {
void register_builtin_check_cases();
}

int main(int argc, char* argv[]) {
  // Catch prints floating-point values in fixed notation: at its default 10 digits a difference
  // of 1e-16 reads "0.0 == 0.0". 17 (9) digits show float64 (float32) rounding differences.
  Catch::StringMaker<double>::precision = 17;
  Catch::StringMaker<float>::precision = 9;
  xg::set_default_dtype(xg::DType::float64);
  xgt::register_builtin_check_cases();
  return Catch::Session().run(argc, argv);
}
