// libFuzzer target: the llama2.c model reader (io/llama2c.cpp: legacy, version 1 and 2 files) on
// arbitrary bytes; a file that reads is written back as a legacy file, which must read again to
// the same tensors. Any outcome but success or an xg::Error is a finding (an abort, a crash, a
// huge allocation the header asked for). Run by scripts/fuzz.sh.
#include <xgrad/core/error.hpp>
#include <xgrad/io/llama2c.hpp>
#include "fuzz_input.hpp"

#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xgfuzz::write_input("llama2c", data, size);
  if (path.empty()) return 0;
  try {
    namespace l2c = xg::io::llama2c;
    const l2c::File m = l2c::read(path);
    const std::vector<float> tables =
        m.rope_tables.empty() ? l2c::rope_tables(m.sizes.head_size(), m.sizes.seq_len) : m.rope_tables;
    const std::string bytes = l2c::legacy_bytes(m.sizes, m.tensors, tables);
    // A legacy input comes back as it was.
    if (m.header.format == l2c::Format::legacy &&
        (bytes.size() != size || std::memcmp(bytes.data(), data, size) != 0))
      __builtin_trap();
  } catch (const xg::Error&) {
  }
  return 0;
}
