// io/atomic_file.hpp: the one writer of files written whole (checkpoints, logs, token files,
// exports): the target is the old file or the new one, never a part, and no temporary file
// is left behind.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/helpers.hpp"
#include <xgrad/io/atomic_file.hpp>

using namespace xg;
namespace fs = std::filesystem;

namespace {
std::size_t files_in(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.is_regular_file() || e.is_directory();
  return n;
}
}  // namespace

TEST_CASE("atomic file: commit replaces the target whole and leaves no temporary file", "[io]") {
  const fs::path dir = xgt::temp_dir("atomic_commit");
  const fs::path target = dir / "f.bin";
  { std::ofstream(target, std::ios::binary) << "old contents"; }
  io::AtomicFile f(target.string(), "[test] ");
  f.write("new ", 4);
  // Until commit the target keeps its old bytes.
  CHECK(xgt::read_file(target) == "old contents");
  f.write("bytes", 5);
  f.commit();
  CHECK(xgt::read_file(target) == "new bytes");
  CHECK(files_in(dir) == 1);
  io::write_atomically(target.string(), std::string("\0x", 2), "[test] ");
  CHECK(xgt::read_file(target) == std::string("\0x", 2));
  CHECK(files_in(dir) == 1);
}

TEST_CASE("atomic file: without commit or after a failure the target keeps its bytes", "[io]") {
  const fs::path dir = xgt::temp_dir("atomic_abandon");
  const fs::path target = dir / "f.bin";
  { std::ofstream(target, std::ios::binary) << "old"; }
  {
    io::AtomicFile f(target.string(), "[test] ");
    f.write("half of a new fi", 16);
  }  // abandoned, as when an exception unwinds a writer
  CHECK(xgt::read_file(target) == "old");
  CHECK(files_in(dir) == 1);
  {
    io::AtomicFile f(target.string(), "[test] ");
    f.write("something", 9);
    f.fail();  // a writer's own step failed (a seek, say)
    CHECK_THROWS_AS(f.commit(), FormatError);
  }
  CHECK(xgt::read_file(target) == "old");
  CHECK(files_in(dir) == 1);
  // A target that cannot be replaced (a folder): the message starts with `where`.
  fs::create_directories(dir / "sub");
  CHECK_THROWS_WITH(io::write_atomically((dir / "sub").string(), "x", "[test] sub: "),
                    Catch::StartsWith("[test] sub: writing failed"));
  CHECK(files_in(dir) == 2);
  // A folder that does not exist: the temporary file cannot be opened.
  CHECK_THROWS_WITH(io::write_atomically((dir / "missing" / "f").string(), "x", "[test] m: "),
                    Catch::StartsWith("[test] m: cannot open") && Catch::Contains("for writing"));
}
