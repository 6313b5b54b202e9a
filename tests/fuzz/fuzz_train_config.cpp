// libFuzzer target: `xgrad train --config FILE` (train/options.cpp: apply_config_json, then the
// option table's validation) on arbitrary text. Any outcome but success or an xg::Error is a
// finding; options that pass are written back as config.json and must read back the same.
// Run by scripts/fuzz.sh.
#include <string>

#include <xgrad/core/error.hpp>
#include <xgrad/train/options.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    xg::train::TrainOptions o;
    xg::train::apply_config_json(o, text, "fuzz.json");
    const xg::train::TrainOptions resolved = xg::train::with_defaults(o);
    xg::train::validate_options(resolved);
    xg::train::TrainOptions back;
    xg::train::apply_config_json(back, xg::train::options_json(resolved), "config.json");
    if (xg::train::options_json(back) != xg::train::options_json(resolved)) __builtin_trap();
  } catch (const xg::Error&) {
  }
  return 0;
}
