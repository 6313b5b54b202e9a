/// \file
/// What the training loop asks of a task (`xgrad train --task ...`): where batches come from,
/// the model it trains, held-out evaluation and its metric, samples for the record, and what
/// the checkpoint must record about the data. The loop (train/trainer.cpp) knows nothing else
/// about a task; each task lives in its own file under train/tasks/.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>

#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/nn/module.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/options.hpp>

namespace xg::dist {
class Communicator;
struct Shard;
}  // namespace xg::dist

namespace xg::train {

/// One task of the training loop, with its data and its model.
class Task {
 public:
  virtual ~Task() = default;  ///< Tasks are owned through this interface.

  /// The model the task trains: kind, configuration, vocabulary and the task's sizes.
  const ModelInfo& info() const { return info_; }
  /// Allocates the model from the initialisation generator (after its size was checked).
  virtual void build_model(Generator& init) = 0;
  /// The model, once built.
  virtual nn::Module& module() = 0;

  /// The training loss of this rank's rows (`shard`) of one global batch of `batch` sequences
  /// drawn from `data` (every rank draws the whole batch, so the data stream is the one of a
  /// single process): the mean over the shard's targets. `*weight` receives shard targets /
  /// global targets, the factor that makes the ranks' weighted losses sum to the global mean.
  virtual Tensor loss(std::size_t batch, Generator& data, Generator& dropout, const dist::Shard& shard,
                      double* weight) = 0;
  /// Tokens in one global batch of `batch` sequences (for tokens per second).
  virtual std::size_t tokens_per_batch(std::size_t batch) const = 0;

  /// The name of the task's metric in `RESULT <metric> <value>` and `eval at step` lines.
  virtual std::string metric_name() const = 0;
  /// The metric on held-out data (a collective: every rank calls it); a few samples go to
  /// `samples` (nullptr: none; rank 0 alone passes one).
  virtual double evaluate(dist::Communicator& comm, std::ostream* samples) = 0;

  /// True for tasks with a validation split (language models): the loop computes
  /// validation_loss every --eval-every steps and at the end, logs it in log.csv, keeps the
  /// model with the lowest one as model_best.safetensors, and reports it.
  virtual bool has_validation() const { return false; }
  /// The mean loss over the validation split's fixed evaluation batches (a collective).
  virtual double validation_loss(dist::Communicator& comm);
  /// True when the validation loss also has a value in bits per byte (metric_of_validation),
  /// logged as log.csv's val_bpb column.
  virtual bool logs_bits_per_byte() const { return false; }
  /// The task's metric of a validation loss (evaluate() without recomputing it).
  virtual double metric_of_validation(double val_loss) const { return val_loss; }
  /// Samples of the model for the run's record (validation tasks; evaluate() prints the others').
  virtual void sample(std::ostream& samples);

  /// Lines describing the data, printed after the run's description line ("" : none).
  virtual std::string describe_data() const { return ""; }
  /// What the training state records about the data (e.g. the corpus's fingerprint).
  virtual io::safetensors::Metadata state_metadata() const { return {}; }
  /// On --resume: the data must be the data the run was saved with (FormatError naming `path`).
  virtual void check_resume(const io::safetensors::Metadata& state, const std::string& path) const;
  /// Puts the files the task prepared before the run's checks (the text task's train.bin and
  /// val.bin) into the run folder. Called once every check has passed, before anything else
  /// is written there; a run refused earlier leaves the folder as it was.
  virtual void commit_files() {}

 protected:
  ModelInfo info_;  ///< Set by the task's constructor.
};

/// The task `o.task` with its data. Files are read by rank 0 and broadcast to the others (a
/// collective under several ranks; a failure is every rank's at once).
std::unique_ptr<Task> make_task(const TrainOptions& o, dist::Communicator& comm);

}  // namespace xg::train
