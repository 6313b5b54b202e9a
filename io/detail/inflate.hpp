// Raw deflate (RFC 1951) decoding and CRC-32 (internal): what the .npz reader needs of zlib,
// checked byte by byte (io/detail/inflate.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace xg::io::detail {

/// Decodes the raw deflate stream of `n` bytes at `p` into exactly `expected` bytes;
/// FormatError (messages start with `where`) on any malformed, truncated or oversized stream.
std::string inflate_raw(const unsigned char* p, std::size_t n, std::size_t expected, const std::string& where);

/// The CRC-32 (zip's, IEEE 802.3) of `size` bytes at `data`, continuing from `crc`.
std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc = 0);

}  // namespace xg::io::detail
