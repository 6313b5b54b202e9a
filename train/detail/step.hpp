// The step machinery the two training loops share: `xgrad train` (run_training, train/trainer.cpp)
// and train_module (train/custom_run.cpp). The learning rate of a step, the end of a step (global
// gradient-norm clipping, AdamW on the trainable parameters, the gradients zeroed), when a step
// evaluates and checkpoints, and its log.csv row. What differs between the loops stays theirs: how
// the loss is made and differentiated (a task's batches with gradient accumulation and the ranks'
// reduction, or your loss function), the progress lines, the validation, and the checkpoint's
// format and resume. Internal to train/.
#pragma once

#include <cstdint>
#include <string>

#include <xgrad/nn/optim.hpp>

namespace xg::train::detail {

/// The warmup + cosine schedule of a run of `steps` steps.
struct Schedule {
  double lr = 0;                ///< The peak, after warmup.
  double min_lr_ratio = 0.1;    ///< The cosine's end, as a fraction of lr.
  std::int64_t warmup = 0;      ///< Linear warmup steps.
  std::int64_t steps = 0;       ///< The run's steps.
  /// The learning rate of step `step` (1, 2, ...): nn::warmup_cosine(step - 1, ...).
  double at(std::int64_t step) const;
};

/// The end of a step whose gradients are in place: the global gradient norm of `params` (the
/// optimizer's trainable ones) clipped to `clip` (clip <= 0: no clipping), AdamW's step, the
/// gradients zeroed. Returns the norm before clipping.
double finish_step(nn::AdamW& opt, const nn::NamedTensors& params, double clip);

/// Whether step `step` of `steps` does what is done every `every` steps (0: never) and at the
/// last step: validation (--eval-every), checkpoints (--checkpoint-every; a run also
/// checkpoints at its --stop-at step).
bool every_and_last(std::int64_t step, std::int64_t every, std::int64_t steps);

/// log.csv's row for a step (runs/run_folder.hpp's columns): step, lr, loss, grad_norm (exact),
/// tokens/s, elapsed seconds, and the validation loss (exact) when `val` is given, else empty.
std::string log_row(std::int64_t step, double lr, double loss, double grad_norm, double tokens_per_s, double elapsed,
                    const double* val);

}  // namespace xg::train::detail
