// The loaders read files: each fuzz input is written to this process's own file first.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <unistd.h>

namespace xgfuzz {

// Writes the input to /tmp/xgrad_fuzz_<name>_<pid>.safetensors; returns its path ("" if the
// file cannot be written).
inline std::string write_input(const char* name, const std::uint8_t* data, std::size_t size) {
  static const std::string path =
      std::string("/tmp/xgrad_fuzz_") + name + "_" + std::to_string(::getpid()) + ".safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return {};
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok ? path : std::string();
}

}  // namespace xgfuzz
