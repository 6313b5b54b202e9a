// libFuzzer target: the token file reader (text/corpus.cpp, TokenFile: the text task's
// train.bin / val.bin, read through a memory map) on arbitrary bytes; a file that opens is
// read whole. Any outcome but success or an xg::Error is a finding. Run by scripts/fuzz.sh.
#include <xgrad/core/error.hpp>
#include <xgrad/text/corpus.hpp>
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xgfuzz::write_input("token_file", data, size);
  if (path.empty()) return 0;
  try {
    const xg::text::TokenFile f(path);
    std::uint64_t sum = 0;
    for (std::uint64_t i = 0; i < f.size(); ++i) sum += f[i];
    const std::vector<std::uint32_t> all = f.all();
    if (all.size() != f.size()) __builtin_trap();
    (void)sum;
  } catch (const xg::Error&) {
  }
  return 0;
}
