/// \file
/// Rotary position embedding, RoPE (Su et al. 2021), as one op with its VJP. ops/rope.cpp.
///
/// For a feature vector x of width d at absolute position p, the first r = rope_rotary_dims()
/// features are taken in r/2 pairs (a_k, b_k), k = 0 .. r/2-1, and pair k is rotated by the
/// angle theta_k = p * base^(-2k/r):
/// \verbatim
///   y_a = x_a cos(theta_k) - x_b sin(theta_k)
///   y_b = x_a sin(theta_k) + x_b cos(theta_k)
/// \endverbatim
/// Features r .. d-1 pass through unchanged. The layout names which features form pair k:
/// interleaved (a_k, b_k) = (2k, 2k+1), as in the paper; half_split (a_k, b_k) = (k, k + r/2),
/// as in GPT-NeoX. Because rotations compose, (R_p q) . (R_s k) = q . R_(s-p) k: after RoPE a
/// query-key dot product depends on the positions only through s - p.
/// The VJP is the rotation by -theta_k (the transpose of an orthogonal rotation).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg::ops {

/// Which features of a head form the rotated pairs.
enum class RopeLayout {
  interleaved,  ///< Pair k is features (2k, 2k+1): the paper's layout.
  half_split    ///< Pair k is features (k, k + r/2): the GPT-NeoX layout.
};

/// Configuration of rope().
struct RopeConfig {
  double base = 10000.0;  ///< Frequency base; theta_k = p * base^(-2k/r). Must be finite and > 1.
  /// Fraction of each head rotated: r = floor(fraction * d) rounded down to even; the other
  /// features pass through. Must be in (0, 1].
  double fraction = 1.0;
  RopeLayout layout = RopeLayout::interleaved;  ///< Which features form the pairs.
};

/// "interleaved" or "half-split".
std::string rope_layout_name(RopeLayout layout);
/// The layout named "interleaved" or "half-split"; ValueError naming `name` otherwise.
RopeLayout rope_layout_from_name(const std::string& name);

/// The number of rotated features r for head width `d`: floor(fraction * d) rounded down to
/// even. ValueError naming the op `op` when the base or fraction is out of range or r is 0.
std::size_t rope_rotary_dims(const std::string& op, const RopeConfig& cfg, std::size_t d);

/// x [..., T, d] (rank >= 2; axis -2 is the sequence) with `positions` [T] (absolute, >= 0)
/// -> the same shape, each feature pair rotated by its position's angle (see the file
/// comment). One op on the tape; its VJP rotates the cotangent by -theta. float32 and float64.
/// ShapeError if positions.size() != T, ValueError for a negative position or a bad `cfg`.
Tensor rope(const Tensor& x, const std::vector<std::int64_t>& positions, const RopeConfig& cfg = {});

/// RoPE on heads packed side by side: each row of x [..., T, w] holds `heads` head vectors of
/// width d in its first heads * d features, each rotated as rope() rotates a head (r from d
/// and `cfg`); features heads * d .. w-1 pass through. MultiHeadAttention's projection
/// X W_QKV = [Q heads | K heads | V heads] with heads = H_q + H_kv rotates Q and K in place of
/// the layout, and leaves V. Bit for bit rope() on each head split out; the same checks, and a
/// ShapeError naming the shape when heads or d is 0 or heads * d > w.
Tensor rope_heads(const Tensor& x, std::size_t heads, std::size_t d, const std::vector<std::int64_t>& positions,
                  const RopeConfig& cfg = {});

}  // namespace xg::ops
