// Options of tiny training runs for tests that need a real run folder on disk: a one-layer
// sort model that trains in well under a second, and `xgrad train --resume DIR` (quiet).
#pragma once

#include <cstdint>
#include <filesystem>

#include <xgrad/train/trainer.hpp>

namespace xgt {

// The sort task on 4 digits, d_model 16, 2 heads, 1 layer, batch 8, one thread, no progress
// line and no plot, writing to `out`.
inline xg::train::TrainOptions tiny_sort_run(const std::filesystem::path& out, std::int64_t steps) {
  xg::train::TrainOptions o;
  o.out = out.string();
  o.steps = steps;
  o.batch = 8;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.n_digits = 4;
  o.warmup = 2;
  o.heldout = 20;
  o.threads = 1;
  o.progress = false;
  o.plot = false;
  return o;
}

// The options of `xgrad train --resume dir` (quiet).
inline xg::train::TrainOptions resume_options(const std::filesystem::path& dir) {
  xg::train::TrainOptions o;
  o.resume = dir.string();
  o.progress = o.plot = false;
  return o;
}

}  // namespace xgt
