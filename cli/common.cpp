// Shared pieces of the subcommands: flag validators, output-path checks, JSON output, warnings.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "commands.hpp"
#include <xgrad/core/error.hpp>

namespace xg::cli {

namespace fs = std::filesystem;

const CLI::Validator& non_negative_integer() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
          return "must be a non-negative integer, got '" + s + "'";
        errno = 0;
        (void)std::strtoull(s.c_str(), nullptr, 10);
        if (errno == ERANGE) return "'" + s + "' is out of range";
        return {};
      },
      "UINT");
  return v;
}

const CLI::Validator& integer() {
  static const CLI::Validator v(
      [](std::string& s) -> std::string {
        const std::size_t digits = !s.empty() && s[0] == '-' ? 1 : 0;
        if (s.size() == digits || s.find_first_not_of("0123456789", digits) != std::string::npos)
          return "must be an integer, got '" + s + "'";
        errno = 0;
        (void)std::strtoll(s.c_str(), nullptr, 10);
        if (errno == ERANGE) return "'" + s + "' is out of range";
        return {};
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
  // The one sure test: create it (and remove it again; the command writes it at the end).
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) bad_path(command, flag, path, std::string("cannot create it: ") + std::strerror(errno));
  ::close(fd);
  ::unlink(path.c_str());
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

}  // namespace xg::cli
