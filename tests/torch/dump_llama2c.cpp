// dump_llama2c: the xgrad half of the llama2.c import cross-check
// (tests/torch/llama2c_crosscheck.py).
//
// Usage: dump_llama2c CHECKPOINT.safetensors OUT.json IDS PROMPT_LEN MAX_NEW
// Loads a checkpoint written by `xgrad import llama2c` as `xgrad generate` does
// (train::load_model), and writes one JSON object: the float32 logits of the token sequence IDS
// (comma-separated) at every position, the logits of the same weights in float64, and the greedy
// continuation of the first PROMPT_LEN ids by MAX_NEW tokens (nn::generate, with and without the KV cache).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tests/support/json_text.hpp"
#include <xgrad/xgrad.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/nn/generate.hpp>

using namespace xg;
using namespace xgt::json_text;

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: dump_llama2c CHECKPOINT OUT.json IDS PROMPT_LEN MAX_NEW\n");
    return 2;
  }
  try {
    std::vector<std::int64_t> ids;
    const std::string text = argv[3];
    for (std::size_t at = 0; at < text.size();) {
      std::size_t comma = text.find(',', at);
      if (comma == std::string::npos) comma = text.size();
      ids.push_back(std::stoll(text.substr(at, comma - at)));
      at = comma + 1;
    }
    const std::size_t prompt_len = std::stoul(argv[4]), max_new = std::stoul(argv[5]);
    if (prompt_len < 1 || prompt_len > ids.size()) throw ValueError("dump_llama2c: PROMPT_LEN out of range");
    const std::vector<std::int64_t> prompt(ids.begin(), ids.begin() + static_cast<long>(prompt_len));
    train::LoadedModel lm = train::load_model(argv[1]);
    if (!lm.gpt) throw ValueError("dump_llama2c: not a GPT checkpoint");
    nn::GPT& m = *lm.gpt;
    const IndexArray tokens({1, ids.size()}, ids);
    NoGradGuard ng;
    const Array logits32 = m.logits(tokens).value();

    nn::TransformerConfig c64 = m.config();
    c64.dtype = DType::float64;
    Generator unused(0);
    nn::GPT m64(c64, unused);
    std::vector<std::pair<std::string, Array>> w64;
    for (const auto& kv : m.named_parameters()) w64.emplace_back(kv.first, kv.second.value().astype(DType::float64));
    m64.set_weights(w64);
    const Array logits64 = m64.logits(tokens).value();

    nn::SampleOptions so;
    const nn::Generation cached = nn::generate(m, {prompt}, max_new, so);
    so.use_kv_cache = false;
    const nn::Generation full = nn::generate(m, {prompt}, max_new, so);

    const std::string out = "{\"dtype\":" + jstr(dtype_name(m.config().dtype)) + ",\"logits_f32\":" + jarray(logits32) +
                            ",\"logits_f64\":" + jarray(logits64) + ",\"greedy\":" + jints64(cached.tokens[0]) +
                            ",\"greedy_no_cache\":" + jints64(full.tokens[0]) + "}\n";
    std::FILE* f = std::fopen(argv[2], "w");
    if (!f) throw FormatError(std::string("dump_llama2c: cannot write ") + argv[2]);
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) throw FormatError(std::string("dump_llama2c: writing ") + argv[2] + " failed");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_llama2c: %s\n", e.what());
    return 1;
  }
  return 0;
}
