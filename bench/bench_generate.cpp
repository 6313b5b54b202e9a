// Generation speed of a Llama model (issue 19, "Performance"): prefill and decode tokens per
// second through nn::generate with the KV cache, the path `xgrad generate` takes.
//
// Model: nn::GPT with arch llama (RMSNorm, RoPE, SwiGLU, no biases, tied classifier unless
// --untied) in the shape of llama2.c's stories15M or stories42M, random weights from --seed
// (nn::GPT's own initialisation; speed does not depend on the values).
//
//   prefill: a prompt of --prompt random tokens, one logits_cached call, then one greedy pick
//            (nn::generate with max_new 1): --prompt / time tokens per second.
//   decode:  from the 1-token prompt {1} (llama2.c's BOS), --new greedy tokens one at a time
//            (nn::generate with max_new --new: --new forward passes at positions
//            0 .. --new - 1): --new / time tokens per second, the figure llama2.c's run.c prints
//            as "achieved tok/s" (its forward passes at positions 1 .. n-1, one token each).
//
// The parameters are packed into one block per dtype first (Module::pack_parameters, as
// `xgrad generate` does: large blocks lie on 2 MiB pages); --no-pack leaves them apart.
//
// Decoding reads every weight once a token: the program counts the bytes a decoded token reads
// (the parameters, less the token embedding table when the classifier is untied, plus the KV
// cache's keys and values at the average position) and prints that traffic as a share of the
// read bandwidth it measures afterwards (bench::measure_read_bandwidth, a buffer of the same size
// on the same threads), the speed no decoder of this model on this machine can beat.
//
// bench/generate_vs_runc.py runs this beside run.c (docs/performance.md).
#include <cstdio>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bench/common.hpp"
#include "bench/peak.hpp"
#include "bench/xgrad_pool.hpp"
#include <xgrad/core/runtime.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/nn/generate.hpp>

using namespace xg;

namespace {

std::string ids_text(const std::vector<std::int64_t>& ids, std::size_t n) {
  std::string s;
  for (std::size_t i = 0; i < ids.size() && i < n; ++i) s += (i ? " " : "") + std::to_string(ids[i]);
  return ids.size() > n ? s + " ..." : s;
}

// Equal decodes give equal hashes (bench::fnv).
std::uint64_t ids_hash(const std::vector<std::int64_t>& ids) {
  std::uint64_t h = bench::kFnvStart;
  bench::fnv(h, ids.data(), ids.size() * sizeof(std::int64_t));
  return h;
}
// Of every step's logits, bit for bit.
std::uint64_t logits_hash(const std::vector<Array>& logits) {
  std::uint64_t h = bench::kFnvStart;
  for (const Array& a : logits) bench::fnv(h, a.data<float>(), a.size() * sizeof(float));
  return h;
}

std::vector<double> tokens_per_second(const std::vector<double>& ms, std::size_t tokens) {
  std::vector<double> out;
  for (double v : ms) out.push_back(static_cast<double>(tokens) / (v * 1e-3));
  return out;
}

void run(const bench::GenerateFlags& f) {
  const bench::GenerateFlags::Sizes s = f.resolve();
  set_num_threads(f.threads);
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = s.vocab;
  c.context = s.seq;
  c.d_model = s.d;
  c.H_q = s.heads;
  c.H_kv = s.kv_heads;
  c.layers = s.layers;
  c.d_ff = s.hidden;
  c.tie_embeddings = !f.untied;
  c.dtype = DType::float32;
  c = c.resolved();
  Generator gen(f.seed);
  nn::GPT model(c, gen);
  model.eval();

  std::vector<std::int64_t> prompt(f.prompt);
  for (auto& t : prompt) t = static_cast<std::int64_t>(gen.below(s.vocab));

  bench::print_header("bench_generate", "xgrad", f);
  bench::print_line("parameters: " + std::to_string(model.parameter_count()));
  if (f.no_pack) {
    bench::print_line("parameters: each in its own block (--no-pack)");
  } else {
    const std::size_t bytes = model.pack_parameters();
    char mib[32];
    std::snprintf(mib, sizeof mib, "%.2f", static_cast<double>(bytes) / (1 << 20));
    bench::print_line(std::string("parameters: packed into one block of ") + mib + " MiB (Module::pack_parameters)");
  }

  nn::SampleOptions greedy;  // temperature 0, KV cache on, no stop token
  nn::Generation last;
  const std::vector<double> prefill_ms = bench::time_reps(f.warmup, f.reps, [&] {
    last = nn::generate(model, {prompt}, 1, greedy);
  });
  const std::vector<double> decode_ms = bench::time_reps(f.warmup, f.reps, [&] {
    last = nn::generate(model, {{1}}, f.new_tokens, greedy);
  });
  const std::vector<std::int64_t>& ids = last.tokens.at(0);
  if (ids.size() != f.new_tokens)
    throw std::runtime_error("decode produced " + std::to_string(ids.size()) + " tokens, expected " +
                             std::to_string(f.new_tokens));

  const std::vector<double> prefill_tps = tokens_per_second(prefill_ms, f.prompt);
  const std::vector<double> decode_tps = tokens_per_second(decode_ms, f.new_tokens);
  bench::print_summary("prefill (" + std::to_string(f.prompt) + " tokens in one call)", prefill_ms, "ms");
  bench::print_summary("prefill", prefill_tps, "tokens/s");
  bench::print_summary("decode (" + std::to_string(f.new_tokens) + " tokens one at a time)", decode_ms, "ms");
  bench::print_summary("decode", decode_tps, "tokens/s");
  bench::print_line("greedy ids: " + ids_text(ids, 8) + " (hash " + std::to_string(ids_hash(ids)) +
                    "); logits of every step: hash " + std::to_string(logits_hash(last.logits)));
  bench::print_peak_rss();

  // After the peak RSS: the measurement's buffer is not the model's memory.
  // Untied: of the token embedding table only the token's row is read.
  const double unread = f.untied ? static_cast<double>(s.vocab - 1) * static_cast<double>(s.d) : 0.0;
  const double weight_bytes = 4.0 * (static_cast<double>(model.parameter_count()) - unread);
  const double kv_bytes = 4.0 * 2.0 * static_cast<double>(s.layers) * static_cast<double>(s.kv_heads) *
                          static_cast<double>(s.d / s.heads) * (static_cast<double>(f.new_tokens) + 1.0) / 2.0;
  const double token_bytes = weight_bytes + kv_bytes;
  const double read_gbs =
      bench::measure_read_bandwidth(f.threads, static_cast<std::size_t>(token_bytes), 0.05, bench::xgrad_pool());
  const double decode_gbs = bench::summarize(decode_tps).median * token_bytes * 1e-9;
  bench::print_line("decode reads " + bench::fmt(token_bytes * 1e-6, 2) + " MB a token (" +
                    std::to_string(static_cast<std::uint64_t>(token_bytes)) + " bytes): the weights " +
                    bench::fmt(weight_bytes * 1e-6, 2) + " MB" + (f.untied ? " (not the token embedding table)" : "") +
                    ", the KV cache " + bench::fmt(kv_bytes * 1e-6, 2) + " MB at the average position");
  if (read_gbs > 0) {
    bench::print_line("read bandwidth (" + std::to_string(f.threads) + (f.threads == 1 ? " thread" : " threads") +
                      ", a buffer of that size, measured in this run): " + bench::fmt(read_gbs, 1) + " GB/s");
    bench::print_line("decode (median): " + bench::fmt(decode_gbs, 1) + " GB/s = " +
                      bench::fmt(100.0 * decode_gbs / read_gbs, 1) + "% of the read bandwidth");
  } else {
    bench::print_line("read bandwidth: not measured (no buffer of that size; decode (median): " + bench::fmt(decode_gbs, 1) +
                      " GB/s)");
  }
  bench::print_line("prefill tokens/s (median): " + bench::fmt(bench::summarize(prefill_tps).median, 1));
  bench::print_line("decode tokens/s (median): " + bench::fmt(bench::summarize(decode_tps).median, 1));
  bench::print_result("decode_tok_s", bench::summarize(decode_tps).median, "tok/s");
}

}  // namespace

int main(int argc, char** argv) {
  bench::GenerateFlags f;
  return bench::run_program("bench_generate",
                            "Prefill and decode tokens/s of a Llama model through nn::generate (KV cache), xgrad",
                            argc, argv, f, run);
}
