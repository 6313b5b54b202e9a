// half_check: the xgrad half of the F16/BF16 safetensors test (torch_checkpoints.py half).
//
// Usage: half_check FILE.safetensors
//
// The file (written by tools/xgrad_torch.py's safetensors writer from torch tensors) holds
// pairs NAME (F16 or BF16) and NAME.expected (F32, torch's NAME.float()). io::safetensors::load
// widens NAME to float32; every element must equal NAME.expected bit for bit (NaN payloads,
// the sign of zero, subnormals included). Exit 0 if all pairs match, 1 otherwise.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include <xgrad/xgrad.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FILE.safetensors\n", argv[0]);
    return 2;
  }
  try {
    const xg::io::safetensors::File f = xg::io::safetensors::load(argv[1]);
    int pairs = 0, failures = 0;
    for (const auto& named : f.tensors) {
      const std::string& name = named.first;
      if (name.size() > 9 && name.compare(name.size() - 9, 9, ".expected") == 0) continue;
      const xg::Array& got = named.second;
      const xg::Array& want = f.get(name + ".expected");
      ++pairs;
      std::size_t bad = 0, first = got.size();
      if (got.dtype() != xg::DType::float32 || want.dtype() != xg::DType::float32 || got.shape() != want.shape()) {
        std::printf("  FAIL  %s: loaded as %s %s, expected float32 %s\n", name.c_str(), xg::dtype_name(got.dtype()),
                    xg::shape_str(got.shape()).c_str(), xg::shape_str(want.shape()).c_str());
        ++failures;
        continue;
      }
      for (std::size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(got.data<float>() + i, want.data<float>() + i, 4) != 0 && bad++ == 0) first = i;
      if (bad) {
        std::uint32_t g, w;
        std::memcpy(&g, got.data<float>() + first, 4);
        std::memcpy(&w, want.data<float>() + first, 4);
        std::printf("  FAIL  %s: %zu of %zu elements differ; first at %zu: 0x%08x, torch 0x%08x\n", name.c_str(), bad,
                    got.size(), first, g, w);
        ++failures;
      } else {
        std::printf("  ok    %s: %zu elements equal torch's float32 bit for bit\n", name.c_str(), got.size());
      }
    }
    std::printf("half_check: %d pairs, %d failed\n", pairs, failures);
    return failures || pairs == 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "half_check: %s\n", e.what());
    return 1;
  }
}
