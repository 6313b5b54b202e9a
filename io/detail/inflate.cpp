// Raw deflate decoding (RFC 1951: stored, fixed and dynamic Huffman blocks) and CRC-32, for
// the members of .npz archives (io/detail/inflate.hpp).
#include <xgrad/io/detail/inflate.hpp>

#include <array>
#include <cstring>
#include <vector>

#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/bytes.hpp>

namespace xg::io::detail {

namespace {

class BitReader {
 public:
  BitReader(const unsigned char* p, std::size_t n, const std::string& where) : p_(p), n_(n), where_(where) {}
  std::uint32_t bits(int need) {
    while (count_ < need) {
      if (pos_ >= n_) throw FormatError(where_ + "deflate stream is truncated");
      buf_ |= static_cast<std::uint32_t>(p_[pos_++]) << count_;
      count_ += 8;
    }
    const std::uint32_t v = buf_ & ((1u << need) - 1);
    buf_ >>= need;
    count_ -= need;
    return v;
  }
  void align() {  // drop the bits left in the current byte (never a whole byte: see bits())
    buf_ = 0;
    count_ = 0;
  }
  std::size_t position() const { return pos_; }
  void skip(std::size_t n) { pos_ += n; }
  const unsigned char* at() const { return p_ + pos_; }
  std::size_t left() const { return n_ - pos_; }

 private:
  const unsigned char* p_;
  std::size_t n_, pos_ = 0;
  std::uint32_t buf_ = 0;
  int count_ = 0;
  const std::string& where_;
};

// A canonical Huffman code: how many codes have each length, and the symbols ordered by
// (length, symbol value). Decoding walks the lengths, comparing the code read so far with the
// first code of that length.
struct Huffman {
  std::array<std::uint16_t, 16> count{};
  std::vector<std::uint16_t> symbol;

  void build(const std::uint8_t* lengths, std::size_t n, const std::string& where, const char* what) {
    count.fill(0);
    for (std::size_t s = 0; s < n; ++s) ++count[lengths[s]];
    count[0] = 0;
    int left = 1;  // codes of the current length still unassigned
    for (int len = 1; len < 16; ++len) {
      left = left * 2 - count[len];
      if (left < 0) throw FormatError(where + "deflate stream has an over-subscribed " + what + " code");
    }
    std::array<std::uint16_t, 16> offset{};
    for (int len = 1; len < 15; ++len) offset[len + 1] = offset[len] + count[len];
    symbol.assign(n, 0);
    for (std::size_t s = 0; s < n; ++s)
      if (lengths[s]) symbol[offset[lengths[s]]++] = static_cast<std::uint16_t>(s);
  }

  int decode(BitReader& in, const std::string& where) const {
    int code = 0, first = 0, index = 0;
    for (int len = 1; len < 16; ++len) {
      code |= static_cast<int>(in.bits(1));
      const int c = count[len];
      if (code - first < c) return symbol[index + code - first];
      index += c;
      first = (first + c) << 1;
      code <<= 1;
    }
    throw FormatError(where + "deflate stream holds an invalid Huffman code");
  }
};

const std::uint16_t kLenBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                    31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
const std::uint8_t kLenExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
const std::uint16_t kDistBase[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                     193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
const std::uint8_t kDistExtra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

}  // namespace

std::string inflate_raw(const unsigned char* p, std::size_t n, std::size_t expected, const std::string& where) {
  BitReader in(p, n, where);
  std::string out;
  out.reserve(expected);
  auto room = [&](std::size_t more) {
    if (more > expected - out.size())
      throw FormatError(where + "deflate stream inflates to more than the " + std::to_string(expected) +
                        " bytes the archive declares");
  };
  Huffman lit, dist;
  bool last = false;
  while (!last) {
    last = in.bits(1) == 1;
    const std::uint32_t type = in.bits(2);
    if (type == 0) {  // stored block
      in.align();
      if (in.left() < 4) throw FormatError(where + "deflate stream is truncated");
      const std::uint32_t len = static_cast<std::uint32_t>(get_le(in.at(), 2)),
                          nlen = static_cast<std::uint32_t>(get_le(in.at() + 2, 2));
      if ((len ^ 0xFFFF) != nlen)
        throw FormatError(where + "deflate stored block length " + std::to_string(len) +
                          " does not match its complement " + std::to_string(nlen));
      in.skip(4);
      if (in.left() < len) throw FormatError(where + "deflate stream is truncated");
      room(len);
      out.append(reinterpret_cast<const char*>(in.at()), len);
      in.skip(len);
      continue;
    }
    if (type == 3) throw FormatError(where + "deflate stream has a block of the reserved type 3");
    std::uint8_t lengths[320];
    std::size_t n_lit = 288, n_dist = 30;
    if (type == 1) {  // fixed codes (RFC 1951 3.2.6)
      std::size_t s = 0;
      for (; s < 144; ++s) lengths[s] = 8;
      for (; s < 256; ++s) lengths[s] = 9;
      for (; s < 280; ++s) lengths[s] = 7;
      for (; s < 288; ++s) lengths[s] = 8;
      for (s = 0; s < 32; ++s) lengths[288 + s] = 5;  // 30 and 31 take part in the code but are invalid
      n_dist = 32;
    } else {  // dynamic codes (3.2.7)
      n_lit = in.bits(5) + 257;
      n_dist = in.bits(5) + 1;
      const std::size_t n_len = in.bits(4) + 4;
      if (n_lit > 286 || n_dist > 30)
        throw FormatError(where + "deflate block declares " + std::to_string(n_lit) + " literal/length and " +
                          std::to_string(n_dist) + " distance codes (at most 286 and 30)");
      static const std::uint8_t order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
      std::uint8_t cl[19] = {0};
      for (std::size_t i = 0; i < n_len; ++i) cl[order[i]] = static_cast<std::uint8_t>(in.bits(3));
      Huffman clh;
      clh.build(cl, 19, where, "code-length");
      std::size_t i = 0;
      while (i < n_lit + n_dist) {
        const int sym = clh.decode(in, where);
        if (sym < 16) {
          lengths[i++] = static_cast<std::uint8_t>(sym);
          continue;
        }
        std::uint8_t fill = 0;
        std::size_t rep = 0;
        if (sym == 16) {
          if (i == 0) throw FormatError(where + "deflate code lengths repeat before the first length");
          fill = lengths[i - 1];
          rep = 3 + in.bits(2);
        } else if (sym == 17) {
          rep = 3 + in.bits(3);
        } else {
          rep = 11 + in.bits(7);
        }
        if (i + rep > n_lit + n_dist) throw FormatError(where + "deflate code lengths overrun their count");
        while (rep--) lengths[i++] = fill;
      }
      if (lengths[256] == 0) throw FormatError(where + "deflate block has no end-of-block code");
      // Move the distance lengths behind the 288 literal slots, as for fixed codes.
      std::memmove(lengths + 288, lengths + n_lit, n_dist);
      std::memset(lengths + n_lit, 0, 288 - n_lit);
    }
    lit.build(lengths, n_lit, where, "literal/length");
    dist.build(lengths + 288, n_dist, where, "distance");
    for (;;) {
      const int sym = lit.decode(in, where);
      if (sym < 256) {
        room(1);
        out.push_back(static_cast<char>(sym));
        continue;
      }
      if (sym == 256) break;
      if (sym > 285) throw FormatError(where + "deflate stream holds the invalid length symbol " + std::to_string(sym));
      const std::size_t len = kLenBase[sym - 257] + in.bits(kLenExtra[sym - 257]);
      const int ds = dist.decode(in, where);
      if (ds > 29) throw FormatError(where + "deflate stream holds the invalid distance symbol " + std::to_string(ds));
      const std::size_t d = kDistBase[ds] + in.bits(kDistExtra[ds]);
      if (d > out.size())
        throw FormatError(where + "deflate stream refers " + std::to_string(d) + " bytes back with only " +
                          std::to_string(out.size()) + " written");
      room(len);
      const std::size_t from = out.size() - d;
      for (std::size_t k = 0; k < len; ++k) out.push_back(out[from + k]);  // may overlap: byte by byte
    }
  }
  if (in.left() != 0)
    throw FormatError(where + std::to_string(in.left()) + " bytes follow the end of the deflate stream");
  if (out.size() != expected)
    throw FormatError(where + "deflate stream inflates to " + std::to_string(out.size()) + " bytes, the archive declares " +
                      std::to_string(expected));
  return out;
}


std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

}  // namespace xg::io::detail
