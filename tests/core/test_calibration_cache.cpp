// The calibration cache (core/detail/calibration.hpp): a speed ratio measured once per CPU and
// build is read back by every later process, so that kernel choices near a threshold do not
// change from run to run. Here on files of the test's own folder; ctest's
// cli_calibration_cache runs `xgrad --version --verbose` on one (tests/support/calibration_cache.cmake).
#include "tests/support/helpers.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>

using namespace xg;
using xgt::EnvScope;

namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_all(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

const std::string kHead = "xgrad calibration cache 1\n";

}  // namespace

TEST_CASE("a calibration is measured once and then read from the cache file", "[calibration_cache]") {
  const auto dir = xgt::temp_dir("calibration_once");
  const std::string path = (dir / "sub" / "calibration-v1.txt").string();  // the folder is created too
  int runs = 0;
  const auto measure = [&runs] {
    ++runs;
    return 1.375;
  };
  const detail::Calibration first = detail::calibrated_in(path, "cpu A | build 1", "attention_tiles_dpbf16", measure);
  CHECK(runs == 1);
  CHECK_FALSE(first.cached);
  CHECK(first.value == 1.375);
  REQUIRE(std::filesystem::exists(path));
  CHECK(read_all(path).rfind(kHead, 0) == 0);
  CHECK(read_all(path).find("cpu A | build 1\tattention_tiles_dpbf16\t1.375\n") != std::string::npos);

  const detail::Calibration again = detail::calibrated_in(path, "cpu A | build 1", "attention_tiles_dpbf16", measure);
  CHECK(runs == 1);  // not measured again
  CHECK(again.cached);
  CHECK(again.value == 1.375);

  // Another CPU or build, or another ratio, is measured and kept beside it.
  const detail::Calibration other = detail::calibrated_in(path, "cpu B | build 1", "attention_tiles_dpbf16", [] { return 0.5; });
  CHECK_FALSE(other.cached);
  CHECK(detail::calibrated_in(path, "cpu A | build 1", "bf16_gemm_dot", [] { return 2.0; }).value == 2.0);
  const auto entries = detail::read_calibration_file(path);
  REQUIRE(entries.size() == 3);
  CHECK(entries.at({"cpu A | build 1", "attention_tiles_dpbf16"}) == 1.375);
  CHECK(entries.at({"cpu B | build 1", "attention_tiles_dpbf16"}) == 0.5);
  CHECK(entries.at({"cpu A | build 1", "bf16_gemm_dot"}) == 2.0);
  // No temporary file left beside it.
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir / "sub")) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("a value written to the cache reads back to the same double", "[calibration_cache]") {
  const auto dir = xgt::temp_dir("calibration_digits");
  const std::string path = (dir / "calibration-v1.txt").string();
  const double v = 1.0 / 3.0 + 1.0;
  CHECK(detail::calibrated_in(path, "k", "ratio", [v] { return v; }).value == v);
  const detail::Calibration back = detail::calibrated_in(path, "k", "ratio", [] { return 9.0; });
  CHECK(back.cached);
  CHECK(back.value == v);  // bit for bit: the file holds the shortest text that reads back
}

TEST_CASE("a measurement that is not a positive finite ratio is returned but not kept", "[calibration_cache]") {
  const auto dir = xgt::temp_dir("calibration_zero");
  const std::string path = (dir / "calibration-v1.txt").string();
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    int runs = 0;
    const auto measure = [&] {
      ++runs;
      return bad;
    };
    const detail::Calibration c = detail::calibrated_in(path, "k", "ratio", measure);
    CHECK_FALSE(c.cached);
    CHECK((c.value == bad || (std::isnan(bad) && std::isnan(c.value))));
    detail::calibrated_in(path, "k", "ratio", measure);
    CHECK(runs == 2);  // measured again: nothing was kept
    CHECK(detail::read_calibration_file(path).empty());
  }
}

TEST_CASE("an entry another process wrote while this one measured wins", "[calibration_cache]") {
  const auto dir = xgt::temp_dir("calibration_race");
  const std::string path = (dir / "calibration-v1.txt").string();
  // The measurement stands in for the other process: it writes its own value first.
  const detail::Calibration c = detail::calibrated_in(path, "k", "ratio", [&path] {
    write_all(path, kHead + "k\tratio\t3\n");
    return 2.0;
  });
  CHECK(c.cached);
  CHECK(c.value == 3.0);
  CHECK(detail::read_calibration_file(path).at({"k", "ratio"}) == 3.0);
}

TEST_CASE("a cache that cannot be written leaves each process its own measurement", "[calibration_cache]") {
  const auto dir = xgt::temp_dir("calibration_unwritable");
  write_all(dir / "file", "not a folder\n");
  const std::string path = (dir / "file" / "calibration-v1.txt").string();  // under a regular file
  int runs = 0;
  const auto measure = [&runs] {
    ++runs;
    return 1.5;
  };
  CHECK(detail::calibrated_in(path, "k", "ratio", measure).value == 1.5);
  CHECK(detail::calibrated_in(path, "k", "ratio", measure).value == 1.5);
  CHECK(runs == 2);
  // A file this user may not read is left as it is (root reads it all the same: then it is read).
  const std::string locked = (dir / "locked.txt").string();
  write_all(locked, kHead + "k\tratio\t3\n");
  std::filesystem::permissions(locked, std::filesystem::perms::none);
  const detail::Calibration l = detail::calibrated_in(locked, "k", "other", measure);
  CHECK(l.value == 1.5);
  if (::access(locked.c_str(), R_OK) != 0) {
    CHECK(runs == 3);
    std::filesystem::permissions(locked, std::filesystem::perms::owner_read);
    CHECK(detail::read_calibration_file(locked).size() == 1);  // not written over
  }
  std::filesystem::permissions(locked, std::filesystem::perms::owner_all);
  runs = 3;
  // ... and no path (XGRAD_CACHE_DIR=off) measures every time.
  CHECK_FALSE(detail::calibrated_in("", "k", "ratio", measure).cached);
  CHECK(runs == 4);
}

TEST_CASE("a cache file that does not parse is an error naming the file and the line", "[calibration_cache]") {
  const auto dir = xgt::temp_dir("calibration_bad");
  const std::string path = (dir / "calibration-v1.txt").string();
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {"", "is empty"},
      {"xgrad calibration cache 2\n", "line 1: starts with 'xgrad calibration cache 2'"},
      {kHead + "k\tratio\t1.5", "does not end with a newline"},
      {kHead + "k\tratio\n", "line 2: 'k\\x09ratio' is not KEY<tab>NAME<tab>VALUE"},
      {kHead + "# a comment\nk\tratio\t1.5\tmore\n", "line 3: "},
      {kHead + "\tratio\t1.5\n", "line 2: the key '' is empty"},
      {kHead + "k\x01\tratio\t1.5\n", "line 2: the key 'k\\x01'"},
      {kHead + "k\tRatio\t1.5\n", "line 2: the name 'Ratio' is not [a-z0-9_]"},
      {kHead + "k\t\t1.5\n", "line 2: the name ''"},
      {kHead + "k\tratio\tinf\n", "line 2: the value 'inf' of ratio is not a positive number"},
      {kHead + "k\tratio\tnan\n", "the value 'nan'"},
      {kHead + "k\tratio\t0\n", "the value '0'"},
      {kHead + "k\tratio\t-1.5\n", "the value '-1.5'"},
      {kHead + "k\tratio\t1e7\n", "the value '1e7'"},
      {kHead + "k\tratio\t 1.5\n", "the value ' 1.5'"},
      {kHead + "k\tratio\t1.5x\n", "the value '1.5x'"},
      {kHead + "k\tratio\t\n", "the value ''"},
      {kHead + "k\tratio\t1.5\n\nk\tratio\t1.5\n", "line 4: ratio appears twice"},
      {kHead + std::string(1 << 20, '#') + "\n", "more than a cache of this kind ever holds"},
  };
  for (const Case& c : cases) {
    write_all(path, c.text);
    INFO("file: '" << shown_value(c.text, 80) << "'");
    const std::string msg = xgt::error_of<FormatError>([&] { detail::read_calibration_file(path); });
    CHECK(msg.find("calibration cache " + path) == 0);
    CHECK(msg.find(c.expect) != std::string::npos);
    CHECK(msg.find("delete the file and xgrad measures again") != std::string::npos);
    // The lookup refuses it too: a broken cache is never measured over.
    CHECK_THROWS_AS(detail::calibrated_in(path, "k", "ratio", [] { return 1.5; }), FormatError);
  }
  // What the file itself writes reads back: comments, blank lines, several keys.
  write_all(path, kHead + "# c\n\nk one\tratio\t1.5\nk two\tratio_2\t0.25\n");
  CHECK(detail::read_calibration_file(path).size() == 2);
}

TEST_CASE("the cache file follows XGRAD_CACHE_DIR then XDG_CACHE_HOME then HOME", "[calibration_cache]") {
  const EnvScope home("HOME", "/home/someone");
  {
    const EnvScope dir("XGRAD_CACHE_DIR", "/tmp/xg cache"), xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(detail::calibration_cache_path() == "/tmp/xg cache/calibration-v1.txt");
    CHECK(calibration_cache_path() == detail::calibration_cache_path());
  }
  {
    const EnvScope dir("XGRAD_CACHE_DIR", "off");
    CHECK(detail::calibration_cache_path().empty());
  }
  {
    const EnvScope dir("XGRAD_CACHE_DIR", std::nullopt), xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(detail::calibration_cache_path() == "/xdg/xgrad/calibration-v1.txt");
  }
  {
    const EnvScope dir("XGRAD_CACHE_DIR", ""), xdg("XDG_CACHE_HOME", "relative");  // a relative XDG path is ignored
    CHECK(detail::calibration_cache_path() == "/home/someone/.cache/xgrad/calibration-v1.txt");
  }
  {
    const EnvScope dir("XGRAD_CACHE_DIR", std::nullopt), xdg("XDG_CACHE_HOME", std::nullopt), no_home("HOME", std::nullopt);
    CHECK(detail::calibration_cache_path().empty());
  }
}

TEST_CASE("the cache key names this CPU and this build on one line", "[calibration_cache]") {
  const std::string key = detail::calibration_key();
  INFO("key: " << key);
  CHECK(key.find('\t') == std::string::npos);
  CHECK(key.find('\n') == std::string::npos);
  CHECK(key.find(" | xgrad ") != std::string::npos);
#if defined(__x86_64__)
  CHECK(key.find(" family ") != std::string::npos);
  CHECK(key.find(" model ") != std::string::npos);
#endif
#if defined(__OPTIMIZE__)
  CHECK(key.find(" optimised") != std::string::npos);
#else
  CHECK(key.find(" unoptimised") != std::string::npos);
#endif
}
