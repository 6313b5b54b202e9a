/// \file
/// The one atomic-file writer: every checkpoint, log, token file and export xgrad writes whole
/// goes through it. Bytes go to a temporary file `PATH.tmp.PID` in the same folder; commit()
/// flushes and fsyncs it, renames it over `PATH` and fsyncs the folder, so a crash or a power
/// cut leaves the old file or the new one, never half of one, and the rename itself survives.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

/// File formats and files: JSON, safetensors containers, .npy/.npz, and atomic writes. Nothing
/// here knows about modules, tapes or training.
namespace xg::io {

/// A file written whole or not at all (see the file's description).
class AtomicFile {
 public:
  /// Opens the temporary file beside `path`; FormatError starting with `where` if it cannot.
  AtomicFile(std::string path, std::string where);
  /// Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;             ///< One temporary file, one owner.
  AtomicFile& operator=(const AtomicFile&) = delete;  ///< One temporary file, one owner.

  /// Appends `bytes` bytes at `data`; a failure is remembered and reported by commit().
  void write(const void* data, std::size_t bytes);
  /// The open stream, for writers that seek back to patch a header (fseek, fwrite); a failure
  /// of theirs is to be reported with fail().
  std::FILE* stream() { return f_; }
  /// The temporary file's path (its bytes so far, after flush()).
  const std::string& temporary_path() const { return tmp_; }
  /// Hands the bytes written so far to the OS, so the temporary file can be read (or mapped)
  /// before commit(); FormatError starting with `where` if that fails.
  void flush();
  /// Marks the file as failed: commit() will throw and leave the target untouched.
  void fail() { ok_ = false; }
  /// Flush, fsync, rename over the target, fsync of the folder. FormatError starting with
  /// `where` ("writing failed: ...") if anything failed; the temporary file is then removed.
  void commit();

 private:
  std::string path_, tmp_, where_;
  std::FILE* f_ = nullptr;
  bool ok_ = true, committed_ = false;
};

/// Writes `bytes` to `path` through an AtomicFile; FormatError starting with `where` if that
/// fails.
void write_atomically(const std::string& path, const std::string& bytes, const std::string& where);

/// fsync of the folder holding `path`, so a rename into it survives a power cut (best effort).
void sync_directory_of(const std::string& path);

}  // namespace xg::io
