// NumPy .npy/.npz reading and writing (see io/npy.hpp): the .npy header parser, a zip reader
// and writer, and a deflate decoder, all checked byte by byte.
#include <xgrad/io/npy.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sys/stat.h>
#include <unistd.h>

#include <xgrad/io/detail/json.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/io/atomic_file.hpp>

namespace xg::io::npy {

namespace {

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE floats expected");

const char kMagic[] = "\x93NUMPY";  // 6 bytes
const std::uint64_t kMaxElements = std::uint64_t(1) << 40;  // as safetensors: no count can overflow
const std::size_t kMaxDims = 32;                            // NumPy 1.x's NPY_MAXDIMS

bool little_endian_host() {
  const std::uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

void require_little_endian_host(const std::string& where) {
  if (!little_endian_host()) throw FormatError(where + "big-endian hosts are not supported");
}

std::uint64_t get_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// Printable form of bytes from a file for an error message (at most 40 of them).
std::string printable(const std::string& s) {
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

// Folders and devices open as streams but have no size to trust.
void require_regular_file(const std::string& path, const std::string& where) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw FormatError(where + "cannot open the file: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw FormatError(where + "cannot read the file: not a regular file (a folder?)");
}

// ------------------------------------------------------------------ the header literal

// The subset of Python literals a .npy header uses: dict, tuple, list, str, int, bool, None.
struct Lit {
  enum class Kind { dict, tuple, list, str, integer, boolean, none } kind = Kind::none;
  std::string text;       // str contents, or an integer's digits (with sign)
  bool flag = false;      // boolean
  std::vector<Lit> items;                          // tuple, list
  std::vector<std::pair<std::string, Lit>> members;  // dict (keys must be str)
};

class LitParser {
 public:
  LitParser(const std::string& s, const std::string& where) : s_(s), where_(where) {}

  Lit document() {
    Lit v = value(0);
    skip_space();
    if (i_ != s_.size())
      fail("unexpected text after the header dict: '" + printable(s_.substr(i_)) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(where_ + "malformed header: " + what + " (header text: '" + printable(s_) + "')");
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    if (i_ + n < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_ + n])) || s_[i_ + n] == '_')) return false;
    i_ += n;
    return true;
  }

  Lit value(int depth) {
    if (depth > 16) fail("nesting deeper than 16");
    skip_space();
    if (i_ >= s_.size()) fail("the text ends where a value should start");
    Lit v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Lit::Kind::dict;
      while (!eat('}')) {
        const Lit key = value(depth + 1);
        if (key.kind != Lit::Kind::str) fail("a dict key is not a string");
        if (!eat(':')) fail("expected ':' after the key '" + key.text + "'");
        for (const auto& m : v.members)
          if (m.first == key.text) fail("the key '" + key.text + "' appears twice");
        v.members.emplace_back(key.text, value(depth + 1));
        if (!eat(',')) {
          if (!eat('}')) fail("expected ',' or '}' in the dict");
          break;
        }
      }
      return v;
    }
    if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++i_;
      v.kind = c == '(' ? Lit::Kind::tuple : Lit::Kind::list;
      bool comma = false;
      while (!eat(close)) {
        v.items.push_back(value(depth + 1));
        comma = eat(',');
        if (!comma) {
          if (!eat(close)) fail(std::string("expected ',' or '") + close + "'");
          break;
        }
      }
      // (x) is not a tuple in Python: a one-element tuple needs its comma.
      if (v.kind == Lit::Kind::tuple && v.items.size() == 1 && !comma) return v.items[0];
      return v;
    }
    if (c == '\'' || c == '"') {
      ++i_;
      v.kind = Lit::Kind::str;
      while (i_ < s_.size() && s_[i_] != c) {
        if (s_[i_] == '\\' || s_[i_] == '\n') fail("escapes and line breaks in strings are not supported");
        v.text.push_back(s_[i_++]);
      }
      if (i_ >= s_.size()) fail("unterminated string");
      ++i_;
      return v;
    }
    if (c == '-' || c == '+' || (c >= '0' && c <= '9')) {
      v.kind = Lit::Kind::integer;
      if (c == '-' || c == '+') v.text.push_back(s_[i_++]);
      const std::size_t start = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') v.text.push_back(s_[i_++]);
      if (i_ == start) fail("a sign without digits");
      if (i_ < s_.size() && (std::isalpha(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.'))
        fail("'" + printable(s_.substr(start, i_ - start + 1)) + "' is not an integer");
      return v;
    }
    if (word("True") || word("False")) {
      v.kind = Lit::Kind::boolean;
      v.flag = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u';  // "True" ends in "ue", "False" in "se"
      return v;
    }
    if (word("None")) return v;
    fail("unexpected text '" + printable(s_.substr(i_, 12)) + "'");
  }

  const std::string& s_;
  std::string where_;
  std::size_t i_ = 0;
};

// ---------------------------------------------------------------------- .npy headers

enum class Elem { f32, f64, i64 };
std::size_t bytes_of(Elem e) { return e == Elem::f32 ? 4 : 8; }
const char* descr_of(Elem e) { return e == Elem::f32 ? "<f4" : e == Elem::f64 ? "<f8" : "<i8"; }

// NumPy's name for a descr, for messages ("int32" for '<i4'), or "" if unknown.
std::string numpy_name(const std::string& d) {
  if (d.size() < 2) return "";
  const std::string code = d.substr(1);
  static const std::pair<const char*, const char*> names[] = {
      {"f2", "float16"}, {"f4", "float32"}, {"f8", "float64"}, {"f16", "float128"}, {"i1", "int8"},
      {"i2", "int16"},   {"i4", "int32"},   {"i8", "int64"},   {"u1", "uint8"},     {"u2", "uint16"},
      {"u4", "uint32"},  {"u8", "uint64"},  {"b1", "bool"},    {"c8", "complex64"}, {"c16", "complex128"},
      {"O", "object: pickled Python objects"}};
  for (const auto& n : names)
    if (code == n.first) return n.second;
  if (code[0] == 'U' || code[0] == 'S') return "string";
  if (code[0] == 'M' || code[0] == 'm') return "datetime";
  if (code[0] == 'V') return "void (raw bytes)";
  return "";
}

struct Header {
  Elem elem = Elem::f32;
  Shape shape;
  std::uint64_t count = 1;
};

const char* kSupported = "xgrad reads '<f4' (float32) and '<f8' (float64) into an Array and '<i8' (int64) into an IndexArray";

Header parse_header_text(const std::string& text, const std::string& where) {
  const Lit d = LitParser(text, where).document();
  if (d.kind != Lit::Kind::dict) throw FormatError(where + "malformed header: not a dict literal: '" + printable(text) + "'");
  const Lit *descr = nullptr, *fortran = nullptr, *shape = nullptr;
  for (const auto& m : d.members) {
    if (m.first == "descr")
      descr = &m.second;
    else if (m.first == "fortran_order")
      fortran = &m.second;
    else if (m.first == "shape")
      shape = &m.second;
    else
      throw FormatError(where + "malformed header: unexpected key '" + m.first +
                        "' (a .npy header has exactly 'descr', 'fortran_order' and 'shape')");
  }
  if (!descr || !fortran || !shape)
    throw FormatError(where + "malformed header: missing key '" +
                      std::string(!descr ? "descr" : !fortran ? "fortran_order" : "shape") + "'");
  Header h;
  if (descr->kind != Lit::Kind::str)
    throw FormatError(where + "structured dtypes (a 'descr' list of fields) are not supported; " + kSupported);
  const std::string& t = descr->text;
  if (t == "<f4")
    h.elem = Elem::f32;
  else if (t == "<f8")
    h.elem = Elem::f64;
  else if (t == "<i8")
    h.elem = Elem::i64;
  else if (!t.empty() && t[0] == '>' && (t == ">f4" || t == ">f8" || t == ">i8"))
    throw FormatError(where + "dtype '" + t + "' is big-endian " + numpy_name(t) +
                      ", which xgrad does not read; convert with a.astype('<" + t.substr(1) + "')");
  else {
    const std::string name = numpy_name(t);
    throw FormatError(where + "dtype '" + printable(t) + "'" + (name.empty() ? "" : " (" + name + ")") +
                      " is not supported; " + kSupported +
                      " (convert with a.astype(np.float32) or a.astype(np.int64))");
  }
  if (fortran->kind != Lit::Kind::boolean)
    throw FormatError(where + "malformed header: 'fortran_order' is not True or False");
  if (fortran->flag)
    throw FormatError(where + "the array is stored in Fortran (column-major) order, which xgrad does not read; "
                      "save np.ascontiguousarray(a) instead");
  if (shape->kind != Lit::Kind::tuple)
    throw FormatError(where + "malformed header: 'shape' is not a tuple of integers");
  if (shape->items.size() > kMaxDims)
    throw FormatError(where + "shape has " + std::to_string(shape->items.size()) + " dimensions (at most " +
                      std::to_string(kMaxDims) + ")");
  std::uint64_t nonzero = 1, count = 1;
  for (const Lit& dim : shape->items) {
    if (dim.kind != Lit::Kind::integer || dim.text.empty() || dim.text[0] == '-' || dim.text[0] == '+')
      throw FormatError(where + "malformed header: shape entries must be non-negative integers, got '" +
                        printable(dim.kind == Lit::Kind::integer ? dim.text : "a non-integer") + "'");
    if (dim.text.size() > 15)
      throw FormatError(where + "shape entry " + printable(dim.text) + " is implausibly large (2^40 elements at most)");
    const std::uint64_t v = std::stoull(dim.text);
    if (v > kMaxElements || (v != 0 && nonzero > kMaxElements / v))
      throw FormatError(where + "shape is implausibly large (2^40 elements at most)");
    if (v != 0) nonzero *= v;
    count *= v;
    h.shape.push_back(static_cast<std::size_t>(v));
  }
  h.count = count;
  return h;
}

// Reads n bytes or throws "truncated".
class Source {
 public:
  virtual ~Source() = default;
  virtual void read(void* dst, std::size_t n, const char* what) = 0;
  virtual std::uint64_t remaining() = 0;
};

class MemorySource : public Source {
 public:
  MemorySource(const char* p, std::size_t n, std::string where) : p_(p), n_(n), where_(std::move(where)) {}
  void read(void* dst, std::size_t n, const char* what) override {
    if (n > n_ - pos_)
      throw FormatError(where_ + "truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
                        std::to_string(pos_) + ", only " + std::to_string(n_ - pos_) + " remain");
    if (n) std::memcpy(dst, p_ + pos_, n);
    pos_ += n;
  }
  std::uint64_t remaining() override { return n_ - pos_; }

 private:
  const char* p_;
  std::size_t n_, pos_ = 0;
  std::string where_;
};

class FileSource : public Source {
 public:
  FileSource(const std::string& path, std::string where) : where_(std::move(where)) {
    require_regular_file(path, where_);
    in_.open(path, std::ios::binary);
    if (!in_) throw FormatError(where_ + "cannot open the file: " + std::strerror(errno));
    in_.seekg(0, std::ios::end);
    const std::streamoff n = in_.tellg();
    if (!in_ || n < 0) throw FormatError(where_ + "cannot read the file");
    size_ = static_cast<std::uint64_t>(n);
    in_.seekg(0);
  }
  void read(void* dst, std::size_t n, const char* what) override {
    if (n > size_ - pos_)
      throw FormatError(where_ + "truncated: " + what + " needs " + std::to_string(n) + " bytes at offset " +
                        std::to_string(pos_) + ", only " + std::to_string(size_ - pos_) + " remain");
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!in_) throw FormatError(where_ + "reading " + what + " failed");
    pos_ += n;
  }
  std::uint64_t remaining() override { return size_ - pos_; }

 private:
  std::ifstream in_;
  std::uint64_t size_ = 0, pos_ = 0;
  std::string where_;
};

Value read_npy(Source& src, const std::string& where) {
  require_little_endian_host(where);
  unsigned char pre[8];
  if (src.remaining() < 8)
    throw FormatError(where + "truncated: " + std::to_string(src.remaining()) +
                      " bytes, fewer than the 8-byte magic and version of a .npy file");
  src.read(pre, 8, "the magic");
  if (std::memcmp(pre, kMagic, 6) != 0)
    throw FormatError(where + "not a .npy file: it starts with '" +
                      printable(std::string(reinterpret_cast<char*>(pre), 6)) + "', not '\\x93NUMPY'");
  const int major = pre[6], minor = pre[7];
  if (!((major == 1 || major == 2 || major == 3) && minor == 0))
    throw FormatError(where + "format version " + std::to_string(major) + "." + std::to_string(minor) +
                      " is not supported (1.0, 2.0 and 3.0 are)");
  const int len_bytes = major == 1 ? 2 : 4;
  unsigned char len[4];
  src.read(len, len_bytes, "the header length");
  const std::uint64_t n = get_le(len, len_bytes);
  if (n > src.remaining())
    throw FormatError(where + "truncated: the header length is " + std::to_string(n) + " bytes, only " +
                      std::to_string(src.remaining()) + " follow");
  if (n > (1u << 20)) throw FormatError(where + "header length " + std::to_string(n) + " exceeds 1 MiB");
  std::string text(n, '\0');
  src.read(&text[0], n, "the header");
  if (major == 3 ? !json::valid_utf8(text) : false)
    throw FormatError(where + "malformed header: a version 3.0 header must be UTF-8 text");
  for (const char c : text)
    if (c == '\0') throw FormatError(where + "malformed header: it holds a NUL byte");
  const Header h = parse_header_text(text, where);
  const std::uint64_t bytes = h.count * bytes_of(h.elem);
  if (src.remaining() < bytes)
    throw FormatError(where + "truncated: shape " + shape_str(h.shape) + " of " + descr_of(h.elem) + " needs " +
                      std::to_string(bytes) + " data bytes, the file has " + std::to_string(src.remaining()));
  if (src.remaining() > bytes)
    throw FormatError(where + std::to_string(src.remaining() - bytes) + " trailing bytes after the " +
                      std::to_string(bytes) + " data bytes of shape " + shape_str(h.shape));
  Value v;
  if (h.elem == Elem::i64) {
    v.index.shape = h.shape;
    v.index.data.resize(h.count);
    src.read(v.index.data.data(), bytes, "the data");
  } else {
    v.array = Array::empty(h.shape, h.elem == Elem::f32 ? DType::float32 : DType::float64);
    if (bytes) {
      detail::dispatch(v.array.dtype(), [&](auto t) {
        using T = decltype(t);
        src.read(v.array.data<T>(), bytes, "the data");
      });
    }
  }
  return v;
}

Value parse_at(const char* p, std::size_t n, const std::string& where) {
  MemorySource src(p, n, where);
  return read_npy(src, where);
}

std::string npy_bytes(const Value& v) {
  if (!little_endian_host()) throw FormatError("[npy] big-endian hosts are not supported");
  const Shape& s = v.shape();
  const char* descr = v.is_index() ? "<i8" : v.array.dtype() == DType::float32 ? "<f4" : "<f8";
  if (v.is_index() && v.index.data.size() != numel(v.index.shape))
    throw ShapeError("[npy] IndexArray has shape " + shape_str(v.index.shape) + " but " +
                     std::to_string(v.index.data.size()) + " elements");
  std::string shape = "(";
  for (std::size_t i = 0; i < s.size(); ++i) shape += (i ? ", " : "") + std::to_string(s[i]);
  shape += s.size() == 1 ? ",)" : ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // As NumPy (1.24) writes it, byte for byte: room for the first dimension to grow to 21
  // digits, then spaces and a final newline so that the data starts at a multiple of 64 bytes.
  if (!s.empty()) header.append(21 - std::min<std::size_t>(21, std::to_string(s[0]).size()), ' ');
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  if (header.size() > 65535) throw FormatError("[npy] the header does not fit format version 1.0");
  std::string out(kMagic, 6);
  out.push_back('\x01');
  out.push_back('\x00');
  put_le(out, header.size(), 2);
  out += header;
  if (v.is_index()) {
    out.append(reinterpret_cast<const char*>(v.index.data.data()), v.index.data.size() * 8);
  } else if (v.array.size()) {
    detail::dispatch(v.array.dtype(), [&](auto t) {
      using T = decltype(t);
      out.append(reinterpret_cast<const char*>(v.array.data<T>()), v.array.size() * sizeof(T));
    });
  }
  return out;
}

// ------------------------------------------------------------------------- inflate

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

// ---------------------------------------------------------------------------- zip

const std::uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                    kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;

std::string zip_where(const std::string& where, const std::string& member) {
  return where + "member '" + printable(member) + "': ";
}

Npz read_zip(const std::string& z, const std::string& where) {
  require_little_endian_host(where);
  const auto* b = reinterpret_cast<const unsigned char*>(z.data());
  const std::size_t size = z.size();
  // The end-of-central-directory record: 22 bytes plus a comment of up to 65535 bytes.
  if (size < 22)
    throw FormatError(where + "not a zip archive (.npz): " + std::to_string(size) + " bytes, fewer than a zip end record");
  std::size_t end = std::string::npos;
  for (std::size_t k = size - 22 + 1; k-- > 0 && size - k <= 22 + 65535;) {
    if (get_le(b + k, 4) == kEndSig && get_le(b + k + 20, 2) == size - k - 22) {
      end = k;
      break;
    }
  }
  if (end == std::string::npos) {
    if (size >= 6 && std::memcmp(b, kMagic, 6) == 0)
      throw FormatError(where + "this is a .npy file, not an .npz archive: use load / read");
    throw FormatError(where + "not a zip archive (.npz): no end-of-central-directory record");
  }
  if (get_le(b + end + 4, 2) != 0 || get_le(b + end + 6, 2) != 0)
    throw FormatError(where + "multi-disk (split) zip archives are not supported");
  std::uint64_t entries = get_le(b + end + 10, 2), cd_size = get_le(b + end + 12, 4), cd_offset = get_le(b + end + 16, 4);
  if (get_le(b + end + 8, 2) != entries)
    throw FormatError(where + "multi-disk (split) zip archives are not supported");
  std::uint64_t cd_end = end;  // where the central directory must end
  // zip64: a locator just before the end record points to the zip64 end record.
  if (end >= 20 && get_le(b + end - 20, 4) == kLocator64Sig) {
    const std::uint64_t at = get_le(b + end - 20 + 8, 8);
    if (get_le(b + end - 20 + 4, 4) != 0 || get_le(b + end - 20 + 16, 4) > 1)
      throw FormatError(where + "multi-disk (split) zip archives are not supported");
    if (at > end - 20 || end - 20 - at < 56 || get_le(b + at, 4) != kEnd64Sig)
      throw FormatError(where + "the zip64 locator points to no zip64 end record");
    if (get_le(b + at + 16, 4) != 0 || get_le(b + at + 20, 4) != 0 || get_le(b + at + 24, 8) != get_le(b + at + 32, 8))
      throw FormatError(where + "multi-disk (split) zip archives are not supported");
    entries = get_le(b + at + 32, 8);
    cd_size = get_le(b + at + 40, 8);
    cd_offset = get_le(b + at + 48, 8);
    cd_end = at;
  }
  if (cd_offset > cd_end || cd_size != cd_end - cd_offset)
    throw FormatError(where + "the central directory (" + std::to_string(cd_size) + " bytes at offset " +
                      std::to_string(cd_offset) + ") does not end where the end record starts (" +
                      std::to_string(cd_end) + "): a damaged archive, or data before it");
  if (entries > cd_size / 46)
    throw FormatError(where + "the end record declares " + std::to_string(entries) + " members, more than fit in the " +
                      std::to_string(cd_size) + "-byte central directory");

  // First pass: the central directory, checked whole before any member is decoded.
  struct Member {
    std::string name, where;
    std::uint32_t method, crc;
    std::uint64_t local, data, csize, usize;
  };
  std::vector<Member> members;
  std::set<std::string> names;
  std::uint64_t pos = cd_offset;
  for (std::uint64_t e = 0; e < entries; ++e) {
    if (cd_end - pos < 46 || get_le(b + pos, 4) != kCentralSig)
      throw FormatError(where + "central directory entry " + std::to_string(e) + " is damaged");
    const unsigned char* c = b + pos;
    const std::uint32_t flags = static_cast<std::uint32_t>(get_le(c + 8, 2)), method = static_cast<std::uint32_t>(get_le(c + 10, 2));
    const std::uint32_t crc = static_cast<std::uint32_t>(get_le(c + 16, 4));
    std::uint64_t csize = get_le(c + 20, 4), usize = get_le(c + 24, 4);
    const std::size_t name_len = get_le(c + 28, 2), extra_len = get_le(c + 30, 2), comment_len = get_le(c + 32, 2);
    std::uint64_t disk = get_le(c + 34, 2), local = get_le(c + 42, 4);
    if (cd_end - pos - 46 < name_len + extra_len + comment_len)
      throw FormatError(where + "central directory entry " + std::to_string(e) + " runs past the directory");
    const std::string member(reinterpret_cast<const char*>(c + 46), name_len);
    const std::string mw = zip_where(where, member);
    // zip64 extended information: the fields saturated in the entry, in this order.
    const unsigned char* x = c + 46 + name_len;
    for (std::size_t k = 0; k + 4 <= extra_len;) {
      const std::uint32_t id = static_cast<std::uint32_t>(get_le(x + k, 2));
      const std::size_t len = get_le(x + k + 2, 2);
      if (k + 4 + len > extra_len) throw FormatError(mw + "damaged extra field");
      if (id == 1) {
        std::size_t q = k + 4;
        auto take = [&](std::uint64_t& field, std::uint64_t saturated, int bytes) {
          if (field != saturated) return;
          if (q + bytes > k + 4 + len) throw FormatError(mw + "the zip64 extra field is too short");
          field = get_le(x + q, bytes);
          q += bytes;
        };
        take(usize, 0xFFFFFFFF, 8);
        take(csize, 0xFFFFFFFF, 8);
        take(local, 0xFFFFFFFF, 8);
        take(disk, 0xFFFF, 4);
      }
      k += 4 + len;
    }
    pos += 46 + name_len + extra_len + comment_len;
    if (disk != 0) throw FormatError(mw + "lies on another disk: multi-disk archives are not supported");
    if (flags & 1) throw FormatError(mw + "is encrypted, which is not supported");
    if (method != 0 && method != 8)
      throw FormatError(mw + "uses compression method " + std::to_string(method) +
                        (method == 12 ? " (bzip2)" : method == 14 ? " (lzma)" : "") +
                        "; only stored (np.savez) and deflate (np.savez_compressed) members are read");
    if (member.size() < 5 || member.compare(member.size() - 4, 4, ".npy") != 0)
      throw FormatError(mw + "is not a .npy member (an .npz holds only NAME.npy files)");
    const std::string name = member.substr(0, member.size() - 4);
    if (!names.insert(name).second) throw FormatError(mw + "appears twice");
    // The local header repeats the name; the data follows it.
    if (local > cd_offset || cd_offset - local < 30 || get_le(b + local, 4) != kLocalSig)
      throw FormatError(mw + "its local header at offset " + std::to_string(local) + " is missing or damaged");
    const unsigned char* l = b + local;
    const std::size_t lname = get_le(l + 26, 2), lextra = get_le(l + 28, 2);
    if (get_le(l + 8, 2) != method || lname != name_len || cd_offset - local - 30 < lname ||
        std::memcmp(l + 30, member.data(), name_len) != 0)
      throw FormatError(mw + "its local header does not match the central directory");
    const std::uint64_t data = local + 30 + lname + lextra;
    if (data > cd_offset || csize > cd_offset - data)
      throw FormatError(mw + "its " + std::to_string(csize) + " data bytes run past the central directory");
    if (method == 0 && csize != usize)
      throw FormatError(mw + "is stored with " + std::to_string(csize) + " bytes but declares " +
                        std::to_string(usize) + " uncompressed");
    // Deflate expands at most ~1032:1; a larger claim cannot be true (and must not be allocated).
    if (method == 8 && usize / 1032 > csize + 1)
      throw FormatError(mw + "declares " + std::to_string(usize) + " bytes from " + std::to_string(csize) +
                        " compressed: more than deflate can expand");
    members.push_back({name, mw, method, crc, local, data, csize, usize});
  }
  if (pos != cd_end) throw FormatError(where + "the central directory has bytes after its last entry");
  // Members may not share bytes (overlapping entries would let a small file inflate many times).
  std::vector<const Member*> order;
  for (const Member& m : members) order.push_back(&m);
  std::sort(order.begin(), order.end(), [](const Member* a, const Member* b) { return a->local < b->local; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (order[i]->local < order[i - 1]->data + order[i - 1]->csize)
      throw FormatError(order[i]->where + "overlaps member '" + printable(order[i - 1]->name) + ".npy'");

  // Second pass: decode, check the CRC, parse the .npy inside.
  Npz npz;
  for (const Member& m : members) {
    std::string inflated;
    const char* bytes = z.data() + m.data;
    std::size_t n_bytes = static_cast<std::size_t>(m.csize);
    if (m.method == 8) {
      inflated = inflate_raw(b + m.data, static_cast<std::size_t>(m.csize), static_cast<std::size_t>(m.usize), m.where);
      bytes = inflated.data();
      n_bytes = inflated.size();
    }
    const std::uint32_t got = crc32(bytes, n_bytes);
    if (got != m.crc) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "CRC-32 is %08x, the archive says %08x", got, m.crc);
      throw FormatError(m.where + buf + ": the data is damaged");
    }
    npz.entries.emplace_back(m.name, parse_at(bytes, n_bytes, m.where));
  }
  return npz;
}

std::string zip_bytes(const Npz& npz, const std::string& where) {
  if (npz.entries.size() > 65535)
    throw FormatError(where + std::to_string(npz.entries.size()) + " arrays: save_npz writes at most 65535 (no zip64)");
  std::string out, central;
  std::set<std::string> names;
  for (const auto& entry : npz.entries) {
    const std::string& name = entry.first;
    if (name.empty() || !json::valid_utf8(name) || name.find('\0') != std::string::npos)
      throw ValueError(op_message("npz", "array name '" + printable(name) + "' must be non-empty UTF-8 text without NUL"));
    if (!names.insert(name).second) throw ValueError(op_message("npz", "array name '" + name + "' repeats"));
    const std::string member = name + ".npy";
    if (member.size() > 65535) throw ValueError(op_message("npz", "array name is longer than 65531 bytes"));
    const std::string data = npy_bytes(entry.second);
    const std::uint32_t crc = crc32(data.data(), data.size());
    if (data.size() >= 0xFFFFFFFFu || out.size() >= 0xFFFFFFFFu - 30 - member.size() - data.size())
      throw FormatError(where + "the archive would exceed 4 GiB: save_npz writes no zip64");
    bool ascii = true;
    for (const char ch : member) ascii = ascii && static_cast<unsigned char>(ch) < 128;
    const std::uint32_t flags = ascii ? 0 : 0x800;  // bit 11: the name is UTF-8
    const std::uint64_t offset = out.size();
    // Local file header. Time 00:00, date 1980-01-01 (files are reproducible).
    put_le(out, kLocalSig, 4);
    put_le(out, 20, 2);
    put_le(out, flags, 2);
    put_le(out, 0, 2);  // stored
    put_le(out, 0, 2);
    put_le(out, (0 << 9) | (1 << 5) | 1, 2);
    put_le(out, crc, 4);
    put_le(out, data.size(), 4);
    put_le(out, data.size(), 4);
    put_le(out, member.size(), 2);
    put_le(out, 0, 2);
    out += member;
    out += data;
    // Its central directory entry.
    put_le(central, kCentralSig, 4);
    put_le(central, (3 << 8) | 20, 2);  // made by: Unix, zip 2.0
    put_le(central, 20, 2);
    put_le(central, flags, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, (0 << 9) | (1 << 5) | 1, 2);
    put_le(central, crc, 4);
    put_le(central, data.size(), 4);
    put_le(central, data.size(), 4);
    put_le(central, member.size(), 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, std::uint64_t(0100644) << 16, 4);  // a regular file, rw-r--r--
    put_le(central, offset, 4);
    central += member;
  }
  if (out.size() + central.size() >= 0xFFFFFFFFu)
    throw FormatError(where + "the archive would exceed 4 GiB: save_npz writes no zip64");
  const std::uint64_t cd_offset = out.size();
  out += central;
  put_le(out, kEndSig, 4);
  put_le(out, 0, 2);
  put_le(out, 0, 2);
  put_le(out, npz.entries.size(), 2);
  put_le(out, npz.entries.size(), 2);
  put_le(out, central.size(), 4);
  put_le(out, cd_offset, 4);
  put_le(out, 0, 2);
  return out;
}

std::string read_file(const std::string& path, const std::string& where) {
  require_regular_file(path, where);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(where + "cannot open the file: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff n = in.tellg();
  if (!in || n < 0) throw FormatError(where + "cannot read the file");
  in.seekg(0);
  std::string s(static_cast<std::size_t>(n), '\0');
  in.read(&s[0], n);
  if (!in) throw FormatError(where + "reading the file failed");
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------- public

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

std::string inflate(const std::string& deflated, std::size_t expected_size, const std::string& where) {
  return inflate_raw(reinterpret_cast<const unsigned char*>(deflated.data()), deflated.size(), expected_size,
                     "[inflate] " + where + ": ");
}

Value parse(const std::string& bytes, const std::string& where) {
  return parse_at(bytes.data(), bytes.size(), "[npy] " + where + ": ");
}

std::string serialize(const Value& v) { return npy_bytes(v); }

Value read(const std::string& path) {
  const std::string where = "[npy] " + path + ": ";
  FileSource src(path, where);
  return read_npy(src, where);
}

Array load(const std::string& path) {
  Value v = read(path);
  if (v.is_index())
    throw FormatError("[npy] " + path + ": holds int64 data ('<i8'), which is not an Array; read it with load_index");
  return v.array;
}

IndexArray load_index(const std::string& path) {
  Value v = read(path);
  if (!v.is_index())
    throw FormatError("[npy] " + path + ": holds " + dtype_name(v.array.dtype()) +
                      " data, not int64 indices; read it with load");
  return v.index;
}

void save(const std::string& path, const Array& a) {
  if (!a.defined()) throw ValueError(op_message("npy", "cannot save an undefined Array to " + path));
  Value v;
  v.array = a;
  io::write_atomically(path, npy_bytes(v), "[npy] " + path + ": ");
}

void save(const std::string& path, const IndexArray& a) {
  Value v;
  v.index = a;
  io::write_atomically(path, npy_bytes(v), "[npy] " + path + ": ");
}

bool Npz::contains(const std::string& name) const {
  for (const auto& e : entries)
    if (e.first == name) return true;
  return false;
}

const Value& Npz::get(const std::string& name) const {
  for (const auto& e : entries)
    if (e.first == name) return e.second;
  std::string known;
  for (const auto& e : entries) known += (known.empty() ? "'" : ", '") + e.first + "'";
  throw FormatError("[npz] no array named '" + name + "' (the archive holds " + (known.empty() ? "none" : known) + ")");
}

const Array& Npz::array(const std::string& name) const {
  const Value& v = get(name);
  if (v.is_index()) throw FormatError("[npz] array '" + name + "' holds int64 data: read it with index()");
  return v.array;
}

const IndexArray& Npz::index(const std::string& name) const {
  const Value& v = get(name);
  if (!v.is_index())
    throw FormatError("[npz] array '" + name + "' holds " + dtype_name(v.array.dtype()) + " data: read it with array()");
  return v.index;
}

Npz& Npz::add(const std::string& name, const Array& a) {
  if (name.empty() || contains(name)) throw ValueError(op_message("npz", "array name '" + name + "' is empty or repeats"));
  if (!a.defined()) throw ValueError(op_message("npz", "array '" + name + "' is undefined"));
  Value v;
  v.array = a;
  entries.emplace_back(name, std::move(v));
  return *this;
}

Npz& Npz::add(const std::string& name, const IndexArray& a) {
  if (name.empty() || contains(name)) throw ValueError(op_message("npz", "array name '" + name + "' is empty or repeats"));
  if (a.data.size() != numel(a.shape))
    throw ShapeError(op_message("npz", "IndexArray '" + name + "' has shape " + shape_str(a.shape) + " but " +
                                           std::to_string(a.data.size()) + " elements"));
  Value v;
  v.index = a;
  entries.emplace_back(name, std::move(v));
  return *this;
}

Npz parse_npz(const std::string& bytes, const std::string& where) { return read_zip(bytes, "[npz] " + where + ": "); }

Npz load_npz(const std::string& path) {
  const std::string where = "[npz] " + path + ": ";
  return read_zip(read_file(path, where), where);
}

void save_npz(const std::string& path, const Npz& arrays) {
  const std::string where = "[npz] " + path + ": ";
  io::write_atomically(path, zip_bytes(arrays, where), where);
}

}  // namespace xg::io::npy
