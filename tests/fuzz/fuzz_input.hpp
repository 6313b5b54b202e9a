// The loaders read files: each fuzz input is written to this process's own file first.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <unistd.h>

namespace xgfuzz {

// Writes the input to /tmp/xgrad_fuzz_<name>_<pid>.safetensors (removed at exit); returns its
// path ("" if the file cannot be written).
// The file is removed when the fuzzer exits (its runs end with exit()).
struct InputFile {
  std::string path;
  pid_t owner = ::getpid();
  explicit InputFile(std::string p) : path(std::move(p)) {}
  ~InputFile() {
    if (::getpid() == owner) std::remove(path.c_str());
  }
};

// Writes `size` bytes to `path` (replacing it); false when any step fails.
inline bool write_file(const std::string& path, const void* data, std::size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

inline std::string write_input(const char* name, const std::uint8_t* data, std::size_t size) {
  static const InputFile file(std::string("/tmp/xgrad_fuzz_") + name + "_" + std::to_string(::getpid()) + ".safetensors");
  return write_file(file.path, data, size) ? file.path : std::string();
}

}  // namespace xgfuzz
