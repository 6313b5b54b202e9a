#include <xgrad/train/options.hpp>
#include <xgrad/io/number.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <sstream>

#include <xgrad/io/input_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/json.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/model_schema.hpp>

namespace xg::train {

namespace fs = std::filesystem;

std::string exact(double v) { return io::exact_text(v); }

namespace {

using O = TrainOptions;
constexpr double kBig = 100000000;  // the bound of step counts

// Row builders: the table below reads as one line per option.
OptionSpec row(std::string name, std::string flag, OptionMember m, std::string help) {
  OptionSpec s;
  s.name = std::move(name);
  s.flag = std::move(flag);
  s.member = m;
  s.help = std::move(help);
  return s;
}
OptionSpec range(OptionSpec s, double lo, double hi, bool lo_open = false, bool hi_open = false) {
  s.lo = lo;
  s.hi = hi;
  s.lo_open = lo_open;
  s.hi_open = hi_open;
  s.ranged = true;
  return s;
}
OptionSpec choices(OptionSpec s, std::vector<std::string> c) {
  s.choices = std::move(c);
  return s;
}
OptionSpec for_tasks(OptionSpec s, std::vector<std::string> t) {
  s.tasks = std::move(t);
  return s;
}
// Saved by newer versions only: older checkpoints lack the key and mean `value`.
OptionSpec since(OptionSpec s, std::string value) {
  s.legacy = std::move(value);
  s.has_legacy = true;
  return s;
}
// An option added after checkpoints existed: saved only when not at `value`, so that runs
// that leave it alone keep the checkpoint bytes earlier versions wrote.
OptionSpec added(OptionSpec s, std::string value) {
  s = since(std::move(s), std::move(value));
  s.omit_when_legacy = true;
  return s;
}
OptionSpec role(OptionSpec s, OptionRole r, bool ranks_agree) {
  s.role = r;
  s.ranks_agree = ranks_agree;
  return s;
}
OptionSpec no_default(OptionSpec s) {
  s.show_default = false;
  return s;
}
// A boolean whose flag turns it off (`--no-progress`).
OptionSpec negated(OptionSpec s) {
  s.negated = true;
  return s;
}
OptionSpec when(OptionSpec s, std::string option, std::string value) {
  s.only_when = {std::move(option), std::move(value)};
  return s;
}

std::vector<OptionSpec> make_schema() {
  using R = OptionRole;
  const std::vector<std::string> lm = {"charlm", "text"};
  std::vector<OptionSpec> t = {
      choices(row("task", "--task", &O::task,
                  "sort (decoder-only), reverse (encoder-decoder), text (your own text) or charlm "
                  "(an alias of text with --tokenizer bytes)"),
              {"sort", "reverse", "charlm", "text"}),
      for_tasks(row("text", "--text", &O::text,
                    "charlm, text: the text file to learn, or a folder of them (all its files; text: recursively)"),
                lm),
      for_tasks(added(row("tokenizer", "--tokenizer", &O::tokenizer,
                          "text: 'bytes', a SentencePiece .model (xgrad tokenizer train) or a llama2.c tokenizer.bin"),
                      "bytes"),
                {"text"}),
      for_tasks(added(range(row("val_fraction", "--val-fraction", &O::val_fraction,
                                "text: the share of documents held out for validation, in (0, 0.5]"),
                            0, 0.5, true),
                      exact(0.1)),
                {"text"}),
      role(row("out", "--out", &O::out, "output directory"), R::start, false),
      no_default(role(row("resume", "--resume", &O::resume, "continue the run saved in this output directory"),
                      R::start, false)),
      no_default(since(row("init_from", "--init-from", &O::init_from,
                           "a new run starting from this model.safetensors (e.g. from xgrad convert): its model "
                           "options and weights"),
                       "")),
      range(row("steps", "--steps", &O::steps, "training steps (0: task default)"), 1, kBig),
      range(row("batch", "--batch", &O::batch, "sequences per step (per micro-batch with --grad-accum)"), 1, 65536),
      added(range(row("grad_accum", "--grad-accum", &O::grad_accum,
                      "micro-batches of --batch sequences per optimizer step: the step's batch is their sum, "
                      "its memory that of one"),
                  1, 4096),
            "1"),
      for_tasks(added(choices(row("doc_separator", "--doc-separator", &O::doc_separator,
                                  "text: what joins the documents into one token stream: bos (the tokenizer's BOS "
                                  "before each), eos (its EOS after each), none (nothing); auto: bos when the "
                                  "tokenizer has one, else none"),
                              {"bos", "eos", "none", "auto"}),
                      "none"),
                lm),
      for_tasks(added(range(row("vocab_size", "--vocab-size", &O::vocab_size,
                                "text: the model's vocabulary (0: the tokenizer's); ids past the tokenizer's "
                                "are placeholders that are never sampled"),
                            0, 1 << 20),
                      "0"),
                {"text"}),
      for_tasks(added(range(row("model_context", "--model-context", &O::model_context,
                                "text: the model's context when longer than the training window --context (0: = "
                                "--context); --init-from sets it to the model's"),
                            0, 65536),
                      "0"),
                {"text"}),
      added(range(row("lora_rank", "--lora-rank", &O::lora_rank,
                      "LoRA: low-rank adapters of this rank on the --lora-targets projections of every block, "
                      "the other weights frozen (0: none)"),
                  0, 65536),
            "0"),
      added(
          range(row("lora_alpha", "--lora-alpha", &O::lora_alpha, "LoRA: the adapters' term is scaled by alpha / rank"),
                0, 1e6, true),
          exact(16.0)),
      added(row("lora_targets", "--lora-targets", &O::lora_targets,
                "LoRA: the projections adapted, comma-separated: q, k, v, o, gate, up, down (llama), fc1, fc2 "
                "(gpt), or the groups attn, mlp, all"),
            "all"),
      added(row("freeze", "--freeze", &O::freeze,
                "freeze the parameters whose names this regular expression matches (anywhere in the name; "
                "xgrad inspect lists the names)"),
            ""),
      no_default(
          range(row("lr", "--lr", &O::lr, "peak learning rate, in (0, 1] (default: 0.003; text and charlm 0.005)"), 0, 1, true)),
      range(row("min_lr_ratio", "--min-lr-ratio", &O::min_lr_ratio,
                "the cosine schedule's final learning rate, as a fraction of --lr, in [0, 1]"),
            0, 1),
      range(row("warmup", "--warmup", &O::warmup, "warmup steps"), 0, kBig),
      range(row("weight_decay", "--weight-decay", &O::weight_decay, "AdamW weight decay"), 0, 10),
      range(row("clip", "--clip", &O::clip, "gradient clipping by global norm"), 0, 1e6, true),
      since(choices(row("dtype", "--dtype", &O::dtype,
                        "parameter and arithmetic precision: float32, float64, or bfloat16 (float32 "
                        "parameters, matmul inputs rounded to bfloat16; needs AVX512_BF16, else float32)"),
                    {"float32", "float64", "bfloat16"}),
            "float32"),
      for_tasks(added(choices(row("arch", "--arch", &O::arch,
                                  "gpt (GPT-2 blocks) or llama (RMSNorm, SwiGLU, RoPE, no biases)"),
                              {"gpt", "llama"}),
                      "gpt"),
                {"sort", "charlm", "text"}),
      when(added(range(row("multiple_of", "--multiple-of", &O::multiple_of,
                           "--arch llama: the feed-forward width is rounded up to a multiple of this"),
                       1, 65536),
                 "256"),
           "arch", "llama"),
      when(added(range(row("norm_eps", "--norm-eps", &O::norm_eps, "--arch llama: RMSNorm's epsilon"), 0, 1, true),
                 exact(1e-5)),
           "arch", "llama"),
      when(added(negated(row("tie_embeddings", "--no-tie-embeddings", &O::tie_embeddings,
                             "--arch llama: a classifier of its own, not the token embedding's transpose")),
                 "true"),
           "arch", "llama"),
      for_tasks(when(added(negated(row("bias", "--no-bias", &O::bias,
                                       "--arch gpt: no biases in the linear layers and LayerNorms (nanoGPT's "
                                       "bias=False)")),
                           "true"),
                     "arch", "gpt"),
                {"sort", "charlm", "text"}),
      range(row("d_model", "--d-model", &O::d_model, "model width"), 1, 8192),
      range(row("heads", "--heads", &O::heads, "query heads H_q"), 1, 8192),
      range(row("kv_heads", "--kv-heads", &O::kv_heads, "key/value heads H_kv (0: = heads; 1: MQA)"), 0, 8192),
      range(row("layers", "--layers", &O::layers, "transformer layers"), 1, 256),
      range(row("d_ff", "--d-ff", &O::d_ff, "feed-forward width (0: 4 d_model)"), 0, 65536),
      range(row("dropout", "--dropout", &O::dropout, "dropout"), 0, 1, false, true),
      since(choices(row("pos", "--pos", &O::pos, "positions (decoder-only tasks): learned, rope, alibi or none"),
                    {"learned", "rope", "alibi", "none"}),
            "learned"),
      since(
          when(range(row("rope_base", "--rope-base", &O::rope_base, "--pos rope: frequency base, > 1"), 1, 1e12, true),
               "pos", "rope"),
          "10000"),
      since(when(range(row("rope_fraction", "--rope-fraction", &O::rope_fraction,
                           "--pos rope: fraction of each head rotated, in (0, 1]"),
                       0, 1, true),
                 "pos", "rope"),
            "1"),
      since(when(choices(row("rope_layout", "--rope-layout", &O::rope_layout,
                             "--pos rope: interleaved or half-split (GPT-NeoX)"),
                         {"interleaved", "half-split"}),
                 "pos", "rope"),
            "interleaved"),
      for_tasks(range(row("context", "--context", &O::context, "charlm, text: context length (tokens)"), 2, 8192), lm),
      since(range(row("window", "--window", &O::window,
                      "sliding-window attention: each position sees itself and the W-1 before it (0: no window)"),
                  0, 65536),
            "0"),
      for_tasks(range(row("n_digits", "--n-digits", &O::n_digits, "sort: digits per problem"), 1, 32), {"sort"}),
      for_tasks(range(row("min_len", "--min-len", &O::min_len, "reverse: the shortest source, in [1, 32]"), 1, 32),
                {"reverse"}),
      for_tasks(
          range(row("max_len", "--max-len", &O::max_len, "reverse: the longest source, in [--min-len, 32]"), 1, 32),
          {"reverse"}),
      row("seed", "--seed", &O::seed, "random seed (initialisation, data, dropout)"),
      role(range(row("threads", "--threads", &O::threads,
                     "xgrad worker threads per rank (0: the cores, shared among the ranks on this machine; "
                     "with --resume: the count the run was saved with)"),
                 0, 1024),
           R::session, false),
      range(row("eval_every", "--eval-every", &O::eval_every, "evaluate every N steps (0: only at the end)"), 0, kBig),
      range(row("checkpoint_every", "--checkpoint-every", &O::checkpoint_every,
                "checkpoint every N steps (0: only at the end)"),
            0, kBig),
      range(row("heldout", "--heldout", &O::heldout,
                "held-out problems (sort, reverse) for the exact-match metric, in [1, 100000]"),
            1, 100000),
      no_default(role(row("stop_at", "--stop-at", &O::stop_at, "stop after this step, as if interrupted (for resume)"),
                      R::session, true)),
      role(negated(row("progress", "--no-progress", &O::progress, "no live progress line")), R::session, false),
      role(negated(row("plot", "--no-plot", &O::plot, "do not draw loss.png")), R::session, false),
      role(row("overwrite", "--overwrite", &O::overwrite, "replace a different run saved in --out"), R::start, false),
      role(range(row("dist_check_every", "--dist-check-every", &O::dist_check_every,
                     "several ranks: compare parameter checksums every N steps (0: at the start and end only)"),
                 0, kBig),
           R::session, true),
      role(row("dist_overlap", "--dist-overlap", &O::dist_overlap,
               "several ranks: all-reduce gradient buckets during backward"),
           R::session, false),
      role(range(row("dist_bucket_kib", "--dist-bucket-kib", &O::dist_bucket_kib,
                     "several ranks: gradient bucket size in KiB"),
                 1, 1 << 20),
           R::session, true),
  };
  for (OptionSpec& s : t) {
    // Options added after the first checkpoints are written only when not at their default.
    if (s.name == "init_from") s.omit_when_legacy = true;
    // Flags renamed so that flag and JSON name agree (docs/cli.md, "Renamed flags").
    if (s.name == "tie_embeddings") s.deprecated = {"--untied-classifier"};
    if (s.name == "n_digits") s.deprecated = {"--digits"};
  }
  // The model options: named by the model schema's rows (ModelField::option), the one direction
  // the two tables are tied in.
  for (const ModelField& f : model_schema()) {
    if (f.option.empty() || !f.option_shapes) continue;
    const auto it = std::find_if(t.begin(), t.end(), [&](const OptionSpec& s) { return s.name == f.option; });
    if (it == t.end()) throw InternalError(op_message("train", "model row '" + f.key + "' names no option '" + f.option + "'"));
    it->model_key = f.key;
  }
  return t;
}

std::string join_or(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Options whose value is a file or folder.
bool is_path_option(const std::string& name) {
  return name == "text" || name == "tokenizer" || name == "init_from" || name == "out";
}

// "--d-model" for a row with a flag, its name otherwise (as the messages name it).
std::string shown(const OptionSpec& s) { return s.flag.empty() ? s.name : s.flag; }

bool is_integer_member(const OptionMember& m) {
  return !std::holds_alternative<std::string O::*>(m) && !std::holds_alternative<double O::*>(m) &&
         !std::holds_alternative<bool O::*>(m);
}

[[noreturn]] void bad(const std::string& flag, const std::string& value, const std::string& rule) {
  throw UsageError(op_message("train", flag + " " + shown_value(value) + ": " + rule));
}

// The row's range as text: "[1, 65536]" or "(0, 1]".
std::string range_text(const OptionSpec& s) {
  auto num = [&](double v) { return is_integer_member(s.member) ? std::to_string(static_cast<long long>(v)) : number_text(v); };
  return (s.lo_open ? "(" : "[") + num(s.lo) + ", " + num(s.hi) + (s.hi_open ? ")" : "]");
}

// Range and choice of one row (the table's own rule).
void check_row(const TrainOptions& o, const OptionSpec& s) {
  const std::string text = option_text(o, s);
  if (!s.choices.empty()) {
    for (const std::string& c : s.choices)
      if (c == text) return;
    bad(shown(s), text.empty() ? "''" : text, "must be " + join_or(s.choices));
  }
  if (!s.ranged) return;
  double v = 0;
  std::visit(
      [&](auto ptr) {
        using T = std::decay_t<decltype(o.*ptr)>;
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) v = static_cast<double>(o.*ptr);
      },
      s.member);
  const bool ok = std::isfinite(v) && (s.lo_open ? v > s.lo : v >= s.lo) && (s.hi_open ? v < s.hi : v <= s.hi);
  if (!ok)
    bad(shown(s), shown_text(o, s), std::string(is_integer_member(s.member) ? "must be in " : "must be a number in ") +
                            range_text(s));
}

}  // namespace

const std::vector<OptionSpec>& option_schema() {
  static const std::vector<OptionSpec> schema = make_schema();
  return schema;
}

const OptionSpec* find_option(const std::string& name) {
  for (const OptionSpec& s : option_schema())
    if (s.name == name) return &s;
  return nullptr;
}

bool option_applies(const TrainOptions& o, const OptionSpec& s) {
  bool for_task = s.tasks.empty();
  for (const std::string& t : s.tasks) for_task = for_task || t == o.task;
  if (!for_task) return false;
  return s.only_when.first.empty() || option_text(o, *find_option(s.only_when.first)) == s.only_when.second;
}

std::string option_text(const TrainOptions& o, const OptionSpec& spec) {
  return std::visit(
      [&](auto ptr) -> std::string {
        const auto& v = o.*ptr;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>)
          return v;
        else if constexpr (std::is_same_v<T, bool>)
          return v ? "true" : "false";
        else if constexpr (std::is_same_v<T, double>)
          return exact(v);
        else
          return std::to_string(v);
      },
      spec.member);
}

std::string shown_text(const TrainOptions& o, const OptionSpec& spec) {
  if (const auto* real = std::get_if<double O::*>(&spec.member)) return number_text(o.**real);
  return option_text(o, spec);
}

void set_option_text(TrainOptions& o, const OptionSpec& spec, const std::string& text, const std::string& where) {
  std::visit(
      [&](auto ptr) {
        auto& v = o.*ptr;
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          v = text;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (text != "true" && text != "false") throw FormatError(where + ": '" + shown_value(text) + "' is not true or false");
          v = text == "true";
        } else if constexpr (std::is_same_v<T, double>) {
          v = io::parse_double(text, where);
        } else if constexpr (std::is_signed_v<T>) {
          const std::int64_t x = io::parse_int(text, where);
          if (x < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
              x > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
            throw FormatError(where + ": '" + shown_value(text) + "' is out of range");
          v = static_cast<T>(x);
        } else {
          const std::uint64_t x = io::parse_uint(text, where);
          // Sizes beyond 2^40 are no sane option of this trainer (and could overflow products).
          if (std::is_same_v<T, std::size_t> && x > (std::uint64_t(1) << 40))
            throw FormatError(where + " = " + shown_value(text) + " is out of range");
          v = static_cast<T>(x);
        }
      },
      spec.member);
}

std::vector<std::string> run_defining_flags() {
  std::vector<std::string> flags;
  for (const OptionSpec& s : option_schema())
    if (!s.flag.empty() && s.role != OptionRole::session && s.name != "resume") flags.push_back(s.flag);
  return flags;
}

std::vector<std::string> session_flags() {
  std::vector<std::string> flags;
  for (const OptionSpec& s : option_schema())
    if (!s.flag.empty() && s.role == OptionRole::session) flags.push_back(s.flag);
  return flags;
}

void validate_options(const TrainOptions& o) {
  for (const OptionSpec& s : option_schema())
    if (s.role == OptionRole::run) check_row(o, s);
  // Rules that tie options together.
  if (o.heads > o.d_model) bad("--heads", std::to_string(o.heads), "must be in [1, " + std::to_string(o.d_model) + "]");
  if (o.d_model % o.heads != 0)
    bad("--heads", std::to_string(o.heads), "must divide --d-model " + std::to_string(o.d_model));
  if (o.kv_heads > o.heads)
    bad("--kv-heads", std::to_string(o.kv_heads), "must be in [0, " + std::to_string(o.heads) + "]");
  if (o.kv_heads != 0 && o.heads % o.kv_heads != 0)
    bad("--kv-heads", std::to_string(o.kv_heads), "must divide --heads " + std::to_string(o.heads));
  if (o.arch == "llama" && o.pos != "rope")
    bad("--pos", o.pos, "--arch llama has rotary positions (--pos rope)");
  if (o.pos != "learned" && o.task == "reverse")
    bad("--pos", o.pos, "the reverse task's encoder-decoder has learned position embeddings only (--pos learned)");
  if (o.pos == "rope") {
    const std::size_t d_h = o.d_model / o.heads;
    const auto r = static_cast<std::size_t>(std::floor(o.rope_fraction * static_cast<double>(d_h)));
    if (r < 2)
      bad("--rope-fraction", number_text(o.rope_fraction),
          "rotates floor(fraction * d_h) = " + std::to_string(r) + " features of a head of width d_h = " +
              std::to_string(d_h) + " (--d-model / --heads); RoPE needs at least 2");
  }
  if (o.task == "sort" && std::pow(10.0, static_cast<double>(o.n_digits)) < 2.0 * static_cast<double>(o.heldout))
    bad("--n-digits", std::to_string(o.n_digits),
        "too few distinct problems for a held-out set of " + std::to_string(o.heldout) +
            " and training (the held-out set may take at most half of the 10^digits problems; use --n-digits >= 3)");
  if (o.model_context != 0 && o.model_context < o.context)
    bad("--model-context", std::to_string(o.model_context),
        "must be 0 or at least --context " + std::to_string(o.context) + " (the training window)");
  if (o.max_len < o.min_len)
    bad("--max-len", std::to_string(o.max_len), "must be in [" + std::to_string(o.min_len) + ", 32]");
  if (o.out.empty()) bad("--out", "''", "must name a folder");
  validate_session_options(o);
}

void validate_session_options(const TrainOptions& o) {
  for (const OptionSpec& s : option_schema())
    if (s.role == OptionRole::session) check_row(o, s);
  if (o.stop_at != -1 && (o.stop_at < 1 || o.stop_at > o.steps))
    bad("--stop-at", std::to_string(o.stop_at), "must be in [1, --steps " + std::to_string(o.steps) + "]");
}

void check_options_apply(const TrainOptions& o, const std::set<std::string>& given) {
  for (const OptionSpec& s : option_schema()) {
    if (!given.count(s.name)) continue;
    bool for_task = s.tasks.empty();
    for (const std::string& t : s.tasks) for_task = for_task || t == o.task;
    if (!for_task)
      throw UsageError(op_message("train", shown(s) + " is only for --task " + join_or(s.tasks) +
                                               " (this run is --task " + o.task + ")"));
    if (!s.only_when.first.empty()) {
      const OptionSpec* other = find_option(s.only_when.first);
      const std::string value = option_text(o, *other);
      if (value != s.only_when.second)
        throw UsageError(op_message("train", shown(s) + " is only for " + shown(*other) + " " + s.only_when.second +
                                                 " (this run is " + shown(*other) + " " + value + ")"));
    }
  }
}

std::map<std::string, std::string> options_metadata(const TrainOptions& o) {
  std::map<std::string, std::string> m;
  for (const OptionSpec& s : option_schema()) {
    if (s.role != OptionRole::run) continue;
    const std::string v = option_text(o, s);
    if (s.omit_when_legacy && v == s.legacy) continue;
    m["opt." + s.name] = v;
  }
  return m;
}

TrainOptions options_from_metadata(const std::map<std::string, std::string>& m, TrainOptions o,
                                   const std::string& path) {
  for (const OptionSpec& s : option_schema()) {
    if (s.role != OptionRole::run) continue;
    const auto it = m.find("opt." + s.name);
    if (it == m.end()) {
      if (!s.has_legacy) throw FormatError("[train] " + path + ": state lacks option '" + s.name + "'");
      set_option_text(o, s, s.legacy, "[train] " + path + ": option '" + s.name + "'");
      continue;
    }
    set_option_text(o, s, it->second, "[train] " + path + ": metadata 'opt." + s.name + "'");
  }
  // A key that every state with its feature has written (RoPE's base, fraction and layout
  // beside opt.pos rope) is required there: only a state older than the feature itself (no
  // opt.pos: learned positions) may lack it. Keys written only when not at their default
  // (omit_when_legacy) mean that default when absent.
  for (const OptionSpec& s : option_schema()) {
    if (s.role != OptionRole::run || s.only_when.first.empty() || s.omit_when_legacy || m.count("opt." + s.name))
      continue;
    if (option_applies(o, s))
      throw FormatError("[train] " + path + ": state has opt." + s.only_when.first + " " + s.only_when.second +
                        " but lacks 'opt." + s.name + "' (a damaged state; it would resume with another model)");
  }
  return o;
}

std::map<std::string, std::string> options_ranks_agree_on(const TrainOptions& o) {
  std::map<std::string, std::string> m = options_metadata(o);
  for (const OptionSpec& s : option_schema())
    if (s.role == OptionRole::session && s.ranks_agree) m["opt." + s.name] = option_text(o, s);
  return m;
}

namespace {

// The task a run --init-from `info` trains: the checkpoint's own, or --task text for any
// decoder-only model (fine-tuning on text: an imported llama2.c model, a sort model, a text model
// with another tokenizer). Refusals name the way forward.
std::string init_task(const TrainOptions& o, const std::set<std::string>& given, const ModelInfo& info,
                      const io::safetensors::Metadata& saved, const std::string& path) {
  const bool carries_tokenizer = saved.count("tokenizer") || info.task_kind() == TaskKind::charlm;
  if (given.count("task") && o.task != info.task) {
    if (o.task != "text")
      throw UsageError(op_message("train", "--task " + o.task + " conflicts with --init-from " + path + " (task " +
                                               info.task + "); leave --task out, or give --task text to fine-tune "
                                               "a decoder-only model on text"));
    if (info.kind != ModelKind::gpt)
      throw UsageError(op_message("train", "--task text: --init-from " + path + " is an encoder-decoder (task " +
                                               info.task + "); only decoder-only models learn text"));
  }
  const std::string task = given.count("task") ? o.task : info.task;
  // An imported model (xgrad import llama2c: task llama2c; tools/xgrad_torch.py: its own word) is
  // no task of this trainer: it learns text.
  if (train::task_kind(task) == TaskKind::imported)
    throw UsageError(op_message("train", "--init-from " + path + " is " +
                                         (task == "llama2c" ? std::string("a llama2.c model (xgrad import llama2c)")
                                                            : "a model of task '" + shown_value(task) + "'") +
                                         ": fine-tune it with --task text --text FILES --tokenizer TOKENIZER "
                                         "(e.g. its tokenizer.bin, or a SentencePiece .model of at most " +
                                         std::to_string(info.config.V_vocab) + " pieces)"));
  if (task == "text" && !carries_tokenizer && !given.count("tokenizer"))
    throw UsageError(op_message("train", "--init-from " + path + " carries no tokenizer (task " + info.task +
                                         "): give --tokenizer (bytes, a tokenizer.bin or a SentencePiece .model) "
                                         "of at most " + std::to_string(info.config.V_vocab) + " ids"));
  // A text model's tokenizer file is not in the checkpoint's name: a run without --tokenizer would
  // train it with bytes.
  if (task == "text" && saved.count("tokenizer") && saved.at("tokenizer") != "bytes" && !given.count("tokenizer"))
    throw UsageError(op_message("train", "--init-from " + path + " was trained with a " + saved.at("tokenizer") +
                                         " tokenizer (sha256 " + shown_value(saved.count("tokenizer_sha256") ? saved.at("tokenizer_sha256").substr(0, 16) : "") +
                                         "): give it, or another of at most " + std::to_string(info.config.V_vocab) +
                                         " ids, with --tokenizer"));
  return task;
}

}  // namespace

void apply_init_from(TrainOptions& o, const std::set<std::string>& given) {
  const std::string& path = o.init_from;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(op_message("train", "--init-from '" + path + "' does not exist"));
  if (fs::is_directory(path, ec))
    throw UsageError(op_message("train", "--init-from '" + path + "' is a folder; give a model.safetensors"));
  io::require_input_file(path, "[train] --init-from");  // a FIFO or a device: refused by name
  const io::safetensors::Metadata saved = io::safetensors::load(path).metadata;
  const ModelInfo info = model_info(saved, path);
  const nn::TransformerConfig& c = info.config;
  if (info.kind == ModelKind::encoder_decoder && c.encoder_layers != c.layers)
    throw FormatError("[train] --init-from " + path + ": " + std::to_string(c.encoder_layers) + " encoder and " +
                      std::to_string(c.layers) + " decoder layers; xgrad train makes both the same");
  const std::string task = init_task(o, given, info, saved, path);
  if (task == "sort" && info.task_params.count("n_values") && info.task_params.at("n_values") != "10")
    throw FormatError("[train] --init-from " + path + ": sort with " + info.task_params.at("n_values") +
                      " values; xgrad train sorts 10");
  o.task = task;
  // The checkpoint's model metadata as this trainer writes it (resolved: H_kv, d_ff), so each
  // model option compares with the value the checkpoint's model has.
  io::safetensors::Metadata theirs = model_metadata(info);
  for (const OptionSpec& s : option_schema()) {
    if (s.model_key.empty() || s.name == "task") continue;
    bool for_task = s.tasks.empty();
    for (const std::string& t : s.tasks) for_task = for_task || t == task;
    if (!for_task) continue;
    // Options read only under another option's value (RoPE's) shape the model only then.
    if (!s.only_when.first.empty()) {
      const std::string key = find_option(s.only_when.first)->model_key;
      const std::string value = theirs.count(key) ? theirs.at(key) : find_option(s.only_when.first)->legacy;
      if (value != s.only_when.second) continue;
    }
    std::string value;
    if (theirs.count(s.model_key))
      value = theirs.at(s.model_key);
    else if (info.task_params.count(s.model_key))
      value = info.task_params.at(s.model_key);
    else if (s.has_legacy)
      value = s.legacy;
    else
      throw FormatError("[train] --init-from " + path + ": metadata lacks '" + s.model_key + "'");
    TrainOptions probe = o;
    set_option_text(probe, s, value, "[train] --init-from " + path + ": metadata '" + s.model_key + "'");
    // The training window may be shorter than the model's context (which the model keeps), not longer.
    if (s.name == "context" && task == "text") {
      const std::size_t model = probe.context;
      if (given.count("context") && o.context > model)
        throw UsageError(op_message("train", "--context " + std::to_string(o.context) + " conflicts with --init-from " +
                                                 path + " (context " + std::to_string(model) +
                                                 "): the training window may be shorter than the model's context, "
                                                 "not longer"));
      if (given.count("model_context") && o.model_context != model)
        throw UsageError(op_message("train", "--model-context " + std::to_string(o.model_context) +
                                                 " conflicts with --init-from " + path + " (context " +
                                                 std::to_string(model) + "); leave --model-context out"));
      if (!given.count("context")) o.context = model;
      o.model_context = o.context < model ? model : 0;
      continue;
    }
    if (!given.count(s.name)) {  // taken from the checkpoint
      set_option_text(o, s, value, "[train] --init-from " + path);
      continue;
    }
    // Given: it must ask for the checkpoint's model. A model row compares the model the option
    // gives (the checkpoint's with this field set from the option through its row, resolved:
    // --kv-heads 0 is H_q, --d-ff 0 the block's width, --dtype bfloat16 float32) with the
    // checkpoint's; a carried one (the sort and reverse sizes) compares the texts.
    const std::string mine = option_text(o, s);
    std::string mine_model = mine, shown_theirs = option_text(probe, s);
    const ModelField& f = *find_model_field(s.model_key);
    if (f.presence != ModelField::Presence::carried) {
      shown_theirs = f.get(info);
      try {
        ModelInfo asked = info;
        f.set_from_option(asked, mine, "[train] " + s.flag + ": ");
        asked.config = asked.config.resolved();
        mine_model = f.get(asked);
      } catch (const Error&) {
        mine_model.clear();  // no model holds together with it: it differs
      }
    }
    if (mine_model != shown_theirs)
      throw UsageError(op_message("train", s.flag + (s.negated && mine == "false" ? std::string() : " " + mine) +  // --no-bias: the flag
                                               (!mine_model.empty() && mine_model != mine
                                                    ? " (" + s.model_key + " " + mine_model + ")"
                                                    : std::string()) +
                                               " conflicts with --init-from " + path + " (" + s.model_key + " " +
                                               shown_theirs + "); leave " + s.flag + " out"));
    // It agrees: the run keeps what it was asked (--dtype bfloat16 stays bfloat16).
  }
}

namespace {
// --task charlm's and text's defaults (with_task_defaults).
constexpr std::int64_t kCharlmSteps = 2000, kCharlmWarmup = 100, kCharlmEvalEvery = 100;
constexpr double kCharlmLr = 5e-3, kCharlmDropout = 0.1, kCharlmWeightDecay = 0.1;
constexpr std::size_t kCharlmBatch = 32, kCharlmContext = 64, kCharlmDModel = 64, kCharlmLayers = 2;
}  // namespace

TrainOptions with_defaults(TrainOptions o) {
  // Defaults with a wide margin on this machine: sort reaches 100% held-out exact match by
  // about 300 steps, reverse by about 600.
  const bool lm = o.task == "charlm" || o.task == "text";
  if (o.steps == 0) o.steps = lm ? kCharlmSteps : (o.task == "reverse" ? 1500 : 1000);
  if (o.lr == 0.0) o.lr = 3e-3;
  return o;
}

TrainOptions with_task_defaults(TrainOptions o, const std::set<std::string>& given) {
  if (o.arch == "llama" && !given.count("pos") && o.init_from.empty()) o.pos = "rope";  // Llama's positions
  if (o.task != "charlm" && o.task != "text") return o;
  // Tuned for about 3 minutes of one core on the licence texts (docs/cli.md has the numbers).
  if (!given.count("steps")) o.steps = kCharlmSteps;
  if (!given.count("lr")) o.lr = kCharlmLr;
  if (!given.count("batch")) o.batch = kCharlmBatch;
  if (o.init_from.empty()) {  // with --init-from the model's shape comes from the file
    if (!given.count("context")) o.context = kCharlmContext;
    if (!given.count("d_model")) o.d_model = kCharlmDModel;
    if (!given.count("layers")) o.layers = kCharlmLayers;
  }
  if (!given.count("dropout")) o.dropout = kCharlmDropout;
  if (!given.count("weight_decay")) o.weight_decay = kCharlmWeightDecay;
  if (!given.count("warmup")) o.warmup = kCharlmWarmup;
  if (!given.count("eval_every")) o.eval_every = kCharlmEvalEvery;
  return o;
}

void resolve_doc_separator(TrainOptions& o) {
  if (o.task != "text") {
    o.doc_separator = "none";
    return;
  }
  if (o.doc_separator == "none") return;
  const std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(o.tokenizer);
  if (o.doc_separator == "auto") {
    o.doc_separator = tok->bos_id() >= 0 ? "bos" : "none";
    return;
  }
  // bos or eos: the tokenizer must have it (a UsageError naming it otherwise).
  (void)text::doc_separator_id(text::doc_separator_from_name(o.doc_separator, "[train] --doc-separator"), *tok,
                               o.tokenizer, "train");
}

void resolve_task_alias(TrainOptions& o, const std::set<std::string>& given) {
  if (o.task != "charlm" || !o.init_from.empty()) return;
  if (given.count("tokenizer") && o.tokenizer != "bytes")
    throw UsageError(op_message("train", "--tokenizer " + o.tokenizer +
                                             " with --task charlm: charlm is the text task with --tokenizer bytes; "
                                             "for another tokenizer use --task text --tokenizer " + o.tokenizer));
  o.task = "text";
  o.tokenizer = "bytes";
}

std::string options_json(const TrainOptions& o, int threads) {
  json::Value obj = json::Value::make_object();
  for (const OptionSpec& s : option_schema()) {
    if (s.role != OptionRole::run || !option_applies(o, s)) continue;
    std::string v = shown_text(o, s);
    if (is_path_option(s.name) && !v.empty() && !(s.name == "tokenizer" && v == "bytes")) {
      std::error_code ec;
      const fs::path absolute = fs::absolute(v, ec);
      if (!ec) v = absolute.string();
    }
    std::visit(
        [&](auto ptr) {
          using T = std::decay_t<decltype(o.*ptr)>;
          if constexpr (std::is_same_v<T, std::string>)
            obj.set(s.name, json::Value::make_string(v));
          else if constexpr (std::is_same_v<T, bool>)
            obj.set(s.name, json::Value::make_bool(o.*ptr));
          else
            obj.set(s.name, json::Value::make_number_text(v));
        },
        s.member);
  }
  if (threads > 0) obj.set("threads", json::Value::make_uint(static_cast<std::uint64_t>(threads)));
  // One option a line, as people read and edit it.
  std::string text = "{\n";
  const auto& members = obj.members();
  for (std::size_t i = 0; i < members.size(); ++i)
    text += "  " + json::quote(members[i].first) + ": " + members[i].second.dump() +
            (i + 1 < members.size() ? ",\n" : "\n");
  return text + "}\n";
}

std::set<std::string> apply_config_json(TrainOptions& o, const std::string& json_text, const std::string& path) {
  json::Value root;
  try {
    root = json::parse(json_text);
  } catch (const FormatError& e) {
    throw UsageError(op_message("train", "--config " + path + " is not JSON: " + e.what()));
  }
  if (!root.is_object())
    throw UsageError(op_message("train", "--config " + path + ": must be a JSON object of options (\"name\": value)"));
  std::set<std::string> set;
  for (const auto& [key, value] : root.members()) {
    const OptionSpec* s = find_option(key);
    const std::string where = "--config " + shown_value(path) + ": key '" + shown_value(key) + "'";
    // Options that decide what happens to files already on disk are this invocation's
    // decision, given on its command line: a config file (often another run's config.json,
    // copied) must not replace or continue a run by itself (docs/cli.md).
    if (key == "overwrite" || key == "resume")
      throw UsageError(op_message("train", where + " may not be set in a config file: it decides what happens to a "
                                                   "run already saved in the output folder; give --" + key +
                                                   " on the command line"));
    if (!s)
      throw UsageError(op_message("train", where + " is not an option of xgrad train (the keys are the options' names, "
                                                   "e.g. d_model for --d-model; see docs/cli.md)"));
    std::string text;
    const bool is_text = std::holds_alternative<std::string O::*>(s->member);
    const bool is_bool = std::holds_alternative<bool O::*>(s->member);
    if (is_text) {
      if (!value.is_string()) throw UsageError(op_message("train", where + " must be a string, got " + shown_value(value.dump())));
      text = value.str();
    } else if (is_bool) {
      if (value.kind() != json::Value::Kind::boolean)
        throw UsageError(op_message("train", where + " must be true or false, got " + shown_value(value.dump())));
      text = value.dump();
    } else {
      if (!value.is_number()) throw UsageError(op_message("train", where + " must be a number, got " + shown_value(value.dump())));
      text = value.str();
    }
    // A relative path in the file is relative to the file's folder, not to the current one.
    const fs::path folder = fs::path(path).parent_path();
    if (is_path_option(key) && !text.empty() && !(key == "tokenizer" && text == "bytes") &&
        fs::path(text).is_relative() && !folder.empty())
      text = (folder / text).string();
    try {
      set_option_text(o, *s, text, where);
    } catch (const FormatError& e) {
      throw UsageError(op_message("train", std::string(e.what()) +
                                               (is_integer_member(s->member) ? " (an integer is expected)" : "")));
    }
    try {
      check_row(o, *s);
    } catch (const UsageError&) {  // the same rule, naming the key and the file
      std::string rule = !s->choices.empty() ? "must be " + join_or(s->choices)
                                             : std::string(is_integer_member(s->member) ? "must be in "
                                                                                        : "must be a number in ") +
                                                   range_text(*s);
      throw UsageError(op_message("train", where + " = " + shown_value(value.dump()) + ": " + rule));
    }
    set.insert(key);
  }
  return set;
}

std::string describe_options(const TrainOptions& o) {
  // The options every line shows are left out; the others appear when not at their defaults.
  // (doc_separator: the corpus line of the text task names it, with its token.)
  static const std::set<std::string> shown_always = {"task", "d_model", "heads", "kv_heads", "layers", "steps",
                                                     "batch", "lr", "seed", "out", "text", "doc_separator"};
  const TrainOptions defaults = with_task_defaults(with_defaults([&] {
    TrainOptions d;
    d.task = o.task;
    return d;
  }()), {});
  std::vector<std::string> parts;
  for (const OptionSpec& s : option_schema()) {
    if (s.role != OptionRole::run || shown_always.count(s.name) || !option_applies(o, s)) continue;
    if (option_text(o, s) != option_text(defaults, s)) parts.push_back(s.name + " " + shown_text(o, s));
  }
  return join(parts);
}

}  // namespace xg::train
