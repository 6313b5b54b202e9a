// The shared check of input files (io/input_file.hpp): only regular files are read; a FIFO
// with no writer, a device, a folder is refused by name without waiting on it; a file read
// whole stays within its stated limit. (Through the CLI: the robustness catalogue's
// cli-1300.. and file-1300.. cases.)
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/io/input_file.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

template <class E, class F>
std::string message_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("input files: a regular file is read whole", "[io][input_file]") {
  const fs::path dir = temp_dir("input_file_regular");
  const std::string p = (dir / "a.txt").string();
  std::string bytes(200000, 'x');
  bytes[7] = '\0';
  std::ofstream(p, std::ios::binary) << bytes;
  CHECK(io::input_problem(p).empty());
  CHECK(io::non_regular_kind(p).empty());
  CHECK(io::read_input_file(p, 200000, "[test] FILE") == bytes);
  std::ofstream((dir / "empty").string(), std::ios::binary).flush();
  CHECK(io::read_input_file((dir / "empty").string(), 10, "x").empty());
}

TEST_CASE("input files: a file over its limit is refused naming both sizes", "[io][input_file]") {
  const fs::path dir = temp_dir("input_file_limit");
  const std::string p = (dir / "a.txt").string();
  std::ofstream(p, std::ios::binary) << std::string(1025, 'x');
  const std::string m = message_of<UsageError>([&] { io::read_input_file(p, 1024, "[test] --config"); });
  CHECK(has(m, "[test] --config '" + p + "'"));
  CHECK(has(m, "1025 bytes"));
  CHECK(has(m, "1 KiB"));
  CHECK(io::read_input_file(p, 1025, "[test] --config").size() == 1025);
  CHECK(io::size_text(io::kConfigLimit) == "16 MiB");
  CHECK(io::size_text(io::kTextLimit) == "1 GiB");
  CHECK(io::size_text(12) == "12 bytes");
}

TEST_CASE("input files: a named pipe with no writer is refused without waiting", "[io][input_file]") {
  const fs::path dir = temp_dir("input_file_fifo");
  const std::string p = (dir / "pipe").string();
  REQUIRE(::mkfifo(p.c_str(), 0600) == 0);
  CHECK(io::non_regular_kind(p) == "a named pipe (FIFO)");
  CHECK(has(io::input_problem(p), "is a named pipe (FIFO), not a regular file"));
  // Opening it for reading would block here until a writer came: the test would hang.
  const std::string m = message_of<UsageError>([&] { io::read_input_file(p, 1024, "[test] FILES"); });
  CHECK(has(m, "[test] FILES '" + p + "' is a named pipe (FIFO), not a regular file"));
  const std::string f =
      message_of<FormatError>([&] { io::require_input_file(p, "[test] the log", io::InputError::format); });
  CHECK(has(f, "named pipe"));
}

TEST_CASE("input files: devices/folders and missing files are refused by name", "[io][input_file]") {
  const std::string zero = message_of<UsageError>([] { io::read_input_file("/dev/zero", 1024, "[test] --tokenizer"); });
  CHECK(has(zero, "'/dev/zero' is a character device, not a regular file"));
  CHECK(has(message_of<UsageError>([] { io::read_input_file("/dev/null", 1024, "x"); }), "character device"));
  const fs::path dir = temp_dir("input_file_kinds");
  CHECK(has(message_of<UsageError>([&] { io::read_input_file(dir.string(), 1024, "x"); }), "is a folder"));
  CHECK(has(message_of<UsageError>([&] { io::read_input_file((dir / "nope").string(), 1024, "x"); }),
            "does not exist"));
  CHECK(has(io::input_problem((dir / "nope").string()), "does not exist"));
  // A link is followed: a link to /dev/zero is a character device.
  const fs::path link = dir / "zero.txt";
  fs::create_symlink("/dev/zero", link);
  CHECK(io::non_regular_kind(link.string()) == "a character device");
}
