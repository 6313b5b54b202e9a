// The safetensors container (io/safetensors.hpp) against hostile headers: huge dimensions next
// to a zero cannot overflow a stride. (A checkpoint's metadata bounds: tests/train/test_checkpoint_resume.cpp;
// corrupt files through the CLI: the robustness catalogue; random bytes: tests/fuzz/.)
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "tests/support/helpers.hpp"
#include <xgrad/io/safetensors.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return temp_dir("safetensors_" + name); }

// A safetensors file with this header JSON and data bytes.
void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream out(p, std::ios::binary);
  const std::uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

}  // namespace

TEST_CASE("safetensors: huge dimensions next to a zero are refused (no stride overflow)", "[io][safetensors]") {
  const fs::path dir = fresh_dir("dims");
  write_raw(dir / "z.safetensors", R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "");
  CHECK_THROWS_WITH(io::safetensors::load((dir / "z.safetensors").string()), Catch::Contains("implausibly large"));
  write_raw(dir / "one.safetensors", R"({"a":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", "");
  CHECK_THROWS_AS(io::safetensors::load((dir / "one.safetensors").string()), FormatError);
  write_raw(dir / "ok.safetensors", R"({"a":{"dtype":"F32","shape":[0,1024,1024],"data_offsets":[0,0]}})", "");
  CHECK(io::safetensors::load((dir / "ok.safetensors").string()).get("a").size() == 0);
  fs::remove_all(dir);
}
