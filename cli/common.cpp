// Shared pieces of the subcommands: flag validators, output-path checks, JSON output, warnings.
#include <CLI/CLI.hpp>
#include <cctype>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <new>
#include <thread>
#include <unistd.h>

#include "commands.hpp"
#include <nlohmann/json.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/version.hpp>

namespace xg::cli {

namespace fs = std::filesystem;

namespace {
// The integer validators' check: digits from `first` on (at least one), then in range for
// strtoull (is_signed false) or strtoll; the error names `what` ("a non-negative integer").
std::string integer_error(const std::string& s, std::size_t first, bool is_signed, const char* what) {
  if (s.size() <= first || s.find_first_not_of("0123456789", first) != std::string::npos)
    return std::string("must be ") + what + ", got '" + s + "'";
  errno = 0;
  if (is_signed)
    (void)std::strtoll(s.c_str(), nullptr, 10);
  else
    (void)std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return "'" + s + "' is out of range";
  return {};
}
}  // namespace

const CLI::Validator& non_negative_integer() {
  static const CLI::Validator v(
      [](std::string& s) { return integer_error(s, 0, false, "a non-negative integer"); }, "UINT");
  return v;
}

const CLI::Validator& integer() {
  static const CLI::Validator v(
      [](std::string& s) {
        return integer_error(s, !s.empty() && s[0] == '-' ? 1 : 0, true, "an integer");
      },
      "INT");
  return v;
}

const CLI::Validator& number() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        if (!s.empty() && !std::isspace(static_cast<unsigned char>(s[0]))) (void)std::strtod(s.c_str(), &end);
        if (!end || *end != '\0') return "must be a number, got '" + s + "'";
        return {};
      },
      "NUMBER");
  return v;
}

const CLI::Validator& non_empty_path() {
  static const CLI::Validator v([](std::string& s) -> std::string { return s.empty() ? "must name a file, got ''" : ""; },
                                "FILE");
  return v;
}

namespace {

[[noreturn]] void bad_path(const std::string& command, const std::string& flag, const std::string& path,
                           const std::string& why) {
  throw UsageError(op_message(command, flag + " '" + path + "': " + why));
}

// The folder a new entry `path` would be created in ("." for a bare name).
fs::path parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

}  // namespace

void check_output_file(const std::string& command, const std::string& flag, const std::string& path) {
  if (path.empty()) bad_path(command, flag, path, "must name a file");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) bad_path(command, flag, path, "is a folder, not a file");
  if (fs::exists(st)) {
    if (!fs::is_regular_file(st)) bad_path(command, flag, path, "exists and is not a regular file");
    if (::access(path.c_str(), W_OK) != 0)
      bad_path(command, flag, path, std::string("cannot be written: ") + std::strerror(errno));
    return;
  }
  const fs::path dir = parent_of(path);
  const fs::file_status dst = fs::status(dir, ec);
  if (!fs::exists(dst)) bad_path(command, flag, path, "its folder " + dir.string() + " does not exist");
  if (!fs::is_directory(dst)) bad_path(command, flag, path, dir.string() + " is not a directory");
  // The one sure test: create a file in its folder (and remove it again; the command writes
  // `path` at the end). The probe has a name of its own, so `path` never appears early: under
  // mpirun every rank checks the same outputs at once, and another rank's probe at `path`
  // would read as "exists".
  const std::string probe = path + ".probe." + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) bad_path(command, flag, path, std::string("cannot create it: ") + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_output_folder(const std::string& command, const std::string& flag, const std::string& path) {
  if (path.empty()) bad_path(command, flag, path, "must name a folder");
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st)) bad_path(command, flag, path, "exists and is not a directory");
    if (::access(path.c_str(), W_OK | X_OK) != 0)
      bad_path(command, flag, path, std::string("cannot write in it: ") + std::strerror(errno));
    return;
  }
  // The nearest existing ancestor must be a folder we may create entries in.
  fs::path p = fs::absolute(path, ec).lexically_normal();
  while (p.has_relative_path()) {
    p = p.has_filename() ? p.parent_path() : p.parent_path().parent_path();  // "a/b/" ends in an empty name
    const fs::file_status ps = fs::status(p, ec);
    if (!fs::exists(ps)) continue;
    if (!fs::is_directory(ps)) bad_path(command, flag, path, "cannot create the folder: " + p.string() + " is not a directory");
    if (::access(p.c_str(), W_OK | X_OK) != 0)
      bad_path(command, flag, path, "cannot create the folder in " + p.string() + ": " + std::strerror(errno));
    return;
  }
}

namespace {

// `path` made absolute with every symbolic link resolved, also a link whose target does not
// exist yet and links in its folders; the part that does not exist is kept as spelled
// (lexically normalised).
fs::path resolved(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec).lexically_normal();
  for (int hops = 0; hops < 40; ++hops) {  // a cycle of links ends here (the OS says ELOOP)
    p = fs::weakly_canonical(p, ec);
    if (ec || !fs::is_symlink(fs::symlink_status(p, ec))) break;  // the final name is no (dangling) link
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = (target.is_absolute() ? target : p.parent_path() / target).lexically_normal();
  }
  return p;
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty() || a == "-" || b == "-") return false;
  if (a == b) return true;
  std::error_code ec;
  if (fs::equivalent(a, b, ec) && !ec) return true;  // both exist: the same inode (hard links too)
  return resolved(a) == resolved(b);
}

void check_distinct_files(const std::string& command, const std::vector<FileRole>& files) {
  for (std::size_t i = 0; i < files.size(); ++i)
    for (std::size_t j = i + 1; j < files.size(); ++j) {
      const FileRole& a = files[i];
      const FileRole& b = files[j];
      if (!a.output && !b.output) continue;  // two inputs may be one file
      if (!same_file(a.path, b.path)) continue;
      const FileRole& out = a.output ? a : b;
      const FileRole& other = a.output ? b : a;
      throw UsageError(op_message(
          command, out.flag + " '" + out.path + "' and " + other.flag + " '" + other.path + "' name the same file: " +
                       (other.output ? "one output would replace the other" : "the output would replace the input") +
                       "; give another path"));
    }
}

nlohmann::ordered_json command_json(const std::string& command) {
  nlohmann::ordered_json j;
  j["command"] = command;
  j["xgrad_version"] = XGRAD_VERSION_STRING;
  return j;
}

void write_json(const std::string& command, const std::string& flag, const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text << "\n" << std::flush;
    if (!std::cout) throw ValueError(op_message(command, flag + " -: writing the JSON document to stdout failed"));
    return;
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw ValueError(op_message(command, flag + " '" + path + "': cannot write: " + std::strerror(errno)));
  f << text << "\n";
  f.close();
  if (!f) throw ValueError(op_message(command, flag + " '" + path + "': writing the JSON document failed"));
}

void warn(const std::string& message) { std::cerr << "xgrad: warning: " << message << "\n" << std::flush; }

std::string help_pointer(const std::string& command) {
  return command.empty() ? " (see 'xgrad --help')" : " (see 'xgrad " + command + " --help')";
}

Failure describe_failure(const std::exception_ptr& e, const std::string& command) {
  try {
    std::rethrow_exception(e);
  } catch (const UsageError& x) {
    return {2, "xgrad: " + std::string(x.what()) + help_pointer(command)};
  } catch (const Error& x) {
    return {1, "xgrad: " + std::string(x.what())};
  } catch (const fs::filesystem_error& x) {
    const std::string path = x.path1().empty() ? std::string() : x.path1().string() + ": ";
    return {1, "xgrad: " + path + x.code().message()};
  } catch (const std::bad_alloc&) {
    return {1, "xgrad: out of memory"};
  } catch (const std::exception& x) {
    return {1, "xgrad: error: " + std::string(x.what())};
  } catch (...) {
    return {1, "xgrad: unknown error"};
  }
}

void print_line(const std::string& line) {
  std::string m = line;
  for (char& c : m)
    if (c == '\n' || c == '\r') c = ' ';
  std::cerr << (m + "\n");  // one write
}

bool quiet_rank() {
  try {
    return dist::detect_launch().rank > 0;
  } catch (const Error&) {  // a bad XGRAD_MPI: the command that launches (train) reports it
    return false;
  }
}

void linger() {
  // mpirun ends the whole job as soon as one rank exits non-zero: had this rank gone first,
  // rank 0 might be killed before its message is out. Rank 0 fails the same way at about the
  // same moment and then mpirun ends this rank (SIGTERM: silently). Bounded, for launchers
  // that let the other ranks run on (srun without --kill-on-bad-exit) and for a rank 0 that
  // did not fail.
  std::this_thread::sleep_for(std::chrono::seconds(3));
}

namespace {

// std::cout's buffer: writes to file descriptor 1 and keeps the reason of the first failed
// write (C stdio would forget it: a later fflush has nothing left to write). Line-buffered on
// a terminal, in 4 KiB blocks otherwise, like stdout.
class StdoutBuffer : public std::streambuf {
 public:
  StdoutBuffer() : line_(::isatty(STDOUT_FILENO) == 1) { setp(buf_, buf_ + sizeof buf_); }
  int error() const { return error_; }
  bool failed() const { return failed_; }

 protected:
  int_type overflow(int_type c) override {
    if (!drain()) return traits_type::eof();
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    *pptr() = traits_type::to_char_type(c);
    pbump(1);
    if (line_ && traits_type::to_char_type(c) == '\n' && !drain()) return traits_type::eof();
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    const std::streamsize done = std::streambuf::xsputn(s, n);
    if (line_ && done > 0 && std::memchr(s, '\n', static_cast<std::size_t>(done)) != nullptr && !drain()) return 0;
    return done;
  }
  int sync() override { return drain() ? 0 : -1; }

 private:
  bool drain() {
    const char* p = pbase();
    std::size_t left = static_cast<std::size_t>(pptr() - pbase());
    while (left > 0 && !failed_) {
      const ssize_t w = ::write(STDOUT_FILENO, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        failed_ = true;
        error_ = w < 0 ? errno : 0;
        break;
      }
      p += w;
      left -= static_cast<std::size_t>(w);
    }
    setp(buf_, buf_ + sizeof buf_);  // after a failure the rest is dropped: it cannot arrive in order
    return !failed_;
  }
  char buf_[4096];  // the block size C stdio uses for pipes and files
  bool line_;
  bool failed_ = false;
  int error_ = 0;
};

StdoutBuffer* g_stdout = nullptr;

}  // namespace

void install_stdout() {
  std::fflush(stdout);
  // Never destroyed: std::cout is flushed once more after main returns, after the static
  // objects of this file would be gone.
  g_stdout = new StdoutBuffer;
  std::cout.rdbuf(g_stdout);
}

int finish_stdout() {
  std::cout.flush();
  const bool stream_failed = !std::cout;  // a write or flush through std::cout failed
  const bool flush_failed = std::fflush(stdout) != 0 || std::ferror(stdout);  // C stdio, if anything used it
  const int err = g_stdout && g_stdout->failed() ? g_stdout->error() : flush_failed ? errno : 0;
  if (!stream_failed && !flush_failed && !(g_stdout && g_stdout->failed())) return 0;
  if (quiet_rank()) {
    linger();
    return 1;
  }
  print_line("xgrad: writing the results to stdout failed" + (err != 0 ? std::string(": ") + std::strerror(err) : std::string()) +
             " (the output is lost)");
  return 1;
}

}  // namespace xg::cli
