#include <xgrad/io/input_file.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <xgrad/core/error.hpp>

namespace xg::io {

namespace {

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a named pipe (FIFO)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string problem_of(mode_t mode) {
  const std::string kind = kind_of(mode);
  if (kind.empty()) return "";
  if (S_ISDIR(mode)) return "is a folder, not a regular file";
  return "is " + kind + ", not a regular file (xgrad reads only regular files)";
}

std::string errno_problem(int err) {
  if (err == ENOENT) return "cannot be read: it does not exist";
  return std::string("cannot be read: ") + std::strerror(err);
}

[[noreturn]] void refuse(const std::string& path, const std::string& what, const std::string& problem, InputError kind) {
  const std::string m = what + " '" + path + "' " + problem;
  if (kind == InputError::usage) throw UsageError(m);
  throw FormatError(m);
}

// Closes a file descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string non_regular_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  return kind_of(st.st_mode);
}

std::string input_problem(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno_problem(errno);
  return problem_of(st.st_mode);
}

void require_input_file(const std::string& path, const std::string& what, InputError kind) {
  const std::string p = input_problem(path);
  if (!p.empty()) refuse(path, what, p, kind);
}

std::string size_text(std::uint64_t bytes) {
  const std::uint64_t kib = 1024, mib = kib * 1024, gib = mib * 1024;
  if (bytes >= gib && bytes % gib == 0) return std::to_string(bytes / gib) + " GiB";
  if (bytes >= mib && bytes % mib == 0) return std::to_string(bytes / mib) + " MiB";
  if (bytes >= kib && bytes % kib == 0) return std::to_string(bytes / kib) + " KiB";
  return std::to_string(bytes) + " bytes";
}

std::string read_input_file(const std::string& path, std::uint64_t limit, const std::string& what, InputError kind) {
  // Non-blocking: opening a FIFO for reading would otherwise wait for a writer right here.
  Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (f.fd < 0) {
    const int err = errno;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && !problem_of(st.st_mode).empty()) refuse(path, what, problem_of(st.st_mode), kind);
    refuse(path, what, errno_problem(err), kind);
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0) refuse(path, what, errno_problem(errno), kind);
  if (!S_ISREG(st.st_mode)) refuse(path, what, problem_of(st.st_mode), kind);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > limit)
    refuse(path, what,
           "is " + std::to_string(size) + " bytes, more than the limit of " + size_text(limit) + " for this input",
           kind);
  const int flags = ::fcntl(f.fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(f.fd, F_SETFL, flags & ~O_NONBLOCK);
  // Up to one byte past the limit: a file that grows while it is read is still bounded.
  std::string out(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (out.size() > limit) break;
      out.resize(std::min<std::uint64_t>(limit + 1, out.size() + 65536));
    }
    const ssize_t n = ::read(f.fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ValueError(what + " '" + path + "': reading it failed: " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  if (got > limit)
    refuse(path, what, "grew past the limit of " + size_text(limit) + " for this input while it was read", kind);
  out.resize(got);
  return out;
}

}  // namespace xg::io
