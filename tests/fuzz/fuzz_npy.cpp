// libFuzzer target: the .npy and .npz readers (io/npy.cpp: header literal parser, zip reader,
// deflate decoder) on arbitrary bytes, the file readers too (npy::read, npy::load_npz). Any
// outcome but a loaded value or an xg::Error is a finding. Run by scripts/fuzz.sh.
#include <string>

#include <xgrad/core/error.hpp>
#include <xgrad/io/npy.hpp>
#include "fuzz_input.hpp"

namespace {

double touch(const xg::io::npy::Value& v) {  // read every loaded element
  double sum = 0;
  if (v.is_index())
    for (const auto x : v.index.data) sum += static_cast<double>(x);
  else
    for (std::size_t i = 0; i < v.array.size(); ++i) sum += v.array.flat(i);
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace npy = xg::io::npy;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  double sum = 0;
  try {
    sum += touch(npy::parse(bytes, "fuzz"));
  } catch (const xg::Error&) {
  }
  try {
    for (const auto& e : npy::parse_npz(bytes, "fuzz").entries) sum += touch(e.second);
  } catch (const xg::Error&) {
  }
  // The raw deflate decoder, with the declared size taken from the first two bytes.
  if (size >= 2) {
    try {
      (void)npy::inflate(bytes.substr(2), static_cast<std::size_t>(data[0]) * 256 + data[1], "fuzz");
    } catch (const xg::Error&) {
    }
  }
  const std::string path = xgfuzz::write_input("npy", data, size);
  if (!path.empty()) {
    try {
      sum += touch(npy::read(path));
    } catch (const xg::Error&) {
    }
  }
  (void)sum;
  return 0;
}
