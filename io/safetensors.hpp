/// \file
/// safetensors files: an 8-byte little-endian header length N, N bytes of JSON
/// \verbatim
///   {"<name>": {"dtype": "F32"|"F64", "shape": [...], "data_offsets": [begin, end]}, ...,
///    "__metadata__": {"<key>": "<string>", ...}}
/// \endverbatim
/// then the raw little-endian data; offsets are relative to the end of the header. load()
/// also reads F16 and BF16 tensors, widened exactly to float32 (a signalling NaN half
/// becomes a quiet NaN, as in torch); save() writes F32 and F64. save() records the writing xgrad version in
/// the metadata key "xgrad_version" (unless the caller sets it).
///
/// save() is atomic (io/atomic_file.hpp): it writes a temporary file in the same folder, flushes
/// and fsyncs it, then renames it over the target, so a crash leaves the old file or the new one,
/// never half. Modules are saved and loaded by nn/safetensors.hpp on top of this.
/// load() validates everything before it trusts anything: header length, JSON, dtypes,
/// shapes, offsets inside the data section, sizes matching shapes, no overlaps, no holes or
/// trailing bytes; every failure is a FormatError naming the file and what is wrong.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/array.hpp>
#include <xgrad/core/error.hpp>

/// Reading and writing safetensors files (tensors by name plus string metadata).
namespace xg::io::safetensors {

/// Tensors by name, in order.
using NamedArrays = std::vector<std::pair<std::string, Array>>;
/// The file's `__metadata__`: string keys to string values.
using Metadata = std::map<std::string, std::string>;

/// The contents of a loaded file.
struct File {
  NamedArrays tensors;  ///< In file (offset) order.
  Metadata metadata;    ///< The `__metadata__` entries.
  /// The tensor named `name`; FormatError if absent.
  const Array& get(const std::string& name) const;
};

/// A tensor as a file's header describes it (its bytes are not read).
struct TensorInfo {
  std::string name;   ///< The tensor's name.
  std::string dtype;  ///< The stored element type: "F32", "F64", "F16" or "BF16".
  Shape shape;        ///< The tensor's shape.
};

/// A file's header: what load() returns but the tensors' values.
struct Header {
  std::vector<TensorInfo> tensors;  ///< In the header's order.
  Metadata metadata;                ///< The `__metadata__` entries.
};

/// Writes `tensors` and `metadata` to `path` atomically (see above); FormatError naming the
/// file if writing fails.
void save(const std::string& path, const NamedArrays& tensors, const Metadata& metadata = {});
/// FormatError naming the key if an entry of `metadata` cannot be saved to `path` (text that
/// is not UTF-8): call it before work that must not be lost to a failing save.
void check_metadata(const Metadata& metadata, const std::string& path);
/// Reads and validates the file at `path` (see above); FormatError naming the file and what
/// is wrong.
File load(const std::string& path);
/// Reads only the header of the file at `path` (the 8-byte length and the JSON text, however
/// large the file) with every check load() makes that needs no tensor bytes: the header, the
/// dtypes, shapes and offsets against the size of the data section, no overlaps, holes or
/// trailing bytes. FormatError naming the file and what is wrong, as load().
Header load_header(const std::string& path);
/// The same checks on a file's `bytes` already in memory (received from another process);
/// `name` stands for the path in messages.
File load_bytes(const std::string& bytes, const std::string& name);

}  // namespace xg::io::safetensors
