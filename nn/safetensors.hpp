// safetensors files: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F32"|"F64", "shape": [...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string>", ...}}
// then the raw little-endian data; offsets are relative to the end of the header.
//
// save() is atomic: it writes a temporary file in the same folder, flushes and fsyncs it,
// then renames it over the target, so a crash leaves the old file or the new one, never half.
// load() validates everything before it trusts anything: header length, JSON, dtypes,
// shapes, offsets inside the data section, sizes matching shapes, no overlaps, no holes or
// trailing bytes; every failure is a FormatError naming the file and what is wrong.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/array.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/nn/module.hpp>

namespace xg::nn::safetensors {

using NamedArrays = std::vector<std::pair<std::string, Array>>;
using Metadata = std::map<std::string, std::string>;

struct File {
  NamedArrays tensors;  // in file (offset) order
  Metadata metadata;
  const Array& get(const std::string& name) const;  // FormatError if absent
};

void save(const std::string& path, const NamedArrays& tensors, const Metadata& metadata = {});
// FormatError naming the key if a metadata entry cannot be saved (text that is not UTF-8):
// call it before work that must not be lost to a failing save.
void check_metadata(const Metadata& metadata, const std::string& path);
// fsync of the folder holding path, so a rename into it survives a power cut (best effort).
void sync_directory_of(const std::string& path);
File load(const std::string& path);
// The same checks on a file's bytes already in memory (received from another process);
// `name` stands for the path in messages.
File load_bytes(const std::string& bytes, const std::string& name);

// Module parameters by their hierarchical names.
void save_module(const std::string& path, const Module& m, const Metadata& metadata = {});
// Loads values into m's parameters: every parameter must be present with its exact shape
// and dtype, every value finite, and the file may hold nothing else. Returns the file's metadata.
Metadata load_module(const std::string& path, Module& m);

}  // namespace xg::nn::safetensors
