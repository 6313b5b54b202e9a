#include <xgrad/io/safetensors.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/io/detail/json.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/version.hpp>

namespace xg::io::safetensors {

namespace {

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE floats expected");

std::string where(const std::string& path) { return "[safetensors] " + path + ": "; }

bool little_endian() {
  const std::uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

const char* dtype_tag(DType d) { return d == DType::float32 ? "F32" : "F64"; }

// The stored element types load() accepts. F16 and BF16 are widened to float32 on load.
enum class Stored { f32, f64, f16, bf16 };
std::size_t stored_bytes(Stored s) { return s == Stored::f64 ? 8 : s == Stored::f32 ? 4 : 2; }
DType loaded_dtype(Stored s) { return s == Stored::f64 ? DType::float64 : DType::float32; }

// IEEE 754 binary16 to binary32, exactly (every half value is a float): subnormals are
// normalised, infinities keep their sign, NaNs keep their sign and payload and become quiet
// (IEEE 754 conversion; what torch's Tensor.float() gives too, bit for bit).
float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F;
  std::uint32_t mant = h & 0x3FF;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13) | (mant ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: shift the mantissa up until its leading 1 is the implicit bit
    exp = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// bfloat16 is the top half of a binary32 (NaNs unchanged, signalling ones too, as in torch).
float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

const Array& File::get(const std::string& name) const {
  for (const auto& [n, a] : tensors)
    if (n == name) return a;
  throw FormatError("[safetensors] no tensor named '" + name + "'");
}

void save(const std::string& path, const NamedArrays& tensors, const Metadata& metadata) {
  if (!little_endian()) throw FormatError(where(path) + "big-endian hosts are not supported");
  // Keys in byte order, as before xgrad had its own JSON writer (tests cut into the text).
  std::map<std::string, json::Value> entries;
  std::size_t offset = 0;
  for (const auto& [name, a] : tensors) {
    if (name == "__metadata__" || entries.count(name))
      throw FormatError(where(path) + "tensor name '" + name + "' is reserved or repeated");
    if (!json::valid_utf8(name)) throw FormatError(where(path) + "tensor name is not valid UTF-8 text");
    const std::size_t bytes = a.size() * (a.dtype() == DType::float32 ? 4 : 8);
    json::Value shape = json::Value::make_array();
    for (const std::size_t d : a.shape()) shape.push(json::Value::make_uint(d));
    json::Value entry = json::Value::make_object();
    entry.set("data_offsets", json::Value::make_array({json::Value::make_uint(offset), json::Value::make_uint(offset + bytes)}));
    entry.set("dtype", json::Value::make_string(dtype_tag(a.dtype())));
    entry.set("shape", std::move(shape));
    entries.emplace(name, std::move(entry));
    offset += bytes;
  }
  check_metadata(metadata, path);
  // Every file records the xgrad version that wrote it (unless the caller set the key).
  Metadata meta = metadata;
  meta.emplace("xgrad_version", XGRAD_VERSION_STRING);
  json::Value meta_json = json::Value::make_object();
  for (const auto& [key, value] : meta) meta_json.set(key, json::Value::make_string(value));
  entries.emplace("__metadata__", std::move(meta_json));
  json::Value header = json::Value::make_object();
  for (auto& [key, value] : entries) header.set(key, std::move(value));
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  const std::uint64_t n = text.size();

  AtomicFile out(path, where(path));
  out.write(&n, 8);
  out.write(text.data(), text.size());
  for (const auto& named : tensors) {
    const Array& a = named.second;  // not a structured binding: lambdas may not capture those in C++17
    if (a.size() == 0) continue;    // empty tensors have no bytes (and no data pointer)
    detail::dispatch(a.dtype(), [&](auto t) {
      using T = decltype(t);
      out.write(a.data<T>(), sizeof(T) * a.size());
    });
  }
  out.commit();
}

void check_metadata(const Metadata& metadata, const std::string& path) {
  for (const auto& [key, value] : metadata) {
    if (!json::valid_utf8(key) || !json::valid_utf8(value))
      throw FormatError(where(path) + "metadata '" + key + "' is not valid UTF-8 text and cannot be saved");
  }
}


namespace {

// A tensor's entry of the header, checked against the data section.
struct Entry {
  std::string name, tag;  // tag: the stored dtype as written ("F32", ...)
  Stored stored;
  Shape shape;
  std::uint64_t begin, end;
};

// What the header says, validated against the file's size: everything load() checks before it
// reads a tensor's bytes.
struct Layout {
  std::uint64_t header_bytes = 0;  // N, the JSON text's length
  std::vector<Entry> entries;      // in header order
  Metadata metadata;
};

// Reads and checks the header of a seekable stream; `path` names it in messages. Reads only
// the 8-byte length and the header text, whatever the size of the data section.
Layout read_layout(std::istream& in, const std::string& path) {
  in.seekg(0, std::ios::end);
  const std::uint64_t size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  if (size < 8) throw FormatError(where(path) + "file has " + std::to_string(size) + " bytes, fewer than the 8-byte header length");
  std::uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (n > size - 8)
    throw FormatError(where(path) + "header length " + std::to_string(n) + " exceeds the " + std::to_string(size - 8) +
                      " bytes after it");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  // Padding: the format allows trailing spaces after the JSON object.
  json::Value header;
  try {
    header = json::parse(text);
  } catch (const FormatError& e) {
    throw FormatError(where(path) + "header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw FormatError(where(path) + "header is not a JSON object");

  Layout layout;
  layout.header_bytes = n;
  const std::uint64_t data_size = size - 8 - n;
  std::vector<Entry>& entries = layout.entries;
  for (const auto& [name, e] : header.members()) {
    if (name == "__metadata__") {
      if (!e.is_object()) throw FormatError(where(path) + "__metadata__ is not an object");
      for (const auto& [key, value] : e.members()) {
        if (!value.is_string()) throw FormatError(where(path) + "__metadata__['" + key + "'] is not a string");
        layout.metadata[key] = value.str();
      }
      continue;
    }
    const std::string what = where(path) + "tensor '" + name + "': ";
    const json::Value* dtype = e.find("dtype");
    const json::Value* shape = e.find("shape");
    const json::Value* off = e.find("data_offsets");
    if (!e.is_object() || !dtype || !shape || !off) throw FormatError(what + "needs dtype, shape and data_offsets");
    if (!dtype->is_string()) throw FormatError(what + "dtype is not a string");
    const std::string tag = dtype->str();
    Entry en;
    en.name = name;
    en.tag = tag;
    if (tag == "F32")
      en.stored = Stored::f32;
    else if (tag == "F64")
      en.stored = Stored::f64;
    else if (tag == "F16")
      en.stored = Stored::f16;
    else if (tag == "BF16")
      en.stored = Stored::bf16;
    else
      throw FormatError(what + "dtype " + tag + " is not supported (F32, F64, and F16/BF16 read as float32)");
    if (!shape->is_array()) throw FormatError(what + "shape is not an array");
    // Every dimension and the product of the non-zero ones stay below 2^40 elements, so no
    // element count, byte count or (signed) stride downstream can overflow, even when another
    // dimension is 0 and the tensor is empty.
    const std::uint64_t limit = std::uint64_t(1) << 40;
    if (shape->items().size() > 16)
      throw FormatError(what + "shape has " + std::to_string(shape->items().size()) + " dimensions (at most 16)");
    std::uint64_t count = 1, nonzero = 1;
    for (const json::Value& d : shape->items()) {
      std::uint64_t v = 0;
      if (!d.as_uint(v)) throw FormatError(what + "shape has a non-integer or negative entry");
      if (v > limit || (v != 0 && nonzero > limit / v))
        throw FormatError(what + "shape " + shape->dump() + " is implausibly large (2^40 elements at most)");
      if (v != 0) nonzero *= v;
      count *= v;
      en.shape.push_back(static_cast<std::size_t>(v));
    }
    if (!off->is_array() || off->items().size() != 2 || !off->items()[0].as_uint(en.begin) ||
        !off->items()[1].as_uint(en.end))
      throw FormatError(what + "data_offsets must be two non-negative integers");
    if (en.begin > en.end || en.end > data_size)
      throw FormatError(what + "data_offsets [" + std::to_string(en.begin) + ", " + std::to_string(en.end) +
                        "] fall outside the " + std::to_string(data_size) + "-byte data section");
    if (en.end - en.begin != count * stored_bytes(en.stored))
      throw FormatError(what + "data_offsets span " + std::to_string(en.end - en.begin) + " bytes, shape " +
                        shape_str(en.shape) + " of " + tag + " needs " + std::to_string(count * stored_bytes(en.stored)));
    entries.push_back(en);
  }
  // The data section is covered exactly: no overlaps, no holes, nothing after the last tensor.
  // Empty tensors occupy no bytes and take no part in this.
  std::vector<const Entry*> spans;
  for (const Entry& en : entries)
    if (en.end > en.begin) spans.push_back(&en);
  std::sort(spans.begin(), spans.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    if (spans[i]->begin < covered)
      throw FormatError(where(path) + "tensors '" + spans[i - 1]->name + "' and '" + spans[i]->name + "' overlap");
    if (spans[i]->begin > covered)
      throw FormatError(where(path) + "bytes " + std::to_string(covered) + ".." + std::to_string(spans[i]->begin) +
                        " of the data section before tensor '" + spans[i]->name + "' belong to no tensor");
    covered = spans[i]->end;
  }
  if (covered != data_size)
    throw FormatError(where(path) + "the data section has " + std::to_string(data_size - covered) +
                      " trailing bytes that belong to no tensor");
  return layout;
}

// The whole of load(), from any seekable stream; `path` names it in messages.
File load_from(std::istream& in, const std::string& path) {
  const Layout layout = read_layout(in, path);
  const std::uint64_t n = layout.header_bytes;
  File file;
  file.metadata = layout.metadata;
  for (const Entry& en : layout.entries) {
    Array a = Array::empty(en.shape, loaded_dtype(en.stored));
    in.seekg(static_cast<std::streamoff>(8 + n + en.begin));
    if (en.stored == Stored::f16 || en.stored == Stored::bf16) {
      std::vector<std::uint16_t> raw(a.size());
      in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size() * 2));
      float* out = a.data<float>();
      for (std::size_t i = 0; i < raw.size(); ++i)
        out[i] = en.stored == Stored::f16 ? half_to_float(raw[i]) : bf16_to_float(raw[i]);
    } else {
      detail::dispatch(a.dtype(), [&](auto t) {
        using T = decltype(t);
        in.read(reinterpret_cast<char*>(a.data<T>()), static_cast<std::streamsize>(a.size() * sizeof(T)));
      });
    }
    if (!in) throw FormatError(where(path) + "could not read tensor '" + en.name + "'");
    file.tensors.emplace_back(en.name, std::move(a));
  }
  return file;
}

// A folder, FIFO or device is refused before it is opened (a FIFO would wait for a writer);
// a missing file is reported by the open that follows.
void refuse_non_regular(const std::string& path) {
  const std::string kind = non_regular_kind(path);
  if (!kind.empty()) throw FormatError(where(path) + "cannot read the file: it is " + kind + ", not a regular file");
}

}  // namespace

File load(const std::string& path) {
  refuse_non_regular(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(where(path) + "cannot open the file");
  return load_from(in, path);
}

Header load_header(const std::string& path) {
  refuse_non_regular(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(where(path) + "cannot open the file");
  const Layout layout = read_layout(in, path);
  Header h;
  h.metadata = layout.metadata;
  for (const Entry& en : layout.entries) h.tensors.push_back({en.name, en.tag, en.shape});
  return h;
}

File load_bytes(const std::string& bytes, const std::string& name) {
  std::istringstream in(bytes, std::ios::binary);
  return load_from(in, name);
}

}  // namespace xg::io::safetensors
