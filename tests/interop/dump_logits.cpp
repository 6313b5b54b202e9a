// dump_logits: the xgrad half of the checkpoint interop test (tests/interop/torch_checkpoints.py).
//
// Usage: dump_logits [--float64-copy COPY] CHECKPOINT OUT_JSON
//
// Loads a checkpoint written by `xgrad train` (or by tools/xgrad_torch.py save_checkpoint)
// with train::load_model, runs the model under NoGradGuard (eval mode, no dropout) for a few
// fixed token batches of different lengths, and writes ONE JSON file:
//   {"checkpoint": "...", "model": "gpt"|"encoder_decoder", "dtype": "float32", "V_vocab": V,
//    "context": C, "cases": [CASE, ...]}
// GPT cases are {"tokens": ARRAY [B, T], "logits": ARRAY [B, T, V]} (GPT::logits);
// encoder-decoder cases also hold "src": ARRAY [B, S] and "src_lengths": [...] (real source
// tokens per row; the rest is padding), with "tokens" the target and "logits" from
// EncoderDecoder::decode(tokens, encode(src, src_lengths), src_lengths).
// ARRAY is {"shape": [...], "data": [...]} in row-major order, doubles as %.17g.
// Tokens are drawn from a fixed linear congruential sequence (no dependence on xgrad's
// generator), so the lengths and values are reproducible: T = 1, about half the context,
// and the full context (that last batch holds two sequences, to cover B > 1; for the
// encoder-decoder its second source is padded).
//
// --float64-copy COPY also writes the same model converted to float64 (every parameter cast,
// metadata dtype float64) with nn::safetensors::save_module, so the test can run the model a
// second time with float64 arithmetic on both sides: `xgrad train` only writes float32, and
// float32 rounding (~1e-7 here) would hide differences smaller than the tolerance, such
// as a tanh-approximated GELU. The copy is an ordinary checkpoint: dump_logits reads it back
// with train::load_model like any other.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
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

void write_float64_copy(train::LoadedModel& lm, const std::string& path) {
  train::ModelInfo info = lm.info;
  info.config.dtype = DType::float64;
  Generator gen(0);  // initial values are overwritten below
  std::unique_ptr<nn::Module> m64;
  if (lm.gpt)
    m64 = std::make_unique<nn::GPT>(info.config, gen);
  else
    m64 = std::make_unique<nn::EncoderDecoder>(info.config, gen);
  const auto src = lm.module().named_parameters();
  auto dst = m64->named_parameters();
  if (src.size() != dst.size()) throw std::runtime_error("float64 copy: parameter lists differ in length");
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (src[i].first != dst[i].first || src[i].second.shape() != dst[i].second.shape())
      throw std::runtime_error("float64 copy: parameter " + src[i].first + " does not match " + dst[i].first);
    dst[i].second.set_value(src[i].second.value().astype(DType::float64));
  }
  nn::safetensors::save_module(path, *m64, train::model_metadata(info));
  std::printf("dump_logits: float64 copy -> %s\n", path.c_str());
}

int run(const std::string& ckpt, const std::string& out_path, const std::string& f64_copy) {
  train::LoadedModel lm = train::load_model(ckpt);
  if (!f64_copy.empty()) write_float64_copy(lm, f64_copy);
  const nn::TransformerConfig& c = lm.info.config;
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
    std::string extra;
    Tensor logits;
    if (lm.gpt) {
      logits = lm.gpt->logits(tokens);
    } else {
      // Sources of the full context length; the second row (if any) is padded after C - 2 tokens.
      const IndexArray src = gen.batch(k.B, C, V);
      std::vector<std::size_t> lengths(k.B, C);
      if (k.B > 1) lengths[1] = C > 2 ? C - 2 : 1;
      logits = lm.encdec->decode(tokens, lm.encdec->encode(src, lengths), lengths);
      extra = ",\"src\":" + jints(src) + ",\"src_lengths\":" + jsizes(lengths);
    }
    const Shape expect = {k.B, k.T, V};
    if (logits.shape() != expect)
      throw std::runtime_error("logits have shape " + shape_str(logits.shape()) + ", expected " + shape_str(expect));
    body += std::string(body.empty() ? "" : ",\n") + "{\"tokens\":" + jints(tokens) + extra +
            ",\"logits\":" + jarray(logits.value()) + "}";
  }

  std::FILE* f = std::fopen(out_path.c_str(), "w");
  if (!f) throw std::runtime_error("cannot open " + out_path + " for writing");
  const std::string text = "{\"checkpoint\":" + jstr(ckpt) + ",\"model\":" + jstr(train::model_kind_name(lm.info.kind)) +
                           ",\"dtype\":" + jstr(dtype_name(c.dtype)) + ",\"V_vocab\":" + std::to_string(V) +
                           ",\"context\":" + std::to_string(C) + ",\"cases\":[\n" + body + "]}\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("writing " + out_path + " failed");
  std::printf("dump_logits: %s -> %s (%s, %zu cases, V=%zu, context=%zu)\n", ckpt.c_str(), out_path.c_str(),
              train::model_kind_name(lm.info.kind).c_str(), cases.size(), V, C);
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
