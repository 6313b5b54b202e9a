/// \file
/// Your own model through the run machinery: train_module() trains any nn::Module with a loss
/// function you write and keeps the run in a run folder that `xgrad compare` and `xgrad report`
/// read like any `xgrad train --out DIR`: log.csv (one row a step, validation loss at the
/// evaluations), config.json (the run's options), run_id.txt, train_state.safetensors (every
/// parameter, AdamW's moments, the generators and the step: `resume` continues the run bit for
/// bit), model.safetensors (and model_best.safetensors with a validation function) and
/// result.txt. AdamW with decoupled weight decay, gradient clipping and the warmup + cosine
/// schedule are the trainer's own (nn/optim.hpp); the folder's files are runs/run_folder.hpp's.
/// docs/custom-layers.md, "Training your own model through the run folder".
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/nn/module.hpp>

namespace xg::train {

/// What one step's loss function is given.
struct StepInput {
  std::int64_t step;   ///< The step, 1, 2, ... (counted from the run's start, also after a resume).
  Generator& data;     ///< Draw the step's batch from it: it is saved with each checkpoint.
  Generator& dropout;  ///< The dropout source of the step (saved too).
};

/// The loss of one step's batch (a scalar on the tape, in training mode). For an exact resume
/// the batch must come from `in.data` (or be a function of `in.step`) and nothing else random.
using LossFn = std::function<Tensor(nn::Module& model, StepInput& in)>;
/// The validation loss (a number, called in eval mode outside any tape): logged as log.csv's
/// val_loss column every `eval_every` steps and at the last step.
using ValidationFn = std::function<double(nn::Module& model)>;

/// The options of a module run. The run-defining ones (all but `resume`, `stop_at`,
/// `overwrite`, `progress`) are saved; a resumed run must be given the same (UsageError naming
/// those that differ).
struct RunOptions {
  std::string out;             ///< The run folder (created; required).
  std::int64_t steps = 100;    ///< Optimizer steps, in [1, 10^9].
  double lr = 1e-3;            ///< Peak learning rate (after warmup).
  double min_lr_ratio = 0.1;   ///< The cosine's end, as a fraction of lr.
  std::int64_t warmup = 0;     ///< Linear warmup steps.
  double weight_decay = 0.0;   ///< AdamW's decoupled weight decay.
  double clip = 1.0;           ///< Gradient norm clipping (0: none).
  std::uint64_t seed = 1;      ///< The data generator is seed + 1, dropout's seed + 2 (as xgrad train).
  std::int64_t eval_every = 0;       ///< Validation every N steps (and at the last); 0: the last only.
  std::int64_t checkpoint_every = 0; ///< A checkpoint every N steps (and at the last); 0: the last only.
  std::uint64_t tokens_per_step = 0; ///< For log.csv's tokens_per_s (0: reported as 0).
  std::string name = "module";       ///< The run's task as compare shows it (config.json "task").
  /// More entries of config.json (the model's sizes, ...), shown by compare and report.
  std::map<std::string, std::string> config;
  /// Metadata of model.safetensors beside "step" (e.g. train::model_metadata of a GPT, so that
  /// load_model() can rebuild it).
  io::safetensors::Metadata model_metadata;
  bool resume = false;     ///< Continue the run saved in `out` from its last checkpoint.
  std::int64_t stop_at = 0;  ///< Stop after this step with a checkpoint (0: run to the end).
  bool overwrite = false;  ///< Replace another run's files in `out` (otherwise a UsageError).
  std::ostream* progress = nullptr;  ///< A line every ~5% of the steps (nullptr: silent).
};

/// What train_module did.
struct ModuleRunResult {
  std::vector<double> losses;     ///< The loss of every step this call ran.
  std::int64_t steps_done = 0;    ///< The last step completed.
  std::optional<double> val_loss; ///< The last validation loss (with a validation function).
  std::string out;                ///< The run folder.
};

/// Trains `model`'s trainable parameters (named_trainable_parameters: frozen ones get no
/// optimizer state) with `loss` for o.steps steps, or continues the run in o.out (o.resume:
/// the folder's model, optimizer and generators are restored into `model`, which must have the
/// same parameters; FormatError naming the file otherwise). A loss that is not a finite scalar
/// is a ValueError naming the step. UsageError for bad options or an out folder that holds
/// another run (without o.overwrite).
ModuleRunResult train_module(nn::Module& model, const LossFn& loss, const RunOptions& o,
                             const ValidationFn& validate = {});

/// Writes the HTML report of the run folders `runs` (xgrad report's page) to `html`; returns
/// its path. Needs the dygraphs package as `xgrad report` does (FormatError naming it otherwise).
std::string write_report(const std::vector<std::string>& runs, const std::string& html,
                         const std::string& title = "xgrad report");

}  // namespace xg::train
