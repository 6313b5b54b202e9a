/// \file
/// NumPy .npy and .npz files: arrays in and out of xgrad.
///
/// .npy (NumPy format versions 1.0, 2.0 and 3.0 read; 1.0 written, byte for byte what NumPy
/// 1.24's np.save writes for the same array): the magic "\x93NUMPY",
/// two version bytes, a little-endian header length (2 bytes in 1.0, 4 in 2.0/3.0), a Python
/// dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with spaces
/// and a newline, then the raw data. Supported element types:
///   '<f4' float32 and '<f8' float64  -> xg::Array (load)
///   '<i8' int64 (token ids, targets)  -> xg::IndexArray (load_index)
/// xgrad's Arrays hold only float32/float64, so int64 data gets its own type instead of a
/// float64 copy (which would silently round ids above 2^53): IndexArray is what the ops take
/// for indices (ops::embedding, cross_entropy targets). read() returns whichever the file holds.
/// Only C order, little-endian data. Everything else is a FormatError naming the file and what
/// is wrong, with the numpy call that converts: Fortran order (np.ascontiguousarray), big
/// endian ('>f8': a.astype('<f8')), other dtypes (int32, float16, bool, structured, object /
/// pickled), bad magic, unknown version, a malformed header (not a dict literal, missing or
/// extra keys, negative or huge shape), truncated data and trailing bytes.
///
/// .npz (what np.savez and np.savez_compressed write): a zip archive of NAME.npy members.
/// Members stored (np.savez) and deflate-compressed (np.savez_compressed) are both read: the
/// inflater is xgrad's own (RFC 1951, no zlib). Each member's CRC-32 and size are checked; zip64
/// records (archives over 4 GiB or 65535 members) are read. Encrypted members, other
/// compression methods (bzip2, lzma), multi-disk archives, data before the archive, and members
/// whose name does not end in ".npy" are a FormatError. load_npz reads the whole archive into
/// memory first. save_npz writes stored (uncompressed) members with their CRC-32, names as given
/// plus ".npy" (so np.load(path)[name] finds them), at most 65535 members and 4 GiB.
///
/// Writing (save, save_npz) is atomic like every xgrad file: a temporary file in the same folder,
/// flushed and fsynced, then renamed over the target.
///
/// Why not xtensor's xt::load_npy: it reads a truncated file without complaint (the missing
/// elements are whatever the fresh buffer held), reads dimensions with a stringstream without
/// checking them, allocates whatever a header's shape asks for, and has no .npz support; errors
/// it does find are std::runtime_error without the file name. This parser checks every byte
/// count before it trusts it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/array.hpp>
#include <xgrad/core/error.hpp>

/// NumPy .npy and .npz files: reading and writing Arrays and IndexArrays.
namespace xg::io::npy {

/// One stored array: float32/float64 data in `array`, int64 data in `index` (array undefined).
struct Value {
  Array array;       ///< float32 / float64 data (undefined for int64 data)
  IndexArray index;  ///< int64 data (empty for float data)
  /// Whether the stored data is int64.
  bool is_index() const { return !array.defined(); }
  /// The stored array's shape.
  const Shape& shape() const { return is_index() ? index.shape : array.shape(); }
};

/// .npy files.
Value read(const std::string& path);             ///< any supported element type
Array load(const std::string& path);             ///< float32 / float64; FormatError for int64
IndexArray load_index(const std::string& path);  ///< int64; FormatError for floats
void save(const std::string& path, const Array& a);        ///< '<f4' or '<f8'
void save(const std::string& path, const IndexArray& a);   ///< '<i8'
/// The same from and to bytes in memory; `where` names the source in error messages.
Value parse(const std::string& bytes, const std::string& where = "<bytes>");
/// The .npy bytes of `v` (what save() writes).
std::string serialize(const Value& v);

/// .npz archives. Names are the member names without ".npy" (as np.load(path).files lists them).
struct Npz {
  std::vector<std::pair<std::string, Value>> entries;  ///< in archive order

  /// Whether a member named `name` exists.
  bool contains(const std::string& name) const;
  const Value& get(const std::string& name) const;          ///< FormatError listing the names if absent
  const Array& array(const std::string& name) const;        ///< FormatError if absent or int64
  const IndexArray& index(const std::string& name) const;   ///< FormatError if absent or float
  Npz& add(const std::string& name, const Array& a);        ///< ValueError if the name repeats or is empty
  /// Appends the int64 array `a` as `name`; ValueError if the name repeats or is empty.
  Npz& add(const std::string& name, const IndexArray& a);
};

/// Reads the .npz archive at `path` (stored or deflate members).
Npz load_npz(const std::string& path);
/// Writes `arrays` to `path` as a .npz archive of stored members, atomically.
void save_npz(const std::string& path, const Npz& arrays);
/// An .npz archive from `bytes` in memory; `where` names it in error messages.
Npz parse_npz(const std::string& bytes, const std::string& where = "<bytes>");

/// Utilities of the zip layer, public for tests and tools: the CRC-32 of zip/zlib/PNG
/// (reflected polynomial 0xEDB88320), and a raw deflate (RFC 1951) decoder whose output must
/// be exactly expected_size bytes (FormatError naming `where` otherwise, or for a malformed stream).
std::uint32_t crc32(const void* data, std::size_t size, std::uint32_t crc = 0);
/// Decodes the raw deflate stream `deflated` into exactly `expected_size` bytes.
std::string inflate(const std::string& deflated, std::size_t expected_size, const std::string& where);

}  // namespace xg::io::npy
