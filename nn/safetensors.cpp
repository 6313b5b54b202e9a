#include "nn/safetensors.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <unistd.h>

#include "core/xt.hpp"

namespace xg::nn::safetensors {

namespace {

using nlohmann::json;

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE floats expected");

std::string where(const std::string& path) { return "[safetensors] " + path + ": "; }

bool little_endian() {
  const std::uint16_t one = 1;
  unsigned char b;
  std::memcpy(&b, &one, 1);
  return b == 1;
}

const char* dtype_tag(DType d) { return d == DType::float32 ? "F32" : "F64"; }
std::size_t dtype_bytes(DType d) { return d == DType::float32 ? 4 : 8; }

}  // namespace

const Array& File::get(const std::string& name) const {
  for (const auto& [n, a] : tensors)
    if (n == name) return a;
  throw FormatError("[safetensors] no tensor named '" + name + "'");
}

void save(const std::string& path, const NamedArrays& tensors, const Metadata& metadata) {
  if (!little_endian()) throw FormatError(where(path) + "big-endian hosts are not supported");
  json header = json::object();
  std::size_t offset = 0;
  for (const auto& [name, a] : tensors) {
    if (name == "__metadata__" || header.contains(name))
      throw FormatError(where(path) + "tensor name '" + name + "' is reserved or repeated");
    const std::size_t bytes = a.size() * dtype_bytes(a.dtype());
    header[name] = {{"dtype", dtype_tag(a.dtype())}, {"shape", a.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  check_metadata(metadata, path);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so the data starts 8-byte aligned
  const std::uint64_t n = text.size();

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw FormatError(where(path) + "cannot open " + tmp + " for writing: " + std::strerror(errno));
  bool ok = std::fwrite(&n, 8, 1, f) == 1 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& named : tensors) {
    const Array& a = named.second;  // not a structured binding: lambdas may not capture those in C++17
    if (!ok) break;
    if (a.size() == 0) continue;  // empty tensors have no bytes (and no data pointer)
    detail::dispatch(a.dtype(), [&](auto t) {
      using T = decltype(t);
      ok = std::fwrite(a.data<T>(), sizeof(T), a.size(), f) == a.size();
    });
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw FormatError(where(path) + "writing failed: " + why);
  }
  sync_directory_of(path);
}

void check_metadata(const Metadata& metadata, const std::string& path) {
  for (const auto& [key, value] : metadata) {
    try {
      (void)json(key).dump();
      (void)json(value).dump();
    } catch (const json::exception&) {
      throw FormatError(where(path) + "metadata '" + key + "' is not valid UTF-8 text and cannot be saved");
    }
  }
}

void sync_directory_of(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (dir.empty()) dir = path.find('/') == 0 ? "/" : ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: the rename itself is already atomic
  ::fsync(fd);
  ::close(fd);
}

File load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError(where(path) + "cannot open the file");
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
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    throw FormatError(where(path) + "header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw FormatError(where(path) + "header is not a JSON object");

  File file;
  const std::uint64_t data_size = size - 8 - n;
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      if (!e.is_object()) throw FormatError(where(path) + "__metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string()) throw FormatError(where(path) + "__metadata__['" + m.key() + "'] is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string what = where(path) + "tensor '" + name + "': ";
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      throw FormatError(what + "needs dtype, shape and data_offsets");
    if (!e["dtype"].is_string()) throw FormatError(what + "dtype is not a string");
    const std::string tag = e["dtype"].get<std::string>();
    Entry en;
    en.name = name;
    if (tag == "F32")
      en.dtype = DType::float32;
    else if (tag == "F64")
      en.dtype = DType::float64;
    else
      throw FormatError(what + "dtype " + tag + " is not supported (F32, F64)");
    if (!e["shape"].is_array()) throw FormatError(what + "shape is not an array");
    // Every dimension and the product of the non-zero ones stay below 2^40 elements, so no
    // element count, byte count or (signed) stride downstream can overflow, even when another
    // dimension is 0 and the tensor is empty.
    const std::uint64_t limit = std::uint64_t(1) << 40;
    if (e["shape"].size() > 16) throw FormatError(what + "shape has " + std::to_string(e["shape"].size()) + " dimensions (at most 16)");
    std::uint64_t count = 1, nonzero = 1;
    for (const json& d : e["shape"]) {
      if (!d.is_number_unsigned()) throw FormatError(what + "shape has a non-integer or negative entry");
      const std::uint64_t v = d.get<std::uint64_t>();
      if (v > limit || (v != 0 && nonzero > limit / v))
        throw FormatError(what + "shape " + e["shape"].dump() + " is implausibly large (2^40 elements at most)");
      if (v != 0) nonzero *= v;
      count *= v;
      en.shape.push_back(static_cast<std::size_t>(v));
    }
    const json& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw FormatError(what + "data_offsets must be two non-negative integers");
    en.begin = off[0].get<std::uint64_t>();
    en.end = off[1].get<std::uint64_t>();
    if (en.begin > en.end || en.end > data_size)
      throw FormatError(what + "data_offsets [" + std::to_string(en.begin) + ", " + std::to_string(en.end) +
                        "] fall outside the " + std::to_string(data_size) + "-byte data section");
    if (en.end - en.begin != count * dtype_bytes(en.dtype))
      throw FormatError(what + "data_offsets span " + std::to_string(en.end - en.begin) + " bytes, shape " +
                        shape_str(en.shape) + " of " + tag + " needs " + std::to_string(count * dtype_bytes(en.dtype)));
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
  for (const Entry& en : entries) {
    Array a = Array::empty(en.shape, en.dtype);
    in.seekg(static_cast<std::streamoff>(8 + n + en.begin));
    detail::dispatch(en.dtype, [&](auto t) {
      using T = decltype(t);
      in.read(reinterpret_cast<char*>(a.data<T>()), static_cast<std::streamsize>(a.size() * sizeof(T)));
    });
    if (!in) throw FormatError(where(path) + "could not read tensor '" + en.name + "'");
    file.tensors.emplace_back(en.name, std::move(a));
  }
  return file;
}

void save_module(const std::string& path, const Module& m, const Metadata& metadata) {
  NamedArrays arrays;
  for (const auto& [name, t] : m.named_parameters()) arrays.emplace_back(name, t.value());
  save(path, arrays, metadata);
}

Metadata load_module(const std::string& path, Module& m) {
  File f = load(path);
  const auto params = m.named_parameters();
  for (const auto& [name, a] : f.tensors) {
    bool known = false;
    for (const auto& [pn, p] : params) known = known || pn == name;
    if (!known) throw FormatError(where(path) + "tensor '" + name + "' is not a parameter of this model");
  }
  for (const auto& [name, p] : params) {
    const Array* found = nullptr;
    for (const auto& [n, a] : f.tensors)
      if (n == name) found = &a;
    if (!found) throw FormatError(where(path) + "parameter '" + name + "' is missing");
    if (found->shape() != p.shape() || found->dtype() != p.dtype())
      throw FormatError(where(path) + "parameter '" + name + "' has shape " + shape_str(found->shape()) + " " +
                        dtype_name(found->dtype()) + ", the model expects " + shape_str(p.shape()) + " " +
                        dtype_name(p.dtype()));
  }
  for (const auto& [name, a] : f.tensors) {
    const std::size_t bad = a.first_nonfinite();
    if (bad != a.size())
      throw FormatError(where(path) + "parameter '" + name + "' element " + std::to_string(bad) + " is " +
                        std::to_string(a.flat(bad)) + ": parameters must be finite");
  }
  for (auto& [name, p] : m.named_parameters())
    for (const auto& [n, a] : f.tensors)
      if (n == name) p.set_value(a);
  return f.metadata;
}

}  // namespace xg::nn::safetensors
