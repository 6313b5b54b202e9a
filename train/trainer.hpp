/// \file
/// The training loop behind `xgrad train` (options: train/options.hpp; tasks: train/task.hpp): builds the task and model, trains with AdamW,
/// gradient clipping and a warmup + cosine schedule, evaluates on held-out data, writes the
/// output directory (model.safetensors, train_state.safetensors, log.csv, loss.png, run_id.txt)
/// and can resume exactly from it. The checkpoint is one file, train_state.safetensors (parameters,
/// optimizer state, random generators, step and options), replaced atomically; model.safetensors
/// is the model alone for generate/inspect, written after it (docs/reliability.md). Under
/// mpirun, the same loop runs data-parallel over the ranks (docs/distributed.md).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include <xgrad/train/options.hpp>

namespace xg::dist {
class Communicator;
}

namespace xg::train {

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
  int threads = 1;             ///< xgrad worker threads per rank this call ran with (saved in the checkpoint).
  double allreduce_seconds = 0.0;  ///< Time in the gradient all-reduce (packing, communication, unpacking).
};

/// The flags a resumed run takes from its saved state (refused next to `--resume`): run_defining_flags().
extern const std::vector<std::string> kRunDefiningFlags;

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
/// dist::CollectiveError (see distributed/data_parallel.hpp); any other exception is this rank's alone.
TrainResult run_training(const TrainOptions& opts, std::ostream& out, dist::Communicator& comm);
/// The same with the progress line and warnings on `progress` (rank 0's), as above.
TrainResult run_training(const TrainOptions& opts, std::ostream& out, std::ostream& progress,
                         dist::Communicator& comm);

}  // namespace xg::train
