// `xgrad generate`: continue a prompt with a trained checkpoint, greedy by default or with
// temperature / top-k sampling, using the KV cache unless --no-kv-cache. Optionally draws the
// attention map of one layer and head (GPT checkpoints) and writes the whole generation as
// JSON (--json FILE, '-' for stdout): prompt, tokens, per-step top-k logits, sampling settings
// and, on request, the attention weights (docs/cli.md has the schema). --tokenizer encodes and
// decodes with a tokenizer file (a llama2.c tokenizer.bin: BOS first, stop at BOS or EOS).
// A GPT generates past its context by cropping (nn/generate.hpp); --num-samples N draws N
// samples one after the other, --prompt-ids gives the prompt as token ids, and --stop TEXT
// ends a sample when its text contains TEXT (cut there).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/nn/visibility.hpp>
#include <xgrad/ops/join.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/runs/plots.hpp>

namespace xg::cli {

namespace {

using json = nlohmann::ordered_json;
struct GenerateArgs {
  std::string checkpoint, prompt, attention_map, json_path, tokenizer, prompt_ids;
  std::vector<std::string> stops;  // --stop, repeatable
  std::size_t max_new = 16, top_k = 0, layer = 0, head = 0, json_top_k = 5, num_samples = 1;
  bool prompt_given = false, prompt_ids_given = false;
  double temperature = 0.0, top_p = 1.0;
  std::uint64_t seed = 0;
  bool no_kv_cache = false, json_attention = false, overwrite = false;
  std::size_t threads = 0;  // xgrad worker threads, as train's --threads (0: the cores)
};

[[noreturn]] void usage(const std::string& message) { throw UsageError(op_message("generate", message)); }

// A token in JSON: a string when it is valid UTF-8, otherwise the array of its byte values
// (a byte of a multi-byte character, for charlm): the vocabulary's own convention.
json token_text(const std::string& t) {
  try {
    (void)json(t).dump();
    return t;
  } catch (const json::exception&) {
    json bytes = json::array();
    for (unsigned char c : t) bytes.push_back(static_cast<int>(c));
    return bytes;
  }
}

json token_json(const text::Vocabulary& v, std::int64_t id) {
  return {{"id", id}, {"text", token_text(v.tokens.at(static_cast<std::size_t>(id)))}};
}

json tokens_json(const text::Vocabulary& v, const std::vector<std::int64_t>& ids) {
  json a = json::array();
  for (std::int64_t id : ids) a.push_back(token_json(v, id));
  return a;
}

// The prompt as token ids, one character each; a character outside the vocabulary is a bad flag.
std::vector<std::int64_t> tokenize(const text::Vocabulary& v, const std::string& text) {
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const std::string c(1, text[i]);
    const auto it = std::find(v.tokens.begin(), v.tokens.end(), c);
    if (it == v.tokens.end())
      usage("--prompt: unknown token '" + runs::tick_label(c) + "' at position " + std::to_string(i) +
            " (the checkpoint's vocabulary has " + std::to_string(v.size()) + " tokens: " + v.to_json() + ")");
    ids.push_back(it - v.tokens.begin());
  }
  return ids;
}

// Softmax of one row of logits (temperature 1) and the indices ordered by logit, highest first.
struct Ranked {
  std::vector<double> logits, probs;
  std::vector<std::size_t> order;
};

Ranked rank(const Array& step_logits) {
  Ranked r;
  const std::size_t V = step_logits.shape()[1];
  for (std::size_t i = 0; i < V; ++i) r.logits.push_back(step_logits.flat(i));  // sample 0 of [1, V]
  const double hi = *std::max_element(r.logits.begin(), r.logits.end());
  double z = 0;
  for (double l : r.logits) z += std::exp(l - hi);
  for (double l : r.logits) r.probs.push_back(std::exp(l - hi) / z);
  r.order.resize(V);
  std::iota(r.order.begin(), r.order.end(), 0);
  std::stable_sort(r.order.begin(), r.order.end(), [&](std::size_t a, std::size_t b) { return r.logits[a] > r.logits[b]; });
  return r;
}

// A prompt for a title: visible escapes, at most 40 characters.
std::string short_text(const text::Vocabulary& v, const std::vector<std::int64_t>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size() && i < 40; ++i) s += runs::tick_label(v.tokens[static_cast<std::size_t>(ids[i])]);
  return ids.size() > 40 ? s + "..." : s;
}

// --prompt-ids "1,2,3": decimal ids separated by commas, each below `vocab` (0: the format
// alone, before the model is known).
std::vector<std::int64_t> ids_of(const std::string& text, std::size_t vocab) {
  const std::string shown = "--prompt-ids '" + runs::tick_label(text) + "'";
  if (text.empty()) usage(shown + ": must list at least one token id");
  std::vector<std::int64_t> ids;
  std::size_t from = 0;
  for (std::size_t item = 1;; ++item) {
    const std::size_t comma = std::min(text.find(',', from), text.size());
    const std::string w = text.substr(from, comma - from);
    if (w.empty() || w.size() > 18 || w.find_first_not_of("0123456789") != std::string::npos)
      usage(shown + ": item " + std::to_string(item) + " '" + runs::tick_label(w) +
            "' is not a token id (give decimal ids separated by commas, e.g. 1,2,3)");
    const auto id = static_cast<std::int64_t>(std::stoll(w));
    if (vocab > 0 && static_cast<std::size_t>(id) >= vocab)
      usage(shown + ": id " + w + " (item " + std::to_string(item) + ") is outside the model's vocabulary of " +
            std::to_string(vocab) + " (ids 0.." + std::to_string(vocab - 1) + ")");
    ids.push_back(id);
    if (comma == text.size()) return ids;
    from = comma + 1;
  }
}

// Where the first stop string begins in `text` (npos: none).
std::size_t stop_position(const std::string& text, const std::vector<std::string>& stops) {
  std::size_t at = std::string::npos;
  for (const std::string& s : stops) at = std::min(at, text.find(s));
  return at;
}

// The gnuplot script of --attention-map, beside it ("" : none).
std::string map_script(const GenerateArgs& a) {
  return a.attention_map.empty() ? std::string()
                                 : std::filesystem::path(a.attention_map).replace_extension(".gp").string();
}

// The flags alone, before anything is read.
void check_flags(const GenerateArgs& a, const CLI::App& cmd) {
  if (!a.prompt_given && !a.prompt_ids_given) usage("needs --prompt TEXT or --prompt-ids IDS");
  if (a.prompt_given && a.prompt_ids_given) usage("--prompt and --prompt-ids both given: give the prompt once");
  if (a.prompt_ids_given) (void)ids_of(a.prompt_ids, 0);
  for (const std::string& stop : a.stops)
    if (stop.empty()) usage("--stop '': a stop string must not be empty (it would end every sample at once)");
  if (!(a.temperature == 0.0 || (a.temperature >= 1e-3 && a.temperature <= 1e3)))
    usage("--temperature " + number_text(a.temperature) + ": must be 0 (greedy) or in [0.001, 1000]");
  if (a.top_k > 0 && a.temperature == 0.0)
    usage("--top-k " + std::to_string(a.top_k) + " needs --temperature > 0 (greedy decoding always takes the most "
                                                  "likely token)");
  if (!(a.top_p > 0.0 && a.top_p <= 1.0)) usage("--top-p " + number_text(a.top_p) + ": must be in (0, 1]");
  if (cmd.count("--top-p") > 0 && a.temperature == 0.0)
    usage("--top-p " + number_text(a.top_p) + " needs --temperature > 0 (greedy decoding always takes the most "
                                              "likely token)");
  const bool want_attention = !a.attention_map.empty() || a.json_attention;
  for (const char* flag : {"--layer", "--head"})
    if (cmd.count(flag) > 0 && !want_attention) usage(std::string(flag) + " needs --attention-map or --json-attention");
  if (a.json_path.empty())
    for (const char* flag : {"--json-top-k", "--json-attention"})
      if (cmd.count(flag) > 0) usage(std::string(flag) + " needs --json FILE");
  if (a.json_path != "-" && !a.json_path.empty() && same_file(a.json_path, a.checkpoint))
    usage("--json '" + a.json_path + "' is the checkpoint itself");
  if (!a.attention_map.empty() && std::filesystem::path(a.attention_map).extension() != ".png")
    usage("--attention-map '" + a.attention_map + "': must name a .png file (its gnuplot script goes beside it, as .gp)");
  // No output may replace another, or the checkpoint (./g.json and g.json, links, ...).
  const std::string script = map_script(a);
  check_distinct_files("generate", {{"--checkpoint", a.checkpoint, false},
                                    {"--json", a.json_path, true},
                                    {"--attention-map", a.attention_map, true},
                                    {"--attention-map's gnuplot script", script, true},
                                    {"--tokenizer", a.tokenizer == "bytes" ? std::string() : a.tokenizer, false}});
  check_new_output("generate", "--json", a.json_path, a.overwrite);
  check_new_output("generate", "--attention-map", a.attention_map, a.overwrite);
  check_new_output("generate", "--attention-map's gnuplot script", script, a.overwrite);
}

// How the prompt becomes tokens and the tokens text.
struct Text {
  std::unique_ptr<text::Tokenizer> tok;  // --tokenizer, or the one a text-task model carries
  text::Vocabulary tok_vocab;  // with --tokenizer: each id's text, in place of the checkpoint's
  bool llama2c = false;  // a llama2.c tokenizer: BOS first, stop at BOS or EOS
  std::vector<std::int64_t> prompt;
};

// --tokenizer against the model: a GPT with a vocabulary of the tokenizer's size.
std::unique_ptr<text::Tokenizer> given_tokenizer(const GenerateArgs& a, const train::LoadedModel& m,
                                                  const io::safetensors::Metadata& meta, text::Vocabulary& vocab) {
  const nn::TransformerConfig& c = m.info.config;
  if (!m.gpt) usage("--tokenizer needs a GPT (decoder-only) checkpoint; " + a.checkpoint + " is an encoder-decoder");
  std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(a.tokenizer);
  // The same size, or the tokenizer the model was fine-tuned with when it has fewer ids than the
  // model's vocabulary (the ids past it are placeholders, never sampled).
  const bool own = meta.count("tokenizer_sha256") && meta.at("tokenizer_sha256") == tok->digest();
  if (tok->vocab_size() != c.V_vocab && !(own && tok->vocab_size() < c.V_vocab))
    usage("--tokenizer '" + a.tokenizer + "' (" + tok->description() + ") has " + std::to_string(tok->vocab_size()) +
          " ids, but the model of " + a.checkpoint + " has a vocabulary of " + std::to_string(c.V_vocab) +
          ": they must be the same size");
  if (meta.count("tokenizer_sha256") && meta.at("tokenizer_sha256") != tok->digest())
    warn("--tokenizer '" + a.tokenizer + "' is not the tokenizer " + a.checkpoint + " was trained with (sha256 " +
         meta.at("tokenizer_sha256").substr(0, 16) + "); decoding with it anyway");
  const bool l2c = tok->kind() == "llama2c";
  for (std::size_t id = 0; id < tok->vocab_size(); ++id) {
    const auto i = static_cast<std::int64_t>(id);
    // BOS and EOS decode to nothing: show their pieces.
    vocab.tokens.push_back(l2c && (i == text::kLlama2cBos || i == text::kLlama2cEos) ? tok->piece(i)
                                                                                        : tok->decode({i}));
  }
  for (std::size_t id = tok->vocab_size(); id < c.V_vocab; ++id) vocab.tokens.push_back(text::placeholder_token(id));
  return tok;
}

// The tokenizer: --tokenizer, or the one a text-task model carries; without one, prompts are
// one token a character of the checkpoint's vocabulary. The prompt as tokens, checked against
// the model's context.
Text prompt_text(const GenerateArgs& a, const train::LoadedModel& m) {
  const nn::TransformerConfig& c = m.info.config;
  const io::safetensors::Metadata meta = io::safetensors::load_header(a.checkpoint).metadata;
  Text t;
  if (!a.tokenizer.empty())
    t.tok = given_tokenizer(a, m, meta, t.tok_vocab);
  else if (meta.count("tokenizer"))
    t.tok = text::tokenizer_of_metadata(meta, a.checkpoint);
  // A llama2.c tokenizer starts the prompt with BOS (an empty prompt is BOS alone), and
  // generation stops when the model emits BOS or EOS.
  t.llama2c = t.tok && t.tok->kind() == "llama2c";
  if (a.prompt_ids_given)  // the ids as given (no BOS added), within the vocabulary the model is run with
    t.prompt = ids_of(a.prompt_ids, t.tok ? t.tok->vocab_size() : c.V_vocab);
  else if (t.tok)
    t.prompt = t.tok->encode(a.prompt);
  else if (m.info.task == "llama2c")  // `xgrad import llama2c`: placeholder tokens, no tokenizer
    usage("--prompt: " + a.checkpoint + " carries no tokenizer (a llama2.c model made by xgrad import llama2c); "
          "give its tokenizer.bin with --tokenizer");
  else
    t.prompt = tokenize(m.info.vocab, a.prompt);
  if (t.prompt.empty()) usage("--prompt must not be empty");
  if (t.prompt.size() > c.context)
    usage("--prompt has " + std::to_string(t.prompt.size()) + " tokens, more than the model's context length " +
          std::to_string(c.context));
  return t;
}

// --layer and --head against the model, when attention is asked for.
void check_attention_flags(const GenerateArgs& a, const train::LoadedModel& m) {
  const nn::TransformerConfig& c = m.info.config;
  const std::string flag = a.attention_map.empty() ? "--json-attention" : "--attention-map";
  if (!m.gpt) usage(flag + " needs a GPT (decoder-only) checkpoint; " + a.checkpoint + " is an encoder-decoder");
  if (a.layer >= c.layers)
    usage("--layer " + std::to_string(a.layer) + " out of range: the model has " + std::to_string(c.layers) +
          " layers (0.." + std::to_string(c.layers - 1) + ")");
  if (a.head >= c.H_q)
    usage("--head " + std::to_string(a.head) + " out of range: the model has " + std::to_string(c.H_q) +
          " query heads (0.." + std::to_string(c.H_q - 1) + ")");
}

// The attention weights of the whole sequence (prompt and generated tokens) at --layer and
// --head, and what the layer let each query see: GPT::logits' causal visibility, intersected
// with the layer's sliding window when it has one (as MultiHeadAttention::forward does). Cells
// outside it hold weight 0 and are masked, not "allowed with weight 0".
struct Attention {
  Array weights;
  std::vector<unsigned char> allowed;
};

Attention attention_of(const GenerateArgs& a, const train::LoadedModel& m, const std::vector<std::int64_t>& seq) {
  NoGradGuard ng;
  std::vector<nn::AttentionOutput> attn;
  m.gpt->logits(IndexArray({1, seq.size()}, seq), nullptr, &attn);
  const Tensor& A = attn[a.layer].weights;  // [1, H_q, T, T]
  Attention r;
  r.weights = ops::slice(A, 1, static_cast<long>(a.head), static_cast<long>(a.head) + 1).value().reshaped(
      {seq.size(), seq.size()});
  const auto T = static_cast<nn::Position>(seq.size());
  nn::Visibility vis = nn::Visibility::causal(T, T);
  const std::size_t W = m.gpt->blocks[a.layer]->attn.config().window;
  if (W > 0) vis = nn::Visibility::sliding_window(T, T, static_cast<nn::Position>(W)) & vis;
  r.allowed = vis.expand_allowed("generate", {1, 1, seq.size(), seq.size()});
  return r;
}

// --attention-map: the picture, its line on stdout (unless --json -) and its JSON.
json draw_map(const GenerateArgs& a, const Attention& at, const text::Vocabulary& vocab,
              const std::vector<std::int64_t>& prompt, const std::vector<std::int64_t>& seq, std::size_t generated) {
  runs::HeatmapLabels labels;
  labels.title = "attention weights: layer " + std::to_string(a.layer) + ", query head " + std::to_string(a.head) +
                 " (" + std::to_string(seq.size()) + " x " + std::to_string(seq.size()) + ")\nprompt \"" +
                 short_text(vocab, prompt) + "\" + " + std::to_string(generated) + " generated tokens";
  for (std::int64_t id : seq) labels.x_ticks.push_back(vocab.tokens[static_cast<std::size_t>(id)]);
  labels.y_ticks = labels.x_ticks;
  const runs::Picture pic = runs::attention_map_png(at.weights, at.allowed, labels, a.attention_map);
  json picture = {{"png", pic.png}, {"script", pic.script}, {"drawn", pic.drawn}};
  if (!pic.drawn) {
    warn(pic.note);
    return picture;
  }
  picture["width"] = pic.size.width;
  picture["height"] = pic.size.height;
  if (a.json_path != "-")
    std::cout << "attention map of layer " << a.layer << ", head " << a.head << " (" << seq.size() << " x "
              << seq.size() << " queries x keys, " << pic.size.width << "x" << pic.size.height
              << " px): " << a.attention_map << "\n";
  return picture;
}

// One sample: its tokens and logits, its text (cut before a stop string), its line and why it ended.
struct Sample {
  nn::Generation g;
  std::string text, line, stopped_by;
};

// What one generation was: everything the JSON document says (steps and attention: sample 0).
struct Outcome {
  const train::LoadedModel& m;
  const Text& text;
  const text::Vocabulary& vocab;
  const nn::SampleOptions& so;
  const std::vector<Sample>& samples;
  const nn::Generation& g;  // samples[0].g
  std::size_t max_new;  // after the context window (the encoder-decoder's)
  const std::vector<std::int64_t>& seq;
  const Attention& attention;
  json picture;
};

json steps_json(const GenerateArgs& a, const Outcome& r) {
  const std::vector<std::int64_t>& out = r.g.tokens[0];
  json steps = json::array();
  for (std::size_t s = 0; s < out.size(); ++s) {
    const Ranked rk = rank(r.g.logits[s]);
    const std::size_t chosen = static_cast<std::size_t>(out[s]);
    json step = {{"step", s},
                 {"token", token_json(r.vocab, out[s])},
                 {"logit", rk.logits[chosen]},
                 {"prob", rk.probs[chosen]},
                 {"rank", std::find(rk.order.begin(), rk.order.end(), chosen) - rk.order.begin()}};
    json top = json::array();
    for (std::size_t k = 0; k < std::min(a.json_top_k, rk.order.size()); ++k) {
      json t = token_json(r.vocab, static_cast<std::int64_t>(rk.order[k]));
      t["logit"] = rk.logits[rk.order[k]];
      t["prob"] = rk.probs[rk.order[k]];
      top.push_back(t);
    }
    if (a.json_top_k > 0) step["top"] = top;
    steps.push_back(step);
  }
  return steps;
}

json attention_json(const GenerateArgs& a, const Outcome& r) {
  const nn::TransformerConfig& c = r.m.info.config;
  json w = json::array(), vis = json::array();
  const std::size_t T = r.seq.size();
  for (std::size_t q = 0; q < T; ++q) {
    json row = json::array(), vrow = json::array();
    for (std::size_t k = 0; k < T; ++k) {
      row.push_back(r.attention.weights.flat(q * T + k));
      vrow.push_back(r.attention.allowed[q * T + k] != 0);
    }
    w.push_back(row);
    vis.push_back(vrow);
  }
  return {{"layer", a.layer},
          {"head", a.head},
          {"kv_head", a.head / (c.H_q / c.H_kv)},
          {"queries", T},
          {"keys", T},
          {"tokens", tokens_json(r.vocab, r.seq)},
          {"weights", w},
          {"allowed", vis}};
}

// The generation as JSON (docs/cli.md has the schema).
json generated_json(const Outcome& r, const Sample& s) {
  const std::vector<std::int64_t>& out = s.g.tokens[0];
  return {{"text", s.text}, {"tokens", tokens_json(r.vocab, out)}, {"count", out.size()}, {"stopped_by", s.stopped_by}};
}

json generation_json(const GenerateArgs& a, const Outcome& r) {
  const nn::TransformerConfig& c = r.m.info.config;
  const nn::SampleOptions& so = r.so;
  json j = command_json("generate");
  j["checkpoint"] = a.checkpoint;
  j["model"] = {{"kind", train::model_kind_name(r.m.info.kind)},     {"task", r.m.info.task},     {"context", c.context},
                {"vocab_size", r.vocab.size()}, {"layers", c.layers}, {"heads", c.H_q},
                {"kv_heads", c.H_kv}};
  j["sampling"] = {{"mode", a.temperature == 0.0 ? "greedy" : "sample"},
                   {"temperature", a.temperature},
                   {"top_k", a.top_k},
                   {"top_p", a.top_p},
                   {"seed", a.seed},
                   {"kv_cache", !a.no_kv_cache},
                   {"max_new", a.max_new},
                   {"max_new_effective", r.max_new},
                   {"stop_token", so.stop_token >= 0 ? token_json(r.vocab, so.stop_token) : json(nullptr)},
                   {"stop", a.stops},
                   {"num_samples", a.num_samples}};
  if (r.text.llama2c) j["sampling"]["stop_tokens"] = tokens_json(r.vocab, so.stop_tokens);
  if (r.text.tok)
    j["tokenizer"] = {{"kind", r.text.tok->kind()},
                      {"source", a.tokenizer.empty() ? "checkpoint" : a.tokenizer},
                      {"vocab_size", r.text.tok->vocab_size()},
                      {"sha256", r.text.tok->digest()}};
  j["prompt"] = {{"text", a.prompt}, {"tokens", tokens_json(r.vocab, r.text.prompt)}};
  j["generated"] = generated_json(r, r.samples[0]);
  j["line"] = r.samples[0].line;
  json samples = json::array();
  for (const Sample& s : r.samples) samples.push_back({{"generated", generated_json(r, s)}, {"line", s.line}});
  j["samples"] = samples;
  j["steps"] = steps_json(a, r);
  j["top_k_per_step"] = std::min<std::size_t>(a.json_top_k, r.vocab.size());
  if (a.json_attention) j["attention"] = attention_json(a, r);
  if (!r.picture.is_null()) j["attention_map"] = r.picture;
  return j;
}

// The text of the new tokens. With a tokenizer it is its decoding of the prompt and the new
// tokens together (a llama2.c or SentencePiece tokenizer drops the space its encoding added at
// the start; BOS and EOS decode to nothing).
std::string generated_text(const Text& t, const text::Vocabulary& vocab, const std::vector<std::int64_t>& out) {
  if (!t.tok) return vocab.decode(out);
  std::vector<std::int64_t> all = t.prompt;
  all.insert(all.end(), out.begin(), out.end());
  const std::string whole = t.tok->decode(all), before = t.tok->decode(t.prompt);
  return whole.compare(0, before.size(), before) == 0 ? whole.substr(before.size()) : t.tok->decode(out);
}

void run_generate(GenerateArgs a, const CLI::App& cmd) {
  a.prompt_given = cmd.count("--prompt") > 0;
  a.prompt_ids_given = cmd.count("--prompt-ids") > 0;
  a.checkpoint = model_file("generate", "--checkpoint", a.checkpoint);
  check_flags(a, cmd);
  // Flags against the checkpoint, before generating.
  train::LoadedModel m = train::load_model(a.checkpoint);
  // Every weight in one block: a decoding step streams them all, and one large block lies on
  // huge pages (docs/performance.md, "Huge pages").
  m.module().pack_parameters();
  const nn::TransformerConfig& c = m.info.config;
  const Text text = prompt_text(a, m);
  const text::Vocabulary& vocab = a.tokenizer.empty() ? m.info.vocab : text.tok_vocab;
  const std::vector<std::int64_t>& prompt = text.prompt;
  if (a.prompt_ids_given) a.prompt = text.tok ? text.tok->decode(prompt) : vocab.decode(prompt);
  const bool want_attention = !a.attention_map.empty() || a.json_attention;
  if (want_attention) check_attention_flags(a, m);
  // A GPT goes past its context by cropping (nn/generate.hpp). The encoder-decoder's decoder
  // stops at its context (a note says so when --max-new asks for more).
  const std::size_t max_new = m.gpt ? a.max_new : std::min(a.max_new, c.context);
  if (max_new < a.max_new && cmd.count("--max-new") > 0)
    warn("--max-new " + std::to_string(a.max_new) + " goes past the context window: the decoder sees " +
         std::to_string(c.context) + " positions, so at most " + std::to_string(max_new) + " tokens are generated");

  // One pool for everything (OpenBLAS runs single-threaded inside it), as in train.
  set_num_threads(thread_count(a.threads));
  Generator gen(a.seed);
  nn::SampleOptions so;
  so.temperature = a.temperature;
  so.top_k = a.top_k;
  so.top_p = a.top_p;
  so.generator = &gen;
  so.use_kv_cache = !a.no_kv_cache;
  so.keep_logits = !a.json_path.empty();  // only --json's per-step top-k reads them
  if (text.llama2c) so.stop_tokens = {text::kLlama2cBos, text::kLlama2cEos};
  if (text.tok) so.vocab_limit = text.tok->vocab_size();  // a larger model's placeholder ids: never
  if (!a.stops.empty())
    so.stop_when = [&](std::size_t, const std::vector<std::int64_t>& generated) {
      return stop_position(generated_text(text, vocab, generated), a.stops) != std::string::npos;
    };
  if (!m.gpt) so.stop_token = vocab.id(">");
  // The samples one after the other, from one generator: sample 0 is what N = 1 gives.
  std::vector<Sample> samples;
  std::size_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < a.num_samples; ++i) {
    Sample s;
    if (m.gpt) {
      s.g = nn::generate(*m.gpt, {prompt}, max_new, so);
    } else {  // encoder-decoder: the prompt is the source
      std::vector<std::size_t> len{prompt.size()};
      s.g = nn::generate(*m.encdec, IndexArray({1, prompt.size()}, prompt), len, vocab.id("<"), max_new, so);
    }
    const std::vector<std::int64_t>& out = s.g.tokens[0];
    total += out.size();
    s.text = generated_text(text, vocab, out);
    s.stopped_by = "max_new";
    const std::size_t cut = stop_position(s.text, a.stops);
    if (cut != std::string::npos) {
      s.text.resize(cut);
      s.stopped_by = "stop_string";
    } else if (!out.empty() && ((so.stop_token >= 0 && out.back() == so.stop_token) ||
                                std::find(so.stop_tokens.begin(), so.stop_tokens.end(), out.back()) !=
                                    so.stop_tokens.end())) {
      s.stopped_by = "stop_token";
    } else if (max_new < a.max_new && out.size() == max_new) {
      s.stopped_by = "context";
    }
    s.line = m.gpt ? a.prompt + s.text : a.prompt + " -> " + s.text;
    samples.push_back(std::move(s));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json_path != "-")
    for (std::size_t i = 0; i < samples.size(); ++i)
      std::cout << (i > 0 ? "---------------\n" : "") << samples[i].line << "\n" << std::flush;

  // The attention of sample 0 over what the model saw last: prompt and tokens, cropped to the
  // last `context` of them.
  const std::vector<std::int64_t>& out = samples[0].g.tokens[0];
  std::vector<std::int64_t> seq = prompt;
  seq.insert(seq.end(), out.begin(), out.end());
  if (seq.size() > c.context) seq.erase(seq.begin(), seq.end() - static_cast<std::ptrdiff_t>(c.context));
  const Attention attention = want_attention ? attention_of(a, m, seq) : Attention{};
  json picture;
  if (!a.attention_map.empty()) picture = draw_map(a, attention, vocab, prompt, seq, out.size());
  if (!a.json_path.empty()) {
    const Outcome r{m, text, vocab, so, samples, samples[0].g, max_new, seq, attention, picture};
    write_json("generate", "--json", a.json_path,
               generation_json(a, r).dump(2, ' ', false, json::error_handler_t::replace));
  }
  // Last, once every output is written (a failure stays one line): as run.c's "achieved
  // tok/s", the speed of the generation alone (not loading or drawing), on stderr. Not when the
  // results could not be written (the program then says so, in one line).
  if (!std::cout.flush()) return;
  char speed[96];
  std::snprintf(speed, sizeof speed, "xgrad: %zu tokens in %.3f s (%.1f tok/s)\n", total, seconds,
                seconds > 0 ? static_cast<double>(total) / seconds : 0.0);
  std::cerr << speed;
}

}  // namespace

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Continue a prompt with a trained checkpoint");
  Options o(*cmd, "generate");
  o.add(shared::checkpoint().required(), a->checkpoint);
  o.add(text_flag("prompt", "--prompt",
                  "prompt text (for the reverse task: the source digits); may be empty with a llama2.c tokenizer "
                  "(generation then starts from BOS); this or --prompt-ids is required"),
        a->prompt);
  o.add(text_flag("prompt_ids", "--prompt-ids",
                  "the prompt as token ids instead of --prompt: decimal ids separated by commas, e.g. 1,2,3 (taken "
                  "as given: no BOS is added)")
            .type("IDS"),
        a->prompt_ids);
  o.add(shared::tokenizer().with_help(
            "encode the prompt and decode with this tokenizer instead of the checkpoint's: a llama2.c "
            "tokenizer.bin, a SentencePiece .model or 'bytes'; its size must be the model's vocabulary"),
        a->tokenizer);
  o.add(value_flag("max_new", "--max-new",
                   "tokens to generate per sample, at most 1000000; past its context a GPT sees the last context "
                   "tokens (cropping); the encoder-decoder stops at its context (a warning says so)")
            .range(0, 1000000),
        a->max_new);
  o.add(value_flag("num_samples", "--num-samples",
                   "draw N samples one after the other (printed separated by a line of dashes), in [1, 10000]")
            .range(1, 10000),
        a->num_samples);
  o.add(text_flag("stop", "--stop",
                  "end a sample when its text contains TEXT (repeatable; the text is cut before it)")
            .type("TEXT")
            .shown_default("-"),
        a->stops);
  o.add(value_flag("temperature", "--temperature", "0: greedy; in [0.001, 1000]: sample"), a->temperature);
  o.add(value_flag("top_k", "--top-k", "sample among the k most likely tokens (0: all; needs --temperature > 0)"),
        a->top_k);
  o.add(value_flag("top_p", "--top-p",
                   "nucleus sampling: among the most likely tokens whose probabilities reach this share, in (0, 1] "
                   "(1: all; needs --temperature > 0)"),
        a->top_p);
  o.add(shared::seed().with_help("sampling seed"), a->seed);
  o.add(value_flag("no_kv_cache", "--no-kv-cache", "recompute the whole prefix at every step"), a->no_kv_cache);
  o.add(shared::threads(), a->threads);
  o.add(path_flag("attention_map", "--attention-map",
                  "draw this PNG: attention weights of --layer/--head over the prompt and the generated tokens "
                  "(GPT checkpoints; the gnuplot script goes beside it as .gp)")
            .type("PNG"),
        a->attention_map);
  o.add(value_flag("layer", "--layer", "layer for --attention-map / --json-attention"), a->layer);
  o.add(value_flag("head", "--head", "query head for --attention-map / --json-attention"), a->head);
  o.add(shared::json().with_help("write the generation as JSON to FILE ('-': stdout, and nothing else there)"),
        a->json_path);
  o.add(value_flag("json_top_k", "--json-top-k", "with --json: the K most likely tokens of every step (0: none)")
            .range(0, 100000),
        a->json_top_k);
  o.add(value_flag("json_attention", "--json-attention",
                   "with --json: the attention weights of --layer/--head (GPT checkpoints)"),
        a->json_attention);
  o.add(shared::overwrite(), a->overwrite);
  o.example("xgrad generate --checkpoint run1 --prompt 'Once upon' --max-new 40 --temperature 0.8 --json -");
  o.on_run([a, cmd] { run_generate(*a, *cmd); });
}

}  // namespace xg::cli
