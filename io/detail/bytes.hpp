// Byte-level helpers shared by the io/ readers and writers (internal): little-endian fields,
// printable excerpts of file bytes for error messages, and the regular-file check.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <xgrad/core/error.hpp>
#include <xgrad/io/input_file.hpp>

namespace xg::io::detail {

inline bool little_endian_host() {
  const std::uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

inline void require_little_endian_host(const std::string& where) {
  if (!little_endian_host()) throw FormatError(where + "big-endian hosts are not supported");
}

inline std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// Printable form of bytes from a file for an error message (at most 40 of them).
inline std::string printable(const std::string& s) {
  std::string r;
  for (std::size_t i = 0; i < s.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 32 && c < 127 && c != '\\') {
      r.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    }
  }
  return s.size() > 40 ? r + "..." : r;
}

// Folders and devices open as streams but have no size to trust; a FIFO waits for a writer
// (the shared check: io/input_file.hpp).
inline void require_regular_file(const std::string& path, const std::string& where) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw FormatError(where + "cannot open the file: " + std::strerror(errno));
  const std::string kind = non_regular_kind(path);
  if (!kind.empty()) throw FormatError(where + "cannot read the file: it is " + kind + ", not a regular file");
}

}  // namespace xg::io::detail
