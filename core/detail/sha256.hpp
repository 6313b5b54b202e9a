// SHA-256 (FIPS 180-4), internal: how xgrad names the contents of a file it must recognise
// again (a tokenizer model, text/tokenizer.hpp). Not installed (see CMakeLists.txt).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace xg::detail {

// An incremental SHA-256: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // The 32-byte digest; the object must not be updated afterwards.
  std::array<std::uint8_t, 32> digest();

 private:
  void block(const std::uint8_t* p);
  std::array<std::uint32_t, 8> h_;
  std::array<std::uint8_t, 64> buf_{};
  std::size_t used_ = 0;      // bytes waiting in buf_
  std::uint64_t length_ = 0;  // bytes hashed so far
};

// The SHA-256 of `s` as 64 lowercase hex digits.
std::string sha256_hex(std::string_view s);

}  // namespace xg::detail
