// libFuzzer target: the calibration cache reader (core/calibration.cpp, read_calibration_file) on
// arbitrary bytes. A file that parses must hold only valid entries, and a lookup on it must add
// its new entry and keep the others. Any outcome but success or an xg::Error is a finding. Run
// by scripts/fuzz.sh.
#include <cmath>

#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/core/error.hpp>
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xgfuzz::write_input("calibration_cache", data, size);
  if (path.empty()) return 0;
  try {
    const auto entries = xg::detail::read_calibration_file(path);
    for (const auto& [id, value] : entries)
      if (id.first.empty() || id.second.empty() || !std::isfinite(value) || value <= 0.0) __builtin_trap();
    const xg::detail::Calibration c =
        xg::detail::calibrated_in(path, "fuzz key", "fuzz_ratio", [] { return 1.5; });
    const auto after = xg::detail::read_calibration_file(path);
    if (after.at({"fuzz key", "fuzz_ratio"}) != c.value) __builtin_trap();
    for (const auto& [id, value] : entries)
      if (after.at(id) != value) __builtin_trap();  // the write keeps every entry, bit for bit
  } catch (const xg::Error&) {
  }
  return 0;
}
