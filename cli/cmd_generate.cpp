// `xgrad generate`: continue a prompt with a trained checkpoint, greedy by default or with
// temperature / top-k sampling, using the KV cache unless --no-kv-cache; optionally draws the
// attention map of one layer and head (GPT checkpoints).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/ops/join.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/generate.hpp>
#include <xgrad/train/plots.hpp>

namespace xg::cli {

namespace {

struct GenerateArgs {
  std::string checkpoint, prompt, attention_map;
  std::size_t max_new = 16, top_k = 0, layer = 0, head = 0;
  double temperature = 0.0;
  std::uint64_t seed = 0;
  bool no_kv_cache = false;
};

std::vector<std::int64_t> tokenize(const train::Vocabulary& v, const std::string& text) {
  std::vector<std::int64_t> ids;
  for (char c : text) ids.push_back(v.id(std::string(1, c)));
  return ids;
}

void run_generate(const GenerateArgs& a) {
  if (!(a.temperature == 0.0 || (a.temperature >= 1e-3 && a.temperature <= 1e3)))
    throw UsageError(op_message("generate", "--temperature " + std::to_string(a.temperature) +
                                                ": must be 0 (greedy) or in [0.001, 1000]"));
  if (a.max_new > 1000000)
    throw UsageError(op_message("generate", "--max-new " + std::to_string(a.max_new) + ": must be at most 1000000"));
  train::LoadedModel m = train::load_model(a.checkpoint);
  const train::Vocabulary& vocab = m.info.vocab;
  Generator gen(a.seed);
  train::SampleOptions so;
  so.temperature = a.temperature;
  so.top_k = a.top_k;
  so.generator = &gen;
  so.use_kv_cache = !a.no_kv_cache;
  const std::vector<std::int64_t> prompt = tokenize(vocab, a.prompt);
  if (prompt.empty()) throw ValueError(op_message("generate", "--prompt must not be empty"));
  std::vector<std::int64_t> out;
  if (m.gpt) {
    const std::size_t room = m.info.config.context - std::min(m.info.config.context, prompt.size());
    out = train::generate(*m.gpt, {prompt}, std::min(a.max_new, room), so).tokens[0];
  } else {  // encoder-decoder: the prompt is the source
    const std::int64_t bos = vocab.id("<"), eos = vocab.id(">");
    so.stop_token = eos;
    std::vector<std::size_t> len{prompt.size()};
    out = train::generate(*m.encdec, IndexArray({1, prompt.size()}, prompt), len, bos,
                          std::min(a.max_new, m.info.config.context), so)
              .tokens[0];
  }
  if (m.gpt)
    std::cout << a.prompt << vocab.decode(out) << "\n";
  else
    std::cout << a.prompt << " -> " << vocab.decode(out) << "\n";

  if (!a.attention_map.empty()) {
    if (!m.gpt) throw ValueError(op_message("generate", "--attention-map needs a GPT (decoder-only) checkpoint"));
    if (a.layer >= m.info.config.layers || a.head >= m.info.config.H_q)
      throw ValueError(op_message("generate", "--layer " + std::to_string(a.layer) + " / --head " +
                                                  std::to_string(a.head) + " out of range: the model has " +
                                                  std::to_string(m.info.config.layers) + " layers and " +
                                                  std::to_string(m.info.config.H_q) + " query heads"));
    std::vector<std::int64_t> seq = prompt;
    seq.insert(seq.end(), out.begin(), out.end());
    NoGradGuard ng;
    std::vector<nn::AttentionOutput> attn;
    m.gpt->logits(IndexArray({1, seq.size()}, seq), nullptr, &attn);
    const Tensor& A = attn[a.layer].weights;  // [1, H_q, T, T]
    const long T = static_cast<long>(seq.size());
    const Array map = ops::slice(A, 1, static_cast<long>(a.head), static_cast<long>(a.head) + 1).value().reshaped(
        {seq.size(), seq.size()});
    const auto size = train::heatmap_png(map, a.attention_map);
    std::cout << "attention map of layer " << a.layer << ", head " << a.head << " (" << T << " x " << T
              << " queries x keys, " << size.width << "x" << size.height << " px): " << a.attention_map << "\n";
  }
}

}  // namespace

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Continue a prompt with a trained checkpoint");
  cmd->add_option("--checkpoint", a->checkpoint, "model.safetensors written by xgrad train")->required();
  cmd->add_option("--prompt", a->prompt, "prompt text (for the reverse task: the source digits)")->required();
  cmd->add_option("--max-new", a->max_new, "tokens to generate")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--temperature", a->temperature, "0: greedy; > 0: sample")->capture_default_str()
      ->check(number());
  cmd->add_option("--top-k", a->top_k, "sample among the k most likely tokens (0: all)")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--seed", a->seed, "sampling seed")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_flag("--no-kv-cache", a->no_kv_cache, "recompute the whole prefix at every step");
  cmd->add_option("--attention-map", a->attention_map, "write this PNG: attention weights of --layer/--head");
  cmd->add_option("--layer", a->layer, "layer for --attention-map")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--head", a->head, "query head for --attention-map")->capture_default_str()
      ->check(non_negative_integer());
  cmd->callback([a] { run_generate(*a); });
}

}  // namespace xg::cli
