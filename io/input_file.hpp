/// \file
/// Reading input files (docs/reliability.md, "Input files"). xgrad reads only regular files:
/// a folder, a named pipe (FIFO), a device or a socket given where a file is read is refused by
/// name before anything waits on it (opening a FIFO for reading waits for a writer; a device
/// such as /dev/zero never ends). A file read whole has a stated size limit, checked against
/// its size before the first byte is read.
#pragma once

#include <cstdint>
#include <string>

namespace xg::io {

/// What `path` is when it is not a regular file, for messages: "a folder", "a named pipe
/// (FIFO)", "a character device", "a block device", "a socket"; "" for a regular file or a
/// path that does not exist (links are followed).
std::string non_regular_kind(const std::string& path);

/// Why `path` cannot be read as a regular file, "" when it can: "does not exist", "is a
/// folder, not a file", "is a named pipe (FIFO), not a regular file", ... (links are
/// followed; nothing is opened).
std::string input_problem(const std::string& path);

/// How a refused input is reported.
enum class InputError {
  usage,   ///< UsageError (exit 2): a path the user named
  format,  ///< FormatError (exit 1): a file found in a run folder or a container
};

/// Throws (UsageError or FormatError, "<what> '<path>' <problem>") unless `path` is an
/// existing regular file. For readers that open the file themselves.
void require_input_file(const std::string& path, const std::string& what, InputError kind = InputError::usage);

/// The whole of the regular file `path`, at most `limit` bytes. Refuses (as
/// require_input_file) anything else without waiting on it: the file is opened non-blocking
/// and checked with fstat before it is read. A file larger than `limit` is refused naming
/// both sizes; a read that fails is a ValueError.
std::string read_input_file(const std::string& path, std::uint64_t limit, const std::string& what,
                            InputError kind = InputError::usage);

/// "1 GiB", "16 MiB", "300 KiB", "12 bytes": a size for messages.
std::string size_text(std::uint64_t bytes);

/// The size limits of the files xgrad reads whole (docs/reliability.md lists them).
inline constexpr std::uint64_t kMiB = std::uint64_t(1) << 20;
inline constexpr std::uint64_t kConfigLimit = 16 * kMiB;      ///< train --config (JSON)
inline constexpr std::uint64_t kTokenizerLimit = 256 * kMiB;  ///< a tokenizer file (.model, .bin)
inline constexpr std::uint64_t kTextLimit = 1024 * kMiB;      ///< a text read whole (encode, tokenizer train, charlm)

}  // namespace xg::io
