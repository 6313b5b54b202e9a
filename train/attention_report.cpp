// The attention maps of `xgrad report --checkpoint --prompt`: a GPT checkpoint run on a prompt,
// its weights per layer and head and what each layer lets a query see (runs/report.hpp draws them).
#include <xgrad/train/attention_report.hpp>

#include <algorithm>
#include <filesystem>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/nn/visibility.hpp>
#include <xgrad/runs/plots.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/train/checkpoint.hpp>

namespace xg::train {

namespace fs = std::filesystem;

namespace {
const char* const kOp = "report";
}  // namespace

runs::AttentionReport attention_report(const std::string& checkpoint, const std::string& prompt) {
  const auto usage = [](const std::string& m) { throw UsageError(op_message(kOp, m)); };
  std::error_code ec;
  std::string file = checkpoint;
  if (fs::is_directory(checkpoint, ec)) file = (fs::path(checkpoint) / runs::kModelFile).string();
  if (!fs::exists(file, ec))
    usage("--checkpoint '" + checkpoint + "' does not exist" +
          (file != checkpoint ? " (a run folder gives its model.safetensors, which is missing: the run has not finished)"
                              : ""));
  LoadedModel m = load_model(file);
  const nn::TransformerConfig& c = m.info.config;
  if (!m.gpt)
    usage("--checkpoint '" + file + "' is an encoder-decoder: attention maps need a GPT (decoder-only) checkpoint");
  const io::safetensors::Metadata meta = io::safetensors::load_header(file).metadata;
  runs::AttentionReport r;
  r.checkpoint = file;
  r.prompt = prompt;
  std::vector<std::int64_t> ids;
  if (meta.count("tokenizer")) {
    const std::unique_ptr<text::Tokenizer> tok = text::tokenizer_of_metadata(meta, file);
    ids = tok->encode(prompt);
    for (std::int64_t id : ids) r.tokens.push_back(runs::tick_label(tok->piece(id)));
  } else if (m.info.task == "llama2c") {
    usage("--prompt: " + file + " carries no tokenizer (a llama2.c model made by xgrad import llama2c)");
  } else {
    const text::Vocabulary& v = m.info.vocab;
    for (std::size_t i = 0; i < prompt.size(); ++i) {
      const std::string ch(1, prompt[i]);
      const auto it = std::find(v.tokens.begin(), v.tokens.end(), ch);
      if (it == v.tokens.end())
        usage("--prompt: '" + runs::tick_label(ch) + "' at position " + std::to_string(i) + " is not a token of " + file +
              " (task " + m.info.task + ", " + std::to_string(v.size()) + " tokens: " + v.to_json() +
              "): the prompt does not match the checkpoint's tokenizer");
      ids.push_back(it - v.tokens.begin());
      r.tokens.push_back(runs::tick_label(ch));
    }
  }
  if (ids.empty()) usage("--prompt must not be empty");
  if (ids.size() > c.context)
    usage("--prompt has " + std::to_string(ids.size()) + " tokens, more than the context length " +
          std::to_string(c.context) + " of " + file);
  r.layers = c.layers;
  r.heads = c.H_q;
  r.kv_heads = c.H_kv;
  const std::size_t T = ids.size();
  NoGradGuard ng;
  std::vector<nn::AttentionOutput> attn;
  m.gpt->logits(IndexArray({1, T}, ids), nullptr, &attn);
  if (attn.size() != c.layers)
    throw InternalError(op_message(kOp, "the model returned " + std::to_string(attn.size()) + " layers' weights, not " +
                                            std::to_string(c.layers)));
  for (std::size_t l = 0; l < c.layers; ++l) {
    const Array& A = attn[l].weights.value();  // [1, H_q, T, T]
    for (std::size_t h = 0; h < c.H_q; ++h) {
      std::vector<double> w(T * T);
      for (std::size_t i = 0; i < T * T; ++i) w[i] = A.flat(h * T * T + i);
      r.weights.push_back(std::move(w));
    }
    // What the layer let each query see: causal, and the layer's sliding window when it has one
    // (as xgrad generate --attention-map draws it).
    const auto P = static_cast<nn::Position>(T);
    nn::Visibility vis = nn::Visibility::causal(P, P);
    const std::size_t W = m.gpt->blocks[l]->attn.config().window;
    if (W > 0) vis = nn::Visibility::sliding_window(P, P, static_cast<nn::Position>(W)) & vis;
    r.allowed.push_back(vis.expand_allowed(kOp, {1, 1, T, T}));
    r.windows.push_back(W);
  }
  return r;
}

}  // namespace xg::train
