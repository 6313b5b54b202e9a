// Gradient accumulation (`xgrad train --grad-accum K`): one optimizer step's gradients from K
// micro-batches, equal to those of one batch K times larger. Internal to train/.
#pragma once

#include <cstddef>

#include <xgrad/core/random.hpp>
#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/train/task.hpp>

namespace xg::train::detail {

// Adds to every parameter's gradient the gradient of this rank's share of the mean loss over a
// global batch of `batch` * `micro` sequences, computed `micro` blocks at a time: the rank's rows
// `shard` of that batch are cut into `micro` contiguous blocks, and each block's loss, weighted
// by its share of the batch's targets, is differentiated on a tape of its own (so memory is that
// of one block). Every block sees the same draw of the batch and the same dropout masks (by
// global row) as one pass over the whole batch would: `data` and `dropout` are copied for every
// block but the last, which advances them exactly as that pass does. Returns the rank's
// weighted loss (the global batch's mean loss, summed over the ranks). UsageError when
// `micro` does not divide the shard's rows.
double accumulate_gradients(Task& task, std::size_t batch, std::size_t micro, Generator& data, Generator& dropout,
                            const dist::Shard& shard);

}  // namespace xg::train::detail
