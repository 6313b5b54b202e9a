// dump_logits: the xgrad half of the checkpoint interop test (tests/interop/reader_torch.py).
//
// Usage: dump_logits [--float64-copy COPY] CHECKPOINT OUT_JSON
//
// Loads a decoder-only checkpoint written by `xgrad train` (train::load_model), runs
// GPT::logits under NoGradGuard (eval mode, no dropout) for a few fixed token batches of
// different lengths, and writes ONE JSON file:
//   {"checkpoint": "...", "dtype": "float32", "V_vocab": V, "context": C,
//    "cases": [{"tokens": ARRAY [B, T], "logits": ARRAY [B, T, V]}, ...]}
// where ARRAY is {"shape": [...], "data": [...]} in row-major order, doubles as %.17g.
// Tokens are drawn from a fixed linear congruential sequence (no dependence on xgrad's
// generator), so the lengths and values are reproducible: T = 1, about half the context,
// and the full context (that last batch holds two sequences, to cover B > 1).
//
// --float64-copy COPY also writes the same model converted to float64 (every parameter cast,
// metadata dtype float64) with nn::safetensors::save_module, so the test can run the model a
// second time with float64 arithmetic on both sides: `xgrad train` only writes float32, and
// float32 rounding (~1e-7 here) would hide differences smaller than the 1e-5 tolerance, such
// as a tanh-approximated GELU. The copy is an ordinary checkpoint: dump_logits reads it back
// with train::load_model like any other.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include <xgrad/train/checkpoint.hpp>
#include "tests/support/json_text.hpp"
#include <xgrad/xgrad.hpp>

namespace {

using namespace xgt::json_text;

using namespace xg;

// Reproducible token ids in [0, V): 64-bit LCG (Knuth's MMIX constants), high bits.
class Tokens {
 public:
  explicit Tokens(std::uint64_t seed) : s_(seed) {}
  IndexArray batch(std::size_t B, std::size_t T, std::size_t V) {
    std::vector<std::int64_t> d(B * T);
    for (auto& x : d) {
      s_ = s_ * 6364136223846793005ULL + 1442695040888963407ULL;
      x = static_cast<std::int64_t>((s_ >> 33) % V);
    }
    return IndexArray({B, T}, std::move(d));
  }

 private:
  std::uint64_t s_;
};

void write_float64_copy(const train::LoadedModel& lm, const std::string& path) {
  train::ModelInfo info = lm.info;
  info.config.dtype = DType::float64;
  Generator gen(0);  // initial values are overwritten below
  nn::GPT g64(info.config, gen);
  const auto src = lm.gpt->named_parameters();
  auto dst = g64.named_parameters();
  if (src.size() != dst.size()) throw std::runtime_error("float64 copy: parameter lists differ in length");
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i].first != dst[i].first || src[i].second.shape() != dst[i].second.shape())
      throw std::runtime_error("float64 copy: parameter " + src[i].first + " does not match " + dst[i].first);
    dst[i].second.set_value(src[i].second.value().astype(DType::float64));
  }
  nn::safetensors::save_module(path, g64, train::model_metadata(info));
  std::printf("dump_logits: float64 copy -> %s\n", path.c_str());
}

int run(const std::string& ckpt, const std::string& out_path, const std::string& f64_copy) {
  train::LoadedModel lm = train::load_model(ckpt);
  if (!lm.gpt) throw std::runtime_error("only decoder-only (gpt) checkpoints are supported, this one is '" +
                                        lm.info.kind + "'");
  if (!f64_copy.empty()) write_float64_copy(lm, f64_copy);
  const nn::TransformerConfig& c = lm.gpt->config();
  const std::size_t V = c.V_vocab, C = c.context;

  struct Case {
    std::size_t B, T;
  };
  std::vector<Case> cases = {{1, 1}, {1, C / 2 + 1}, {2, C}};
  if (C / 2 + 1 >= C) cases.erase(cases.begin() + 1);  // context 1 or 2: avoid a duplicate length

  Tokens gen(20240917);
  NoGradGuard no_grad;
  std::string body;
  for (const Case& k : cases) {
    const IndexArray tokens = gen.batch(k.B, k.T, V);
    const Tensor logits = lm.gpt->logits(tokens);
    const Shape expect = {k.B, k.T, V};
    if (logits.shape() != expect)
      throw std::runtime_error("logits have shape " + shape_str(logits.shape()) + ", expected " + shape_str(expect));
    body += std::string(body.empty() ? "" : ",\n") + "{\"tokens\":" + jints(tokens) +
            ",\"logits\":" + jarray(logits.value()) + "}";
  }

  std::FILE* f = std::fopen(out_path.c_str(), "w");
  if (!f) throw std::runtime_error("cannot open " + out_path + " for writing");
  const std::string text = "{\"checkpoint\":" + jstr(ckpt) + ",\"dtype\":" + jstr(dtype_name(c.dtype)) +
                           ",\"V_vocab\":" + std::to_string(V) + ",\"context\":" + std::to_string(C) +
                           ",\"cases\":[\n" + body + "]}\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("writing " + out_path + " failed");
  std::printf("dump_logits: %s -> %s (%zu cases, V=%zu, context=%zu)\n", ckpt.c_str(), out_path.c_str(),
              cases.size(), V, C);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string f64_copy;
  if (args.size() == 4 && args[0] == "--float64-copy") {
    f64_copy = args[1];
    args.erase(args.begin(), args.begin() + 2);
  }
  if (args.size() != 2 || args[0].rfind("--", 0) == 0) {
    std::fprintf(stderr, "usage: %s [--float64-copy COPY] CHECKPOINT OUT_JSON\n", argv[0]);
    return 2;
  }
  try {
    return run(args[0], args[1], f64_copy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_logits: %s\n", e.what());
    return 1;
  }
}
