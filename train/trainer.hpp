/// \file
/// The training loop behind `xgrad train`: builds the task and model, trains with AdamW,
/// gradient clipping and a warmup + cosine schedule, evaluates on held-out data, writes the
/// output directory (model.safetensors, train_state.safetensors, log.csv, loss.png, run_id.txt)
/// and can resume exactly from it. The checkpoint is one file, train_state.safetensors (parameters,
/// optimizer state, random generators, step and options), replaced atomically; model.safetensors
/// is the model alone for generate/inspect, written after it (docs/reliability.md). Under
/// mpirun, the same loop runs data-parallel over the ranks (docs/distributed.md).
#pragma once

#include <csignal>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace xg::dist {
class Communicator;
}

namespace xg::train {

/// The options of `xgrad train`, one member per flag (docs/cli.md); validate_options checks
/// their ranges.
struct TrainOptions {
  std::string task = "sort";  ///< sort | reverse | charlm (`--task`).
  std::string text = "/usr/share/common-licenses";  ///< charlm: a text file or a folder of them (`--text`).
  std::string out = "out";  ///< The output directory (`--out`).
  std::string resume;  ///< An earlier run's output directory: continue it exactly (`--resume`).
  /// A model.safetensors: a new run starting from its configuration and weights (`--init-from`).
  std::string init_from;

  std::int64_t steps = 0;  ///< Training steps; 0: the task's default (`--steps`).
  std::size_t batch = 64;  ///< Sequences per step, over all ranks (`--batch`).
  double lr = 0.0;  ///< Peak learning rate, in (0, 1]; 0: the task's default (`--lr`).
  double min_lr_ratio = 0.1;  ///< The cosine schedule's final learning rate, as a fraction of lr.
  std::int64_t warmup = 100;  ///< Linear warmup steps (`--warmup`).
  double weight_decay = 0.01;  ///< AdamW weight decay (`--weight-decay`).
  double clip = 1.0;  ///< Gradient clipping: the largest global gradient norm (`--clip`).

  std::string dtype = "float32";  ///< float32 | float64 (parameters and arithmetic) (`--dtype`).
  /// Model width (`--d-model`), query heads H_q (`--heads`), key/value heads H_kv (`--kv-heads`;
  /// 0: = heads), transformer layers (`--layers`) and feed-forward width (`--d-ff`; 0: 4 d_model). @{
  std::size_t d_model = 64, heads = 4, kv_heads = 0, layers = 2, d_ff = 0;
  /// @}
  std::size_t window = 0;  ///< Sliding window of the causal self-attention; 0: none (`--window`).
  double dropout = 0.0;  ///< Dropout probability, in [0, 1) (`--dropout`).
  std::string pos = "learned";  ///< learned | rope | alibi | none (GPT tasks: sort, charlm) (`--pos`).
  /// `--pos` rope: the frequency base (> 1) and the fraction of each head rotated, in (0, 1]. @{
  double rope_base = 10000.0, rope_fraction = 1.0;
  /// @}
  std::string rope_layout = "interleaved";           ///< `--pos` rope: interleaved | half-split.
  std::size_t context = 64;  ///< charlm: the context length (`--context`).
  std::size_t n_digits = 8;  ///< sort: digits per problem (`--digits`).
  /// reverse: the shortest and longest source. @{
  std::size_t min_len = 3, max_len = 8;
  /// @}

  std::uint64_t seed = 1;  ///< Random seed of initialisation, data and dropout (`--seed`).
  int threads = 1;  ///< xgrad worker threads (per rank); 0: the cores, divided among the ranks on this machine.
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

/// What a training run did.
struct TrainResult {
  /// The training loss of every step this call ran (from step 1, or from the step after the
  /// one resumed), the mean over the global batch.
  std::vector<double> losses;
  /// "heldout_exact_match" (sort, reverse) or "val_loss" (charlm); empty when the run stopped
  /// early (stop_at or a signal).
  std::string metric_name;
  double metric = 0.0;  ///< The final value of metric_name (0 when the run stopped early).
  std::int64_t steps_done = 0;  ///< The last step completed (counted from the run's start, not the call's).
  double seconds = 0.0;  ///< Wall time of the training steps of this call.
  int signal = 0;              ///< The signal that stopped the run (0: not stopped by one).
  int ranks = 1;               ///< World size of the run.
  double allreduce_seconds = 0.0;  ///< Time in the gradient all-reduce (packing, communication, unpacking).
};

/// The flags a resumed run takes from its saved state (refused next to `--resume`, as flag names).
extern const std::vector<std::string> kRunDefiningFlags;

/// Range checks of every option, before any work (UsageError naming the flag and the value).
void validate_options(const TrainOptions& opts);
/// The part that a resumed run takes from its command line: `--threads`, `--stop-at`, `--dist-*`.
void validate_session_options(const TrainOptions& opts);

/// `--init-from`: sets the model options of `o` (task, widths, heads, layers, dtype, task sizes)
/// from the checkpoint o.init_from. A flag the user gave (`given(flag)`) with another value than
/// the checkpoint's is a UsageError naming the flag, both values and the file; a checkpoint
/// this trainer cannot continue (encoder layers != layers) is a FormatError.
void apply_init_from(TrainOptions& o, const std::function<bool(const std::string&)>& given);

/// Fills the task defaults into opts (steps, lr), for display and for the run.
TrainOptions with_defaults(TrainOptions opts);

/// `--task` charlm's defaults where they differ from those of sort and reverse (docs/cli.md):
/// every option whose flag `given` says the command line did not set takes the charlm value;
/// with `--init-from` (opts.init_from set) the model shape (context, d_model, layers) is left as the file gave it.
TrainOptions with_charlm_defaults(TrainOptions opts, const std::function<bool(const std::string& flag)>& given);

/// Trains (or resumes) a run. `out` gets the record of the run: what is trained, evaluations,
/// samples, the files written, "trained N steps in S s" and the line "RESULT <metric> <value>"
/// (or "stopped at step N ..." / "interrupted by signal ..."); `progress` gets the live progress
/// line ("step s/N | loss ... | ETA", redrawn in place when `progress` is the terminal's
/// std::cerr or std::cout) and warnings (a loss curve that could not be drawn: the run still
/// succeeds).
TrainResult run_training(const TrainOptions& opts, std::ostream& out, std::ostream& progress);
/// run_training(opts, out, out): the record, the progress line and warnings all on `out`.
TrainResult run_training(const TrainOptions& opts, std::ostream& out);
/// Data-parallel over comm's ranks (every rank calls it with the same options): each rank
/// computes its shard of every global batch (`--batch` must divide by the world size), the
/// gradients are summed over the ranks before clipping and the optimizer step, and the run
/// is the same as one process's up to floating-point reduction order. Rank 0 alone writes
/// `out`, the output folder and the checkpoints. A failure every rank sees at once throws
/// dist::CollectiveError (see dist/data_parallel.hpp); any other exception is this rank's alone.
TrainResult run_training(const TrainOptions& opts, std::ostream& out, dist::Communicator& comm);
/// The same with the progress line and warnings on `progress` (rank 0's), as above.
TrainResult run_training(const TrainOptions& opts, std::ostream& out, std::ostream& progress,
                         dist::Communicator& comm);

}  // namespace xg::train
