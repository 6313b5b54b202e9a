// The training loop behind `xgrad train`: builds the task and model, trains with AdamW,
// gradient clipping and a warmup + cosine schedule, evaluates on held-out data, writes the
// output directory (model.safetensors, train_state.safetensors, log.csv, loss.png) and can
// resume exactly from it.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace xg::train {

struct TrainOptions {
  std::string task = "sort";  // sort | reverse | charlm
  std::string text = "/usr/share/common-licenses/GPL-3";  // charlm
  std::string out = "out";
  std::string resume;  // an earlier run's output directory: continue it exactly

  std::int64_t steps = 0;  // 0: the task's default
  std::size_t batch = 64;
  double lr = 0.0;  // 0: the task's default
  double min_lr_ratio = 0.1;
  std::int64_t warmup = 100;
  double weight_decay = 0.01;
  double clip = 1.0;

  std::size_t d_model = 64, heads = 4, kv_heads = 0, layers = 2, d_ff = 0;
  double dropout = 0.0;
  std::size_t context = 64;  // charlm window
  std::size_t n_digits = 8;  // sort
  std::size_t min_len = 3, max_len = 8;  // reverse

  std::uint64_t seed = 1;
  int threads = 1;  // OpenBLAS threads (tiny matrices: more threads only spin); 0: OpenBLAS default
  std::int64_t eval_every = 0;        // 0: only at the end
  std::int64_t checkpoint_every = 500;  // 0: only at the end (and at stop_at)
  std::size_t heldout = 500;
  bool progress = true;   // live progress line
  bool plot = true;       // loss.png through gnuplot
  std::int64_t stop_at = -1;  // stop after this step (a checkpoint is written), as if interrupted
};

struct TrainResult {
  std::vector<double> losses;  // training loss per step, from step 1
  std::string metric_name;     // "heldout_exact_match" or "val_loss"
  double metric = 0.0;
  std::int64_t steps_done = 0;
  double seconds = 0.0;
};

// Fills the task defaults into opts (steps, lr), for display and for the run.
TrainOptions with_defaults(TrainOptions opts);

TrainResult run_training(const TrainOptions& opts, std::ostream& out);

}  // namespace xg::train
