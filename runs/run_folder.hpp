/// \file
/// The run folder of `xgrad train --out DIR`, the one owner of its file names: log.csv (RunLog,
/// and reading an earlier log back on resume), the run id in run_id.txt, and the leftovers of an
/// interrupted checkpoint. `xgrad compare` and `xgrad report` read the same folders.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>


/// Training runs as folders of files, below the training loop: the run folder's layout, the
/// log, comparing runs, the HTML report and gnuplot pictures. Knows nothing of models.
namespace xg::runs {

inline const char* const kStateFile = "train_state.safetensors";  ///< the training state (--resume reads it)
inline const char* const kModelFile = "model.safetensors";  ///< the model at the last checkpoint
inline const char* const kBestFile = "model_best.safetensors";  ///< the model at the lowest validation loss
inline const char* const kLogFile = "log.csv";  ///< one row a step (RunLog)
inline const char* const kRunIdFile = "run_id.txt";  ///< the folder's run: the id of the run its files belong to
inline const char* const kResultFile = "result.txt";  ///< the samples and RESULT lines of a finished run
inline const char* const kConfigFile = "config.json";  ///< the run's options (xgrad train --config repeats the run)
inline const char* const kLossPicture = "loss.png";  ///< the loss curve (gnuplot)
inline const char* const kLossScript = "loss.gp";    ///< its gnuplot script, beside it
/// A sample of the model at every evaluation of a validation task: one JSON line
/// {"step": S, "text": "..."} a step (train/eval_samples.hpp writes it, `xgrad report` shows it).
inline const char* const kSamplesFile = "samples.jsonl";

/// log.csv, written so that it never runs ahead of nor lags behind the checkpoint: rows are
/// held in memory and committed (written, flushed, fsynced) just before each checkpoint. The
/// first commit writes the whole file under a temporary name and renames it into place, so an
/// earlier run's log stays intact until the new run has a checkpoint of its own.
class RunLog {
 public:
  /// val_loss: the validation loss at the steps that evaluated it (charlm), empty elsewhere.
  static constexpr const char* kHeader = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss";
  /// The header of logs written before the val_loss column (their rows are read with it empty).
  static constexpr const char* kHeaderV1 = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s";
  /// The text task's: val_bpb, the validation loss in bits per byte, beside val_loss.
  static constexpr const char* kHeaderBpb = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_bpb";

  /// The log at `path`, continuing the rows `kept` (a resumed run's rows up to its checkpoint);
  /// `bpb` adds the val_bpb column (kHeaderBpb).
  RunLog(std::filesystem::path path, std::vector<std::string> kept, bool bpb = false);
  RunLog(const RunLog&) = delete;             ///< One owner of the open file.
  RunLog& operator=(const RunLog&) = delete;  ///< One owner of the open file.
  /// Closes the file (rows held since the last commit() are dropped, as a kill would).
  ~RunLog();

  /// Holds one row (without its line end) until the next commit().
  void row(const std::string& r) { pending_ += r + "\n"; }
  /// Writes the held rows, flushes and fsyncs the file (FormatError when writing fails).
  void commit();
  /// The SHA-256 of the log's text so far, committed and pending (64 hex digits): saved with
  /// each checkpoint (state metadata 'log_sha256', the log just committed), so that a resume
  /// knows the log's rows are this run's own.
  std::string digest() const;
  /// The log's path.
  const std::filesystem::path& path() const { return path_; }

 private:
  bool write_sync(std::FILE* f);

  std::filesystem::path path_;
  std::string pending_;
  std::string written_;  ///< everything committed (the digest's text)
  std::FILE* file_ = nullptr;
};

/// The comma-separated fields of a line, empty ones included ("1,2," has 3).
std::vector<std::string> csv_fields(const std::string& line);
/// The rows of an earlier log.csv up to the checkpoint's step: exactly steps 1..step, each a
/// complete row of numbers; rows after the step (written after the checkpoint) are dropped.
/// A log with the val_bpb column (kHeaderBpb) is read only when `bpb` is set, and one without
/// only when it is not.
std::vector<std::string> rows_up_to(const std::filesystem::path& path, std::int64_t step, bool bpb = false);

/// A new run's identity: 128 random bits as 32 lowercase hex digits. Random (not derived from
/// the options), so two runs with the same flags have different ids.
std::string new_run_id();
/// Writes DIR/run_id.txt atomically (io::write_atomically).
void write_run_id(const std::filesystem::path& dir, const std::string& id);
/// --resume: the state must belong to the run whose files are in the folder. Checked before
/// anything in the folder changes.
void check_run_id(const std::string& state_id, const std::filesystem::path& dir, const std::string& state_path);

/// Creates the folder (UsageError if it cannot be) and removes the temporary files of a
/// checkpoint that a kill interrupted (never read; the rename is the commit).
void prepare_out_folder(const std::string& out);

}  // namespace xg::runs
