// libFuzzer target: the checkpoint loader (train/checkpoint.cpp: metadata -> configuration ->
// model, then the parameters) on arbitrary bytes, as `xgrad generate` and `inspect` load a
// model.safetensors; a model that loads is also run on one token. Any outcome but success or
// an xg::Error is a finding. Run by scripts/fuzz.sh.
#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/train/checkpoint.hpp>
#include "fuzz_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = xgfuzz::write_input("checkpoint", data, size);
  if (path.empty()) return 0;
  try {
    xg::train::LoadedModel m = xg::train::load_model(path);
    (void)m.info.vocab.to_json();
    if (m.gpt) {
      xg::NoGradGuard ng;
      (void)m.gpt->logits(xg::IndexArray({1, 1}, std::vector<std::int64_t>{0}));
    }
  } catch (const xg::Error&) {
  }
  return 0;
}
