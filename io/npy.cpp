// NumPy .npy/.npz reading and writing (see io/npy.hpp): the .npy header (its Python literal:
// io/detail/py_literal.hpp), arrays in and out, and .npz archives through the zip container
// (io/detail/zip.hpp, deflate in io/detail/inflate.hpp), all checked byte by byte.
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
#include <xgrad/io/detail/bytes.hpp>
#include <xgrad/io/detail/inflate.hpp>
#include <xgrad/io/detail/py_literal.hpp>
#include <xgrad/io/detail/zip.hpp>

namespace xg::io::npy {

namespace {

using detail::get_le;
using detail::Lit;
using detail::LitParser;
using detail::little_endian_host;
using detail::printable;
using detail::put_le;
using detail::require_little_endian_host;
using detail::require_regular_file;

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE floats expected");

const char kMagic[] = "\x93NUMPY";  // 6 bytes
const std::uint64_t kMaxElements = std::uint64_t(1) << 40;  // as safetensors: no count can overflow
const std::size_t kMaxDims = 32;                            // NumPy 1.x's NPY_MAXDIMS

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
      xg::detail::dispatch(v.array.dtype(), [&](auto t) {
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
    xg::detail::dispatch(v.array.dtype(), [&](auto t) {
      using T = decltype(t);
      out.append(reinterpret_cast<const char*>(v.array.data<T>()), v.array.size() * sizeof(T));
    });
  }
  return out;
}


// An .npz archive's arrays: each NAME.npy member of the zip container parsed as .npy.
Npz read_zip(const std::string& z, const std::string& where) {
  Npz npz;
  detail::read_npz_zip(z, where, [&](const std::string& name, const std::string& mw, const char* bytes, std::size_t n) {
    npz.entries.emplace_back(name, parse_at(bytes, n, mw));
  });
  return npz;
}

// The .npz archive of `npz`: array names checked (non-empty UTF-8 without NUL, unique, short
// enough for zip), then one stored NAME.npy member each, serialized as the writer reaches it.
std::string zip_bytes(const Npz& npz, const std::string& where) {
  if (npz.entries.size() > 65535)
    throw FormatError(where + std::to_string(npz.entries.size()) + " arrays: save_npz writes at most 65535 (no zip64)");
  std::vector<std::string> members;
  std::set<std::string> names;
  for (const auto& entry : npz.entries) {
    const std::string& name = entry.first;
    if (name.empty() || !json::valid_utf8(name) || name.find('\0') != std::string::npos)
      throw ValueError(op_message("npz", "array name '" + printable(name) + "' must be non-empty UTF-8 text without NUL"));
    if (!names.insert(name).second) throw ValueError(op_message("npz", "array name '" + name + "' repeats"));
    members.push_back(name + ".npy");
    if (members.back().size() > 65535) throw ValueError(op_message("npz", "array name is longer than 65531 bytes"));
  }
  return detail::write_stored_zip(members, [&](std::size_t i) { return npy_bytes(npz.entries[i].second); }, where);
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

std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc) { return detail::crc32(data, size, crc); }

std::string inflate(const std::string& deflated, std::size_t expected_size, const std::string& where) {
  return detail::inflate_raw(reinterpret_cast<const unsigned char*>(deflated.data()), deflated.size(), expected_size,
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