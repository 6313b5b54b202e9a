/// \file
/// Inverted dropout with an explicit generator (SPEC 2). ops/dropout.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

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

/// The counter-based hash behind every dropout mask (this op's and the attention weights',
/// composed and fused: one definition, so both paths draw the same mask). An element is kept
/// iff the top 53 bits of mix(seed ^ mix(flat)) are below dropout_keep_threshold(p), with
/// mix the splitmix64 finaliser. Inline: the fused attention asks per element. @{
inline std::uint64_t dropout_mix64(std::uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// q 2^53 for keep probability q = 1 - `p`.
inline std::uint64_t dropout_keep_threshold(double p) {
  return static_cast<std::uint64_t>((1.0 - p) * 9007199254740992.0);
}
/// Whether element `flat` of the mask drawn with `seed` is kept, for `threshold` =
/// dropout_keep_threshold(p).
inline bool dropout_keep_bits(std::uint64_t seed, std::uint64_t flat, std::uint64_t threshold) {
  return (dropout_mix64(seed ^ dropout_mix64(flat)) >> 11) < threshold;
}
/// The one place a dropout mask is drawn, for the n elements at global flat positions
/// `first` .. `first` + n - 1 of the mask drawn with `seed` (`threshold` =
/// dropout_keep_threshold(p), `scale` = 1 / (1 - p) in T): out[j] = in[j] * scale where the
/// element is kept, else 0; with `in` null, out[j] = scale or 0 (the scaled mask itself).
/// dropout_mask, attention_dropout_mask (the composed attention path) and the fused attention
/// kernel all call it, so every path draws the same mask.
template <class T>
inline void dropout_draw(std::uint64_t seed, std::uint64_t first, std::uint64_t threshold, T scale, const T* in,
                         T* out, std::size_t n) {
  if (in == nullptr) {
    for (std::size_t j = 0; j < n; ++j) out[j] = dropout_keep_bits(seed, first + j, threshold) ? scale : T(0);
  } else {
    for (std::size_t j = 0; j < n; ++j) out[j] = dropout_keep_bits(seed, first + j, threshold) ? in[j] * scale : T(0);
  }
}
/// @}

/// The scaled keep mask m / q of `shape` and `dtype` drawn with `seed` (as dropout_mask,
/// without a generator), whose rows of dimension 0 are rows `row_offset` .. of the global
/// batch (DropoutRowOffset). `op` names the caller in the error for p outside [0, 1)
/// (ValueError naming `p_name`).
Array dropout_mask_from_seed(const std::string& op, const std::string& p_name, const Shape& shape, double p,
                             std::uint64_t seed, DType dtype, std::size_t row_offset);

/// Data-parallel shards (distributed/, docs/distributed.md): while one is alive, this thread's
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
