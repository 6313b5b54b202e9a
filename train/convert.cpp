#include <xgrad/train/convert.hpp>
#include <xgrad/io/number.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/nn/kv_head_pooling.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/adapters.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/train/tasks.hpp>
#include <xgrad/text/corpus.hpp>

namespace xg::train {

namespace fs = std::filesystem;

namespace {

// One batch of held-out data, teacher-forced: logits of `model` and the targets (kIgnore
// where nothing is compared).
struct Batch {
  IndexArray tokens, targets;          // GPT: inputs and next-token targets [B, T]
  Seq2SeqBatch seq2seq;                // encoder-decoder
  std::vector<std::vector<std::int64_t>> problems;  // sort / reverse: digits, for exact match
};

// Held-out problems go in batches of this many.
const std::size_t kChunk = 100;

// The size parameter `key` of the checkpoint's task.
std::size_t task_size_param(const ModelInfo& info, const char* key) {
  auto it = info.task_params.find(key);
  if (it == info.task_params.end()) throw FormatError("[convert] checkpoint metadata lacks '" + std::string(key) + "'");
  return static_cast<std::size_t>(io::parse_uint(it->second, "[convert] checkpoint metadata '" + std::string(key) + "'"));
}

// sort: the held-out problems, teacher-forced, compared on the sorted half.
void sort_batches(const ModelInfo& info, const ConvertOptions& o, std::vector<Batch>& out) {
  const SortTask task(task_size_param(info, "n_digits"), task_size_param(info, "n_values"));
  const auto problems = task.heldout(o.heldout, o.seed + 1000);
  const std::size_t n = task.n(), T = 2 * n;
  for (std::size_t first = 0; first < problems.size(); first += kChunk) {
    Batch b;
    b.problems.assign(problems.begin() + static_cast<long>(first),
                      problems.begin() + static_cast<long>(std::min(problems.size(), first + kChunk)));
    const std::size_t B = b.problems.size();
    b.tokens = IndexArray({B, T}, std::vector<std::int64_t>(B * T));
    b.targets = IndexArray({B, T}, std::vector<std::int64_t>(B * T, kIgnore));
    for (std::size_t s = 0; s < B; ++s) {
      std::vector<std::int64_t> seq = task.prompt(b.problems[s]);
      for (std::int64_t x : task.answer(b.problems[s])) seq.push_back(x);
      for (std::size_t t = 0; t < T; ++t) {
        b.tokens.data[s * T + t] = seq[t];
        if (t >= n) b.targets.data[s * T + t] = seq[t + 1];  // the sorted half, as in training
      }
    }
    out.push_back(std::move(b));
  }
}

// reverse: the held-out problems as encoder-decoder batches.
void reverse_batches(const ModelInfo& info, const ConvertOptions& o, std::vector<Batch>& out) {
  const ReverseTask task(task_size_param(info, "min_len"), task_size_param(info, "max_len"));
  const auto problems = task.heldout(o.heldout, o.seed + 1000);
  for (std::size_t first = 0; first < problems.size(); first += kChunk) {
    Batch b;
    b.problems.assign(problems.begin() + static_cast<long>(first),
                      problems.begin() + static_cast<long>(std::min(problems.size(), first + kChunk)));
    b.seq2seq = task.make_batch(b.problems);
    out.push_back(std::move(b));
  }
}

// charlm: training's validation batches of --text, whose characters must be the checkpoint's
// vocabulary.
void charlm_batches(const ModelInfo& info, const ConvertOptions& o, std::vector<Batch>& out) {
  const CharLMTask task(o.text, info.config.context);
  if (task.vocab().tokens != info.vocab.tokens)
    throw UsageError(op_message("convert", "--text " + o.text + ": its characters are not the vocabulary of the checkpoint (" +
                                               std::to_string(task.vocab().size()) + " vs " +
                                               std::to_string(info.vocab.size()) + " tokens): pass the text it was trained on"));
  Generator gen(o.seed + 2000);  // the validation batches of `xgrad train`
  for (int i = 0; i < 10; ++i) {
    const LMBatch lm = task.batch(16, gen, true);
    Batch b;
    b.tokens = lm.tokens;
    b.targets = lm.targets;
    out.push_back(std::move(b));
  }
}

// The validation documents of --text, as `xgrad train --val-fraction F` held them out (every
// document when that leaves none), F from the model's metadata `meta`.
std::vector<text::Document> validation_documents(const io::safetensors::Metadata& meta, const ConvertOptions& o) {
  // The run's --val-fraction, which its model records (models saved before it did: 0.1).
  double fraction = 0.1;
  if (meta.count("val_fraction")) {
    fraction = io::parse_double(meta.at("val_fraction"), "[checkpoint] " + o.in + ": metadata 'val_fraction'");
    if (!(fraction > 0 && fraction <= 0.5))
      throw FormatError("[checkpoint] " + o.in + ": metadata 'val_fraction' = " + shown_value(meta.at("val_fraction")) +
                        " is not in (0, 0.5]");
  }
  // A run folder inside --text was left out of the run's text: leave the model's folder out
  // here too when it lies inside the --text folder (and not when it holds the text).
  std::error_code ec;
  const fs::path run_dir = fs::weakly_canonical(fs::absolute(fs::path(o.in)).parent_path(), ec);
  const fs::path text_dir = fs::weakly_canonical(fs::absolute(o.text), ec);
  const std::string rel = ec ? std::string() : run_dir.lexically_relative(text_dir).string();
  const bool run_inside_text = !rel.empty() && rel != "." && rel.compare(0, 2, "..") != 0;
  const std::vector<text::Document> docs = text::list_documents(o.text, run_inside_text ? run_dir.string() : std::string());
  std::vector<text::Document> tr, val;
  text::split_documents(docs, fraction, tr, val);
  if (val.empty()) val = docs;
  return val;
}

// text: the validation documents of --text encoded with the checkpoint's own tokenizer, cut
// into windows of the model's context as training's validation cuts them: at most 160 (10
// batches of 16, as for charlm), evenly spread.
void text_batches(const ModelInfo& info, const ConvertOptions& o, std::vector<Batch>& out) {
  const io::safetensors::Metadata meta = io::safetensors::load_header(o.in).metadata;
  const std::unique_ptr<text::Tokenizer> tok = text::tokenizer_of_metadata(meta, o.in);
  std::vector<std::uint32_t> ids;
  std::uint64_t bytes = 0;
  // Joined as the run joined them (--doc-separator; absent: none, as before the option).
  std::int64_t sep_id = -1;
  const text::DocSeparator sep = text::saved_doc_separator(meta, *tok, "[convert] " + o.in, sep_id);
  for (const text::Document& d : validation_documents(meta, o)) {
    text::add_document_ids(ids, tok->encode(text::read_document(d)), sep, sep_id);
    bytes += d.size;
  }
  const text::TokenFile tokens(std::move(ids), bytes);
  const std::size_t T = info.config.context;
  const text::ValidationWindows w = text::validation_windows(tokens.size(), T, 160);
  if (w.starts.empty())
    throw UsageError(op_message("convert", "--text '" + o.text + "': " + std::to_string(tokens.size()) +
                                               " tokens; at least 2 are needed"));
  for (std::size_t first = 0; first < w.starts.size(); first += 16) {
    const std::size_t B = std::min<std::size_t>(16, w.starts.size() - first);
    Batch b;
    b.tokens = IndexArray({B, T}, std::vector<std::int64_t>(B * T, 0));
    b.targets = IndexArray({B, T}, std::vector<std::int64_t>(B * T, kIgnore));
    for (std::size_t s = 0; s < B; ++s) {
      const std::uint64_t start = w.starts[first + s];
      for (std::size_t t = 0; t < T && start + t + 1 < tokens.size(); ++t) {
        b.tokens.data[s * T + t] = tokens[start + t];
        b.targets.data[s * T + t] = tokens[start + t + 1];
      }
    }
    out.push_back(std::move(b));
  }
}

// The task's held-out data, in batches, as `xgrad train --seed S --heldout N` holds it out.
std::vector<Batch> heldout_batches(const ModelInfo& info, const ConvertOptions& o) {
  std::vector<Batch> out;
  if (info.task == "sort")
    sort_batches(info, o, out);
  else if (info.task == "reverse")
    reverse_batches(info, o, out);
  else if (info.task == "charlm")
    charlm_batches(info, o, out);
  else if (info.task == "text")
    text_batches(info, o, out);
  else
    throw FormatError("[convert] unknown task '" + info.task + "' in the checkpoint");
  return out;
}

Array logits_of(LoadedModel& m, const Batch& b) {
  NoGradGuard ng;
  if (m.gpt) return m.gpt->logits(b.tokens).value();
  const Seq2SeqBatch& s = b.seq2seq;
  const Tensor memory = m.encdec->encode(s.src, s.src_lengths);
  return m.encdec->decode(s.tgt_in, memory, s.src_lengths).value();
}

const IndexArray& targets_of(const Batch& b) { return b.seq2seq.tgt_out.size() ? b.seq2seq.tgt_out : b.targets; }

// log softmax of row `row` of logits [.., V].
std::vector<double> log_softmax_row(const Array& logits, std::size_t row, std::size_t V) {
  std::vector<double> l(V);
  double mx = -INFINITY;
  for (std::size_t v = 0; v < V; ++v) mx = std::max(mx, l[v] = logits.flat(row * V + v));
  double sum = 0;
  for (double x : l) sum += std::exp(x - mx);
  const double lse = mx + std::log(sum);
  for (double& x : l) x -= lse;
  return l;
}

// Greedy exact match of the whole answer on the batch's problems.
std::size_t exact_matches(LoadedModel& m, const Batch& b, const ModelInfo& info) {
  std::size_t right = 0;
  if (m.gpt) {
    if (info.task != "sort") return 0;
    auto size_param = [&](const char* k) { return static_cast<std::size_t>(io::parse_uint(info.task_params.at(k), k)); };
    const SortTask task(size_param("n_digits"), size_param("n_values"));
    std::vector<std::vector<std::int64_t>> prompts;
    for (const auto& d : b.problems) prompts.push_back(task.prompt(d));
    const nn::Generation g = nn::generate(*m.gpt, prompts, task.n());
    for (std::size_t i = 0; i < b.problems.size(); ++i) right += g.tokens[i] == task.answer(b.problems[i]);
    return right;
  }
  auto size_param = [&](const char* k) { return static_cast<std::size_t>(io::parse_uint(info.task_params.at(k), k)); };
  const ReverseTask task(size_param("min_len"), size_param("max_len"));
  nn::SampleOptions so;
  so.stop_token = task.eos();
  const nn::Generation g = nn::generate(*m.encdec, b.seq2seq.src, b.seq2seq.src_lengths, task.bos(), task.max_len() + 1, so);
  for (std::size_t i = 0; i < b.problems.size(); ++i) {
    std::vector<std::int64_t> want(b.problems[i].rbegin(), b.problems[i].rend());
    want.push_back(task.eos());
    right += g.tokens[i] == want;
  }
  return right;
}

HeldoutScore score(LoadedModel& m, const std::vector<Batch>& batches, const ModelInfo& info) {
  HeldoutScore s;
  double ce = 0;
  std::size_t positions = 0, right = 0, problems = 0;
  const std::size_t V = info.config.V_vocab;
  for (const Batch& b : batches) {
    const Array logits = logits_of(m, b);
    const IndexArray& targets = targets_of(b);
    for (std::size_t row = 0; row < targets.size(); ++row) {
      if (targets.data[row] == kIgnore) continue;
      ce -= log_softmax_row(logits, row, V)[static_cast<std::size_t>(targets.data[row])];
      ++positions;
    }
    if (!b.problems.empty()) {
      right += exact_matches(m, b, info);
      problems += b.problems.size();
    }
  }
  s.cross_entropy = positions ? ce / static_cast<double>(positions) : 0.0;
  if (problems) s.exact_match = static_cast<double>(right) / static_cast<double>(problems);
  return s;
}

}  // namespace

HeldoutScore score_checkpoint(const std::string& path, const ConvertOptions& opts) {
  LoadedModel m = load_model(path);
  return score(m, heldout_batches(m.info, opts), m.info);
}

ConvertReport convert_checkpoint(const ConvertOptions& o) {
  const io::safetensors::File file = io::safetensors::load(o.in);
  if (has_adapters(file.metadata))  // K and V are pooled from plain weights only
    throw UsageError(op_message("convert", o.in + " has LoRA adapters; fold them in first (xgrad merge) and convert "
                                                  "the merged model"));
  LoadedModel from = load_model(o.in);
  const nn::TransformerConfig& c = from.info.config;
  const std::size_t G = o.kv_heads;
  const std::string heads = "the checkpoint has H_q = " + std::to_string(c.H_q) + " query heads and H_kv = " +
                            std::to_string(c.H_kv) + " key/value heads";
  if (G == 0 || G > c.H_kv)
    throw UsageError(op_message("convert", "--kv-heads " + std::to_string(G) + ": must be in [1, H_kv = " +
                                               std::to_string(c.H_kv) + "] (" + heads + ")"));
  if (c.H_kv % G != 0)
    throw UsageError(op_message("convert", "--kv-heads " + std::to_string(G) + " does not divide H_kv = " +
                                               std::to_string(c.H_kv) + " (" + heads + "): G = " + std::to_string(G) +
                                               " groups must each pool the same number of key/value heads"));
  const std::vector<Batch> batches = heldout_batches(from.info, o);  // bad --text fails before writing

  LoadedModel to_build;
  to_build.info = from.info;
  if (from.gpt)
    to_build.gpt = nn::with_kv_heads(*from.gpt, G);
  else
    to_build.encdec = nn::with_kv_heads(*from.encdec, G);

  io::safetensors::Metadata meta = file.metadata;
  meta.erase("step");
  meta.erase("xgrad_version");
  meta["H_kv"] = std::to_string(G);
  meta["converted_from_H_kv"] = std::to_string(c.H_kv);
  meta["kv_conversion"] = "mean-pooled key/value heads (Ainslie et al. 2023), group g(h) = floor(h / r)";
  nn::safetensors::save_module(o.out, to_build.module(), meta);

  // The written file, loaded as every checkpoint is: this is the model the report is about.
  LoadedModel to = load_model(o.out);

  ConvertReport r;
  r.kind = model_kind_name(from.info.kind);
  r.task = from.info.task;
  r.H_q = c.H_q;
  r.H_kv_from = c.H_kv;
  r.H_kv_to = to.info.config.H_kv;
  r.d_h = c.d_model / c.H_q;
  r.self_attention_layers = from.gpt ? c.layers : c.layers + c.encoder_layers;
  r.cross_attention_layers = from.gpt ? 0 : c.layers;
  r.params_from = from.module().parameter_count();
  r.params_to = to.module().parameter_count();
  const std::size_t V = c.V_vocab;
  double sum_abs = 0, kl = 0;
  for (const Batch& b : batches) {
    const Array a = logits_of(from, b), z = logits_of(to, b);
    const IndexArray& targets = targets_of(b);
    r.sequences += targets.shape[0];
    for (std::size_t row = 0; row < targets.size(); ++row) {
      if (targets.data[row] == kIgnore) continue;
      for (std::size_t v = 0; v < V; ++v) {
        const double d = std::abs(a.flat(row * V + v) - z.flat(row * V + v));
        r.max_abs_dlogit = std::max(r.max_abs_dlogit, d);
        sum_abs += d;
      }
      const std::vector<double> p = log_softmax_row(a, row, V), q = log_softmax_row(z, row, V);
      for (std::size_t v = 0; v < V; ++v) kl += std::exp(p[v]) * (p[v] - q[v]);
      ++r.positions;
    }
  }
  if (r.positions) {
    r.mean_abs_dlogit = sum_abs / static_cast<double>(r.positions * V);
    r.kl = kl / static_cast<double>(r.positions);
  }
  r.original = score(from, batches, from.info);
  r.converted = score(to, batches, to.info);
  return r;
}

}  // namespace xg::train
