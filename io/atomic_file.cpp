#include <xgrad/io/atomic_file.hpp>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include <xgrad/core/error.hpp>

namespace xg::io {

AtomicFile::AtomicFile(std::string path, std::string where)
    : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())), where_(std::move(where)) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw FormatError(where_ + "cannot open " + tmp_ + " for writing: " + std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (f_) std::fclose(f_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  if (ok_ && bytes > 0) ok_ = std::fwrite(data, 1, bytes, f_) == bytes;
}

void AtomicFile::flush() {
  if (!ok_ || std::fflush(f_) != 0) {
    ok_ = false;
    throw FormatError(where_ + "writing " + tmp_ + " failed: " + (errno ? std::strerror(errno) : "a write failed"));
  }
}

void AtomicFile::commit() {
  bool ok = ok_ && std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  ok = (std::fclose(f_) == 0) && ok;
  f_ = nullptr;
  if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const std::string why = errno ? std::strerror(errno) : "a write failed";
    std::remove(tmp_.c_str());
    throw FormatError(where_ + "writing failed: " + why);
  }
  committed_ = true;
  sync_directory_of(path_);
}

void write_atomically(const std::string& path, const std::string& bytes, const std::string& where) {
  AtomicFile f(path, where);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

void sync_directory_of(const std::string& path) {
  std::string dir = path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
  if (dir.empty()) dir = path.find('/') == 0 ? "/" : ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: the rename itself is already atomic
  ::fsync(fd);
  ::close(fd);
}

}  // namespace xg::io
