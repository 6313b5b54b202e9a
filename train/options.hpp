/// \file
/// The options of `xgrad train` and the one table that describes them (option_schema()). Every
/// use of an option is driven by its row: the command-line flag, range validation, the
/// checkpoint's metadata (`opt.<name>`), what `--resume` keeps, what `--init-from` must agree
/// with, what the ranks of an MPI job must agree on, the run's description line, and the JSON
/// of `--config` and the run's `config.json`. Adding an option is one row here and its use.
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace xg::train {

/// The options of `xgrad train`, one member per row of option_schema() (docs/cli.md).
struct TrainOptions {
  std::string task = "sort";  ///< sort | reverse | charlm | text (`--task`).
  std::string text = "/usr/share/common-licenses";  ///< charlm, text: a text file or a folder of them (`--text`).
  std::string tokenizer = "bytes";  ///< text: "bytes" or a SentencePiece .model file (`--tokenizer`).
  double val_fraction = 0.1;  ///< text: the share of documents held out for validation (`--val-fraction`).
  std::string out = "out";  ///< The output directory (`--out`).
  std::string resume;  ///< An earlier run's output directory: continue it exactly (`--resume`).
  /// A model.safetensors: a new run starting from its configuration and weights (`--init-from`).
  std::string init_from;

  std::int64_t steps = 0;  ///< Training steps; 0: the task's default (`--steps`).
  std::size_t batch = 64;  ///< Sequences per step, over all ranks (`--batch`).
  std::size_t grad_accum = 1;  ///< Micro-batches of `batch` sequences per optimizer step (`--grad-accum`).
  /// text: what joins the documents into one token stream (`--doc-separator`): "bos", "eos",
  /// "none" (text::DocSeparator), or "auto" (the default): bos when the tokenizer has a BOS, else
  /// none. A run resolves "auto" when it starts (resolve_doc_separator) and saves the result; a
  /// checkpoint saved before the option means "none" (documents joined with nothing between).
  std::string doc_separator = "auto";
  /// LoRA (train/adapters.hpp): the adapters' rank r, 0 for none (`--lora-rank`).
  std::size_t lora_rank = 0;
  double lora_alpha = 16.0;  ///< LoRA: the adapters' scale is alpha / r (`--lora-alpha`).
  std::string lora_targets = "all";  ///< LoRA: the projections adapted (`--lora-targets`, nn::lora_targets).
  std::string freeze;  ///< A regular expression: the parameters whose names it matches are frozen (`--freeze`).
  double lr = 0.0;  ///< Peak learning rate, in (0, 1]; 0: the task's default (`--lr`).
  double min_lr_ratio = 0.1;  ///< The cosine schedule's final learning rate, as a fraction of lr.
  std::int64_t warmup = 100;  ///< Linear warmup steps (`--warmup`).
  double weight_decay = 0.01;  ///< AdamW weight decay (`--weight-decay`).
  double clip = 1.0;  ///< Gradient clipping: the largest global gradient norm (`--clip`).

  /// float32 | float64 (parameters and arithmetic) | bfloat16 (float32 parameters, optimizer
  /// state and reductions; matmul inputs rounded to bfloat16, xg::set_matmul_dtype) (`--dtype`).
  std::string dtype = "float32";
  /// Model width (`--d-model`), query heads H_q (`--heads`), key/value heads H_kv (`--kv-heads`;
  /// 0: = heads), transformer layers (`--layers`) and feed-forward width (`--d-ff`; 0: 4 d_model). @{
  std::size_t d_model = 64, heads = 4, kv_heads = 0, layers = 2, d_ff = 0;
  /// @}
  std::string arch = "gpt";  ///< gpt (GPT-2 blocks) | llama (RMSNorm, SwiGLU, RoPE, no biases) (`--arch`).
  std::size_t multiple_of = 256;  ///< `--arch llama`: the feed-forward width rounding (`--multiple-of`).
  double norm_eps = 1e-5;  ///< `--arch llama`: RMSNorm's epsilon (`--norm-eps`).
  bool tie_embeddings = true;  ///< `--arch llama`: the classifier is the token embedding (`--no-tie-embeddings`: not).
  bool bias = true;  ///< `--arch gpt`: biases in the linear layers and LayerNorms (`--no-bias`: none).
  std::size_t window = 0;  ///< Sliding window of the causal self-attention; 0: none (`--window`).
  double dropout = 0.0;  ///< Dropout probability, in [0, 1) (`--dropout`).
  std::string pos = "learned";  ///< learned | rope | alibi | none (GPT tasks: sort, charlm) (`--pos`).
  /// `--pos` rope: the frequency base (> 1) and the fraction of each head rotated, in (0, 1]. @{
  double rope_base = 10000.0, rope_fraction = 1.0;
  /// @}
  std::string rope_layout = "interleaved";           ///< `--pos` rope: interleaved | half-split.
  std::size_t context = 64;  ///< charlm, text: the training window, in tokens (`--context`).
  /// text: the model's context when longer than the training window (`--model-context`; 0: =
  /// context). --init-from a model of a longer context sets it.
  std::size_t model_context = 0;
  /// text: the model's vocabulary when larger than the tokenizer's (`--vocab-size`; 0: the
  /// tokenizer's). The ids past the tokenizer's are placeholders, never produced as text.
  std::size_t vocab_size = 0;
  std::size_t n_digits = 8;  ///< sort: digits per problem (`--n-digits`).
  /// reverse: the shortest and longest source. @{
  std::size_t min_len = 3, max_len = 8;
  /// @}

  std::uint64_t seed = 1;  ///< Random seed of initialisation, data and dropout (`--seed`).
  /// xgrad worker threads (per rank). 0 (the default): a new run takes the cores, divided among
  /// the ranks on this machine; a resumed run takes the count its checkpoint saved (so that it
  /// continues bit for bit). Another count given to a resumed run is used, with a warning.
  int threads = 0;
  std::int64_t eval_every = 0;        ///< Evaluate every N steps; 0: only at the end (`--eval-every`).
  std::int64_t checkpoint_every = 500;  ///< Checkpoint every N steps; 0: only at the end (and at stop_at).
  std::size_t heldout = 500;  ///< Held-out problems (sort, reverse) for the exact-match metric.
  bool progress = true;   ///< Draw the live progress line (`--no-progress` turns it off).
  bool plot = true;       ///< Draw loss.png through gnuplot (`--no-plot` turns it off).
  std::int64_t stop_at = -1;  ///< Stop after this step (a checkpoint is written), as if interrupted; -1: never.
  bool overwrite = false;     ///< A new run may replace a different run saved in `out` (`--overwrite`).

  // Data-parallel runs (several ranks; docs/distributed.md). Session options, like threads.
  std::int64_t dist_check_every = 100;  ///< Compare parameter checksums across ranks every N steps (0: start and end only).
  bool dist_overlap = false;            ///< Start each gradient bucket's all-reduce during backward.
  std::size_t dist_bucket_kib = 1024;   ///< Gradient bucket size in KiB.

  /// Set asynchronously (a signal handler) to a signal number: the loop finishes the current
  /// step, writes a checkpoint and the log, and returns with TrainResult::signal set.
  const volatile std::sig_atomic_t* stop_signal = nullptr;
};

static_assert(std::is_same_v<std::size_t, std::uint64_t>, "sizes and the seed share one kind of option");
/// Where an option's value lives in TrainOptions.
using OptionMember = std::variant<std::string TrainOptions::*, std::int64_t TrainOptions::*, std::size_t TrainOptions::*,
                                  int TrainOptions::*, double TrainOptions::*, bool TrainOptions::*>;

/// What an option is to a run.
enum class OptionRole {
  run,      ///< Defines the run: saved in its checkpoint (`opt.<name>`), taken from it by `--resume`.
  start,    ///< Says how this run starts (`--out`, `--overwrite`): not saved, refused beside `--resume`.
  session,  ///< This invocation only (`--threads`, `--stop-at`, ...): given again to a resumed run.
};

/// One row of the option table.
struct OptionSpec {
  std::string name;   ///< The key: `opt.<name>` in a checkpoint, `<name>` in JSON.
  std::string flag;   ///< The command-line flag ("" for an option without one).
  OptionMember member;  ///< Its member of TrainOptions.
  std::string help;     ///< The --help text.
  OptionRole role = OptionRole::run;  ///< What it is to a run.
  /// Allowed values of a text option (empty: any text).
  std::vector<std::string> choices;
  /// Range of a number: [lo, hi], with open ends where lo_open / hi_open. Integers use it too.
  /// @{
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  /// @}
  bool ranged = false;  ///< lo/hi apply.
  /// The tasks that read the option (empty: every task); given for another task it is refused.
  std::vector<std::string> tasks;
  /// Read only when another option has this value (e.g. {"pos", "rope"}); refused otherwise.
  std::pair<std::string, std::string> only_when;
  /// The key in a model checkpoint's metadata that this option shapes ("" : none);
  /// `--init-from` takes the value from there and refuses a flag that differs. Not written in
  /// the table: derived from the model schema's row that names this option (ModelField::option
  /// with option_shapes, train/model_schema.hpp).
  std::string model_key;
  /// The value a checkpoint saved before this option existed holds (it lacks the key);
  /// has_legacy false: the key is required.
  /// @{
  std::string legacy;
  bool has_legacy = false;
  /// @}
  /// Written to a checkpoint only when it differs from `legacy`, so that checkpoints of runs
  /// that leave a newer option at its default keep the bytes older versions wrote.
  bool omit_when_legacy = false;
  /// The ranks of an MPI job must agree on it (every run option does; some session ones too).
  bool ranks_agree = true;
  /// Shown with its default in --help.
  bool show_default = true;
  /// A boolean flag that turns the option off (`--no-progress`).
  bool negated = false;
  /// Old spellings of the flag: accepted for one release, with a deprecation line (docs/cli.md).
  std::vector<std::string> deprecated;
};

/// `--doc-separator auto` made concrete for the run `o` (its task and tokenizer): bos when the
/// tokenizer has a BOS, else none; any task but text: none. An explicit bos or eos that the
/// tokenizer lacks is a UsageError naming the tokenizer (text::doc_separator_id).
void resolve_doc_separator(TrainOptions& o);

/// The table: every option of `xgrad train`, in --help order.
const std::vector<OptionSpec>& option_schema();
/// The row of `name` (nullptr if none).
const OptionSpec* find_option(const std::string& name);

/// Whether the run `o` reads the option: its task is one of the row's tasks, and the option it
/// depends on (only_when) has the value it needs.
bool option_applies(const TrainOptions& o, const OptionSpec& spec);

/// The value of `spec` in `o` as text: integers in decimal, reals so that they read back to the
/// same double, booleans "true"/"false".
std::string option_text(const TrainOptions& o, const OptionSpec& spec);
/// The value as people read it (config.json, the run's description line, messages): as
/// option_text, but a real number as the shortest text that reads back to it (`0.1`), where
/// option_text (checkpoint metadata, kept byte for byte) writes 17 digits.
std::string shown_text(const TrainOptions& o, const OptionSpec& spec);
/// Sets `spec` in `o` from `text` (as option_text writes it); FormatError naming `where` if
/// the text is not such a value.
void set_option_text(TrainOptions& o, const OptionSpec& spec, const std::string& text, const std::string& where);

/// The flags a resumed run takes from its saved state (refused next to `--resume`).
std::vector<std::string> run_defining_flags();
/// The flags a resumed run may take (`--threads`, `--stop-at`, ...).
std::vector<std::string> session_flags();

/// Range checks of every option, before any work (UsageError naming the flag and the value).
void validate_options(const TrainOptions& opts);
/// The part that a resumed run takes from its command line: `--threads`, `--stop-at`, `--dist-*`.
void validate_session_options(const TrainOptions& opts);
/// Options given (by `given`, a set of option names) that the run's task or position scheme
/// does not read: UsageError naming the flag.
void check_options_apply(const TrainOptions& o, const std::set<std::string>& given);

/// The run options as checkpoint metadata (`opt.<name>` = option_text).
std::map<std::string, std::string> options_metadata(const TrainOptions& o);
/// The run options of a checkpoint's metadata onto `o` (other options kept). FormatError
/// naming `path` and the key for a missing (required) or malformed value.
TrainOptions options_from_metadata(const std::map<std::string, std::string>& m, TrainOptions o,
                                   const std::string& path);
/// The run options with ranks_agree, and the session ones too, as "name=value" lines: what the
/// ranks of a job compare.
std::map<std::string, std::string> options_ranks_agree_on(const TrainOptions& o);

/// `--init-from`: sets the model-shaping options of `o` (task, widths, heads, layers, dtype,
/// task sizes) from the model checkpoint o.init_from. An option in `given` whose value differs
/// from the checkpoint's is a UsageError naming the flag, both values and the file; a
/// checkpoint this trainer cannot continue is a FormatError.
void apply_init_from(TrainOptions& o, const std::set<std::string>& given);

/// Fills the task defaults into opts (steps, lr), for display and for the run.
TrainOptions with_defaults(TrainOptions opts);
/// The task's own defaults (charlm: model, schedule, regularisation) for every option not in `given`.
TrainOptions with_task_defaults(TrainOptions opts, const std::set<std::string>& given);

/// `--task charlm` of a new run is the text task with the byte tokenizer: an alias kept so old
/// commands work (docs/cli.md). Sets `task` "text" and `tokenizer` "bytes" when `opts.task` is
/// "charlm" and the run starts from scratch; a `--tokenizer` other than bytes (in `given`) is
/// then a UsageError. A run that keeps the charlm task of a model saved by an older xgrad (its
/// `--init-from` checkpoint says task charlm) is left as it is, as are resumed runs (the caller
/// does not call this for them).
void resolve_task_alias(TrainOptions& opts, const std::set<std::string>& given);

/// The run options as a JSON object (the run folder's config.json): every option of the
/// table but --resume and the session ones, with its resolved value; real numbers as the
/// shortest text that reads back; the paths (text, tokenizer, init_from) absolute, so that the
/// file means the same from any folder. `threads` > 0: also "threads", the worker threads
/// the run used, which decide the last bits of its reductions (docs/cli.md), so that
/// `--config RUN/config.json` repeats it bit for bit.
std::string options_json(const TrainOptions& o, int threads = 0);
/// `--config FILE`: the options of a JSON object (keys: option names, as options_json writes
/// them; session options too) onto `o`; returns the names set. A relative path (text,
/// tokenizer, init_from, out) is taken relative to the folder of `path`. The keys overwrite
/// and resume are refused: they decide what happens to a run already on disk, which only the
/// command line may. UsageError naming `path` and
/// the key for text that is not a JSON object, an unknown or duplicate key, a value of the
/// wrong type or out of range.
std::set<std::string> apply_config_json(TrainOptions& o, const std::string& json_text, const std::string& path);

/// The line that describes a run ("task sort, gpt d_model 64, ..."): the task, the model's
/// shape and every option that differs from its default.
std::string describe_options(const TrainOptions& o);

/// A double as text that reads back to the same double.
std::string exact(double v);

}  // namespace xg::train
