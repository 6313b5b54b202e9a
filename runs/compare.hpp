/// \file
/// `xgrad compare`: several training runs side by side. Reads run folders (written by
/// `xgrad train --out DIR`): their log.csv, their options (config.json when the folder has
/// one, otherwise the `opt.*` metadata of train_state.safetensors, of which only the header is
/// read) and run_id.txt; summarises each run (final and best validation loss, bits per byte,
/// steps, tokens seen, wall time), draws their loss curves on one picture through gnuplot and
/// renders the table and the JSON document (docs/cli.md, "xgrad compare").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <xgrad/runs/plots.hpp>

namespace xg::runs {

/// One row of a log.csv (one training step).
struct LogRow {
  std::int64_t step = 0;   ///< The step, 1, 2, ... (column `step`).
  double lr = 0.0;         ///< The learning rate of the step (column `lr`).
  double loss = 0.0;       ///< The training loss of the step (column `loss`).
  double grad_norm = 0.0;  ///< The gradient norm before clipping (column `grad_norm`).
  double tokens_per_s = 0.0;  ///< Tokens per second since the session started (column `tokens_per_s`).
  double elapsed_s = 0.0;  ///< Seconds since the session (the run, or its last `--resume`) started.
  std::optional<double> val_loss;  ///< The validation loss, at the steps that evaluated it.
  std::optional<double> val_bpb;   ///< Validation bits per byte, when the log has the column and the row a value.
};

/// A training log as read by read_log.
struct RunLogData {
  std::vector<std::string> columns;  ///< The header's column names.
  std::vector<LogRow> rows;          ///< Steps 1..N, in order.
  /// The 1-based column numbers of `val_loss` and `val_bpb` (0 when the log has no such column). @{
  std::size_t val_loss_column = 0, val_bpb_column = 0;
  /// @}
};

/// Reads a log.csv strictly. The header is `step,lr,loss,grad_norm,tokens_per_s,elapsed_s`,
/// optionally followed by more named columns (`val_loss`, `val_bpb`, read when present; others
/// are checked and ignored). Every row has the header's number of fields, the step of its
/// position (1, 2, ...), finite numbers in the first six columns and a finite number or nothing
/// in the others, and ends with a line end. FormatError naming `path:line` for an empty file,
/// a foreign header, a log without rows, and a truncated or garbled row.
RunLogData read_log(const std::string& path);

/// What `xgrad compare` knows about one run folder.
struct RunSummary {
  std::string dir;     ///< The folder as given.
  std::string label;   ///< Its name (read_runs makes clashing names unique path suffixes).
  std::string run_id;  ///< The id in run_id.txt ("" for runs saved before run ids existed).
  /// The run's options by name: config.json's members (nested objects flattened with dots;
  /// strings as they are, other values as JSON text) when the folder has config.json, otherwise
  /// the `opt.NAME` metadata of train_state.safetensors as NAME.
  std::map<std::string, std::string> options;
  std::string options_source;  ///< "config.json" or "train_state.safetensors".
  RunLogData log;              ///< log.csv.
  std::int64_t steps = 0;      ///< The last step in the log.
  /// Tokens per training step (the trainer's tokens_per_batch) from the options: sort
  /// `batch * 2 * n_digits`, reverse `batch * (2 * max_len + 1)`, charlm and text
  /// `batch * context`; empty for another task or when an option it needs is missing.
  std::optional<std::uint64_t> tokens_per_step;
  std::optional<std::uint64_t> tokens;  ///< Tokens seen: steps * tokens_per_step.
  /// The training sessions the log holds: 1, plus one per `--resume` (see session_starts).
  std::size_t sessions = 0;
  double wall_s = 0.0;  ///< Wall time of the training: the sum of every session's last elapsed_s.
  double final_train_loss = 0.0;  ///< The mean training loss of the last 5% of the rows (at least one).
  std::optional<double> final_val_loss;  ///< The last validation loss (empty: the run has none).
  std::optional<double> best_val_loss;   ///< The lowest validation loss (the first, on a tie).
  std::int64_t best_val_step = 0;        ///< The step of best_val_loss (0 when there is none).
  std::optional<double> final_val_bpb;   ///< val_bpb in the row of final_val_loss.
  std::optional<double> best_val_bpb;    ///< val_bpb in the row of best_val_loss (the best model's).
  /// Bytes per token of the validation text, val_loss / (val_bpb ln 2) at the first row with
  /// both (positive): what `--x bytes` multiplies tokens seen by. Empty without val_bpb.
  std::optional<double> bytes_per_token;
};

/// The files of a run folder that `xgrad compare` reads or that belong to the run
/// (log.csv, train_state.safetensors, model.safetensors, model_best.safetensors, run_id.txt,
/// config.json, loss.png, loss.gp, result.txt): outputs of compare must not replace any of them.
extern const std::vector<std::string> kRunFolderFiles;

/// Checks that `dir` names a run folder: it exists, is a folder, and holds log.csv and
/// train_state.safetensors (UsageError naming the folder and what is missing).
void check_run_folder(const std::string& dir);

/// Reads the run folder `dir` (check_run_folder first): its log, options and run id, and the
/// figures of RunSummary; the label is the folder's name. Only the header of
/// train_state.safetensors is read. FormatError naming the file for a bad log.csv, state
/// header, config.json or run_id.txt.
RunSummary read_run(const std::string& dir);

/// Reads several run folders: every folder is checked (check_run_folder) before any is read;
/// the same folder given twice (however spelled) or two folders of the same run (the same
/// run_id.txt) is a UsageError naming both. Labels are the folders' names, or where names
/// clash the shortest path suffixes that tell them apart (unique_labels).
std::vector<RunSummary> read_runs(const std::vector<std::string>& dirs);

/// A label for each of `dirs` (distinct folders): the folder's name when no other has it,
/// otherwise the shortest suffix of its absolute path (`exp1/A`, `exp2/A`) that no other
/// folder's path ends with.
std::vector<std::string> unique_labels(const std::vector<std::string>& dirs);

/// The row indices (0-based) at which a training session starts: row 0, and every row whose
/// elapsed_s is below the row before it (the clock restarts at a resume); with
/// `tokens_per_step` known also every row whose tokens_per_s * elapsed_s is one step's tokens
/// (the first step of a session, also when it took longer than the whole session before it).
std::vector<std::size_t> session_starts(const std::vector<LogRow>& rows, std::optional<std::uint64_t> tokens_per_step);

/// The options whose values are not the same in every run (in name order): an option missing
/// from some runs counts as differing; numbers are compared as numbers (`0.01` = `1e-2`);
/// `out` and `resume` (the folders themselves) are left out.
std::vector<std::string> differing_options(const std::vector<RunSummary>& runs);

/// The table `xgrad compare` prints: one row per run (label, task, steps, tokens, wall time,
/// final training loss, final validation loss, best validation loss and its step, and the
/// validation bits per byte when any run has them), then "options that differ:" with every
/// run's value of each differing option.
std::string compare_table(const std::vector<RunSummary>& runs);

/// What the picture has on its x axis.
enum class CompareX {
  step,    ///< The training step.
  tokens,  ///< Tokens seen (step * tokens per step).
  bytes    ///< Bytes seen: tokens seen * the run's bytes_per_token.
};

/// What the picture has on its y axis.
enum class CompareY {
  loss,      ///< The training loss of every step alone.
  val_loss,  ///< The validation loss, over the training loss drawn thin and light.
  val_bpb    ///< Validation bits per byte alone (comparable across tokenizers).
};

/// The name of an axis choice as the flags spell it ("step", "val_bpb", ...). @{
std::string axis_name(CompareX x);
std::string axis_name(CompareY y);
/// @}

/// UsageError naming the run (and pointing to `--x step`) when `x` is CompareX::tokens and a
/// run's tokens per step are unknown, or CompareX::bytes and its tokens per step or bytes per
/// token (a log without val_bpb) are unknown.
void check_x_axis(const std::vector<RunSummary>& runs, CompareX x);
/// UsageError naming the run when `y` is CompareY::val_loss and a run has no validation loss,
/// or CompareY::val_bpb and a run has no val_bpb.
void check_y_axis(const std::vector<RunSummary>& runs, CompareY y);

/// What tokenizes a run's text: its `tokenizer` option when it has one (a text run), else its
/// task (the task's own vocabulary).
std::string tokenizer_of(const RunSummary& r);
/// `--y`'s default: val_bpb when the runs' tokenizers (tokenizer_of) differ and every run has
/// val_bpb (a loss per token ranks runs with different tokens wrongly); otherwise val_loss
/// (where a run has no validation loss, its training loss alone is drawn).
CompareY default_y(const std::vector<RunSummary>& runs);

/// The JSON document of `xgrad compare --json` (docs/cli.md has the schema); `picture` is the
/// drawn picture (null in the document when nullptr).
std::string compare_json(const std::vector<RunSummary>& runs, CompareX x, const Picture* picture,
                         CompareY y = CompareY::val_loss);

/// The gnuplot script that draws every run's training loss (thin, light) and validation loss
/// (points and lines) in one colour per run, against step or tokens seen, 1000 x 600 pixels,
/// log scale on y when the losses span more than a factor of 4. The script reads each run's
/// log.csv, named relative to the folder of `png`, where the script runs. check_x_axis first.
/// `y` picks the curves: CompareY::loss the training loss alone, CompareY::val_bpb the
/// validation bits per byte alone (check_y_axis first).
std::string compare_script(const std::vector<RunSummary>& runs, const std::string& png, CompareX x,
                           CompareY y = CompareY::val_loss);
/// Writes compare_script's script beside `png` and draws it (plots.hpp: a missing gnuplot
/// skips the picture with Picture::note; a failing one throws ValueError).
Picture compare_png(const std::vector<RunSummary>& runs, const std::string& png, CompareX x,
                    CompareY y = CompareY::val_loss);

}  // namespace xg::runs
