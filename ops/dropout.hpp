/// \file
/// Inverted dropout with an explicit generator (SPEC 2). ops/dropout.cpp.
#pragma once

#include <cstddef>
#include <cstdint>

#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// The scaled keep mask m / q (q = 1 - p) of `shape` and `dtype`: each element is 1/q with
/// probability q, else 0. Counter-based: one number is drawn from `gen` (the mask's seed),
/// and element i is kept according to a hash of (seed, global position of i), see
/// DropoutRowOffset. p must be in [0, 1) (ValueError otherwise).
Array dropout_mask(const Shape& shape, double p, Generator& gen, DType dtype);

/// Whether the element at global flat position `flat` is kept by the mask drawn with `seed`
/// (keep probability q = 1 - `p`). The same hash as the attention-weight dropout.
bool dropout_keep(std::uint64_t seed, std::uint64_t flat, double p);

/// Data-parallel shards (dist/, docs/distributed.md): while one is alive, this thread's
/// batches are rows [offset, offset + B) of a larger global batch, so the masks of dropout
/// and attention dropout index elements by their position in the global batch (dimension 0
/// is the batch). Every shard then draws exactly its rows of the mask that one process
/// training on the whole batch would draw, and sharding does not change the training.
class DropoutRowOffset {
 public:
  /// Sets this thread's row offset to `offset` until destruction.
  explicit DropoutRowOffset(std::size_t offset);
  /// Restores the previous offset.
  ~DropoutRowOffset();
  DropoutRowOffset(const DropoutRowOffset&) = delete;             ///< Not copyable.
  DropoutRowOffset& operator=(const DropoutRowOffset&) = delete;  ///< Not copyable.

 private:
  std::size_t prev_;
};
/// This thread's row offset (0 outside any DropoutRowOffset).
std::size_t dropout_row_offset();

/// out = x * m / q with the mask drawn from `gen` with drop probability `p`. The backward
/// multiplies by the same m / q (never resampled). Identity (the same tensor, nothing drawn
/// from gen) when p == 0 or `training` is false. p must be in [0, 1) (ValueError otherwise;
/// p == 1 would scale by infinity).
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training = true);

/// Applies a given scaled mask `scaled_mask` (as produced by dropout_mask; x's shape and
/// dtype) to `x`; for code that must reuse or inspect the mask, such as the attention
/// reference gradients.
Tensor apply_dropout_mask(const Tensor& x, const Array& scaled_mask);

}  // namespace xg::ops
