// The zip container of .npz files (internal, io/npy.cpp; io/detail/zip.cpp): NumPy's np.savez
// writes one stored NAME.npy member per array, np.savez_compressed deflates them.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace xg::io::detail {

/// Reads the .npz zip archive `z`: checks the whole central directory first (members must be
/// NAME.npy, stored or deflate, unique, not overlapping, within the file), then decodes each
/// member, checks its CRC-32 and calls visit(NAME, member_where, bytes, n) in archive order.
/// FormatError (messages start with `where`, or with `member_where` for a member) otherwise.
void read_npz_zip(const std::string& z, const std::string& where,
                  const std::function<void(const std::string& name, const std::string& member_where, const char* bytes,
                                           std::size_t n)>& visit);

/// A zip archive of stored (uncompressed) members named `members`, member i's bytes from
/// bytes_of(i) (called once each, in order), as np.savez writes it: no zip64, so FormatError
/// when the archive would exceed 4 GiB.
std::string write_stored_zip(const std::vector<std::string>& members,
                             const std::function<std::string(std::size_t)>& bytes_of, const std::string& where);

}  // namespace xg::io::detail
