// libFuzzer target: the safetensors loader (io/safetensors.cpp) on arbitrary bytes. Any
// outcome but a loaded file or an xg::Error (an abort, another exception, a sanitizer report,
// a leak, a timeout, memory beyond -rss_limit_mb) is a finding. Run by scripts/fuzz.sh.
#include <xgrad/core/error.hpp>
#include <xgrad/io/safetensors.hpp>
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xgfuzz::write_input("safetensors", data, size);
  if (path.empty()) return 0;
  try {
    const xg::io::safetensors::File file = xg::io::safetensors::load(path);
    double sum = 0;  // touch every loaded element
    for (const auto& named : file.tensors)
      for (std::size_t i = 0; i < named.second.size(); ++i) sum += named.second.flat(i);
    (void)sum;
  } catch (const xg::Error&) {
  }
  return 0;
}
