// libFuzzer target: the llama2.c model reader (train/llama2c.cpp: legacy and version 1 files) on
// arbitrary bytes; a file that reads is written back as a legacy file, which must read again to
// the same tensors. Any outcome but success or an xg::Error is a finding (an abort, a crash, a
// huge allocation the header asked for). Run by scripts/fuzz.sh.
#include <xgrad/core/error.hpp>
#include <xgrad/train/llama2c.hpp>
#include "fuzz_input.hpp"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xgfuzz::write_input("llama2c", data, size);
  if (path.empty()) return 0;
  try {
    const xg::train::llama2c::Model m = xg::train::llama2c::read(path);
    const std::vector<float> tables =
        m.rope_tables.empty() ? xg::train::llama2c::rope_tables(m.config.d_model / m.config.H_q, m.config.context)
                              : m.rope_tables;
    const std::string bytes = xg::train::llama2c::legacy_bytes(m.config, m.tensors, tables);
    // A legacy input comes back as it was.
    if (m.header.format == xg::train::llama2c::Format::legacy &&
        (bytes.size() != size || std::memcmp(bytes.data(), data, size) != 0))
      __builtin_trap();
  } catch (const xg::Error&) {
  }
  return 0;
}
