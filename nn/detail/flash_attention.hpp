/// \file
/// The fused attention path (docs/performance.md, docs/attention.md "Two implementations").
///
/// One op on the tape with its own VJP, computing exactly what the composed path of
/// nn/sdpa.cpp computes (Algorithm 5.1, (5.11), (5.25)-(5.31), GQA (5.36)) without ever
/// holding the [B, H, T, S] scores:
///
/// \verbatim
///   forward, per block of query rows of one head:
///     U = scale Q_blk K^T over the keys the block can see at all (VisibilityPlan::range:
///         key ranges that no row of the block can see are skipped, so causal halves the work)
///     visibility applied row by row (forbidden -> -inf, soft bias added)
///     m_i = max_j U_ij,  c_i = log sum_j exp(U_ij - m_i)   (the row's log-sum-exp is m_i + c_i)
///     A = exp(U - m) / exp(c), dropout A_d = A * m / q,  O_blk = A_d V
///   only O, m and c are kept for the backward pass (m and c apart: their sum rounded to the
///   input dtype loses the low bits of c when |m| is large, 3e-5 in float32 at m ~ 1e3);
///   backward recomputes A = exp((U - m) - c) from U, m and c block by block:
///     dV += A_d^T dO,  dA_d = dO V^T,  dA = dA_d * m / q
///     delta_i = sum_j A_ij dA_ij  ((5.25); equal to dO_i . O_i),  dU = A * (dA - delta)
///     dQ = scale dU K,  dK += scale dU^T Q_blk
/// \endverbatim
///
/// float32 (head widths a multiple of the vector width: 16 on AVX-512, 8 on AVX2) runs on the
/// tile kernels of nn/detail/flash_tile.hpp instead of the BLAS doorway: the block's key range
/// in tiles of 64 keys, each tile's scores scaled, masked and folded into a running row max m
/// and sum l (O rescaled by e^(m_old - m_new) when m grows) and P V added into the block's
/// output, so no [128, S] scores are formed; the same m and log l are kept. Its backward
/// takes delta_i = dO_i . O_i (equal to sum_j A_ij dA_ij, dropout included) and walks the same
/// tiles: dV += A_d^T dO, dA_d = dO V^T, dU = A * (dA - delta), dQ += scale dU K,
/// dK += scale dU^T Q. float64 keeps the path above bit for bit.
///
/// Invalid queries (query_valid false) give exact zero rows and gradients; a valid query with
/// no visible key is a VisibilityError naming batch, head and query. K and V are read in place
/// by every query head of their group (no repeat). Dropout masks come from a counter-based
/// generator, so the backward pass regenerates them instead of storing them, and the composed
/// path draws the identical mask from the same seed (attention_dropout_mask).
#pragma once

#include <cstddef>
#include <cstdint>

#include <xgrad/core/tensor.hpp>
#include <xgrad/nn/sdpa.hpp>
#include <xgrad/nn/visibility.hpp>

namespace xg::nn {

/// Options of flash_attention().
struct FlashOptions {
  double scale = 1.0;          ///< Score scale.
  BoolArray query_valid = {};  ///< [B, T] or empty (all valid).
  double dropout_p = 0.0;      ///< Dropout probability on the weights, applied when > 0.
  std::uint64_t dropout_seed = 0;  ///< Seed of the counter-based dropout mask.
  /// Batch rows before this one in a global batch (ops::DropoutRowOffset), so a data-parallel
  /// shard draws exactly its rows of the global batch's dropout mask.
  std::size_t dropout_row_offset = 0;
  bool check_finite = true;    ///< Non-finite scores are an error (Algorithm 5.1 step 3).
};

/// Q [B, H_q, T, d_k], K [B, H_kv, S, d_k], V [B, H_kv, S, d_v] -> O [B, H_q, T, d_v]. Inputs
/// must already be checked for shape and dtype (nn/sdpa.cpp does it); `plan` is the
/// visibility bound to [B, H_q, T, S]; `opts` as in FlashOptions.
Tensor flash_attention(const Tensor& Q, const Tensor& K, const Tensor& V, const VisibilityPlan& plan,
                       const FlashOptions& opts);

/// The same op on MultiHeadAttention's packed projection P [B, T, (H_q + 2 H_kv) d] (self-attention,
/// S = T): the columns of each row are Q's heads, then K's, then V's, d each, as X W_QKV makes
/// them. Q, K and V are read in place, strided (no split, no head transpose), and the output comes
/// out as O [B, T, H_q d], the heads already merged for the output projection; the gradient dP
/// is written in place likewise. Arithmetic, bits included, as flash_attention() on the split
/// heads. `plan` is bound to [B, H_q, T, T]; inputs must be checked as for flash_attention().
Tensor flash_attention_packed(const Tensor& P, std::size_t H_q, std::size_t H_kv, const VisibilityPlan& plan,
                              const FlashOptions& opts);

/// MultiHeadAttention's self-attention on its packed projection P (flash_attention_packed), with
/// scaled_dot_product_attention()'s checks, messages and choice of path: returns false, having
/// done nothing, when that call would not take the fused path (composed, or return_weights) or
/// when check_finite finds a non-finite value in P (the split heads then report it, naming Q, K
/// or V); otherwise sets `out`, whose output is [B, T, H_q d], and returns true.
bool packed_self_attention(const Tensor& P, std::size_t H_q, std::size_t H_kv, const Visibility& vis,
                           const SdpaOptions& opts, SdpaResult& out);

/// The decoding step on a KV cache: one new query per sample, Q [B, H_q, 1, d_k], against the
/// keys and values held in slots [lo, hi) of the cache's buffers K [B, H_kv, capacity, d_k] and
/// V [B, H_kv, capacity, d_v] (KVCache::key_buffer, value_buffer), every one of them visible:
/// -> O [B, H_q, 1, d_v]. Values only (nothing is recorded on a tape). The arithmetic is
/// flash_attention()'s for a query row that sees keys [lo, hi) (the same BLAS calls, or the
/// same tile kernels over the same tiles, the same softmax), so O is bit-identical to flash_attention() on copies of those keys; it only reads
/// the buffers in place instead of copying them out. `check_finite`: a non-finite score is a
/// ValueError, as there. Requires lo < hi <= capacity and float32 or float64 (not checked).
/// `K_columns`: the cache's keys transposed tile by tile (KVCache::key_columns(), [B, H_kv,
/// tiles, d_k, 64], tiles * 64 >= capacity; ShapeError otherwise) or an undefined Array; where
/// given and lo is a tile's first slot (a multiple of 64), the tile kernels read their tiles of
/// K^T from it instead of transposing K's slots on every call (the same values: the same bits).
Array attention_one_query(const Array& Q, const Array& K, const Array& V, std::size_t lo, std::size_t hi, double scale,
                          bool check_finite, const Array& K_columns = Array());

/// Whether element `flat` of a [B, H, T, S] attention-weight array is kept by dropout with
/// keep probability q = 1 - p, drawn from `seed` (a counter-based hash: the same answer in the
/// forward pass, the backward pass and the composed path).
/// How the fused attention ops differentiate their own VJP under create_graph
/// (docs/higher-order.md): `fused` (the default) records the backward pass as one op whose VJP
/// is the fused double-backward kernel (nothing of [T, S] size is kept); `composed` rebuilds the
/// composed path from the saved plan and differentiates that (the attention weights are
/// materialised). Both give the same derivatives; tests force each. Process-wide.
enum class AttentionSecondOrder { fused, composed };
void set_attention_second_order(AttentionSecondOrder path);
AttentionSecondOrder attention_second_order();

bool attention_dropout_keep(std::uint64_t seed, std::uint64_t flat, double p);

/// The scaled mask m / q of shape `BHTS` and `dtype` from the same generator (drop
/// probability `p`, `seed`), for the composed path; its batch rows are the rows of a global
/// batch from `row_offset` on (ops::DropoutRowOffset).
Array attention_dropout_mask(const Shape& BHTS, double p, std::uint64_t seed, DType dtype,
                             std::size_t row_offset = 0);

/// How the float32 tile path computed a tile that its block's rows see in part (the causal
/// diagonal, a window's or a document's edges), for tests. exact_parts: every row of the tile is
/// used and exact (a range of visible keys, no bias) and there is no dropout, so the scores' pass
/// is fused (the forward's Kernels::softmax_parts, the backward's weights from the product's
/// registers); general: the visibility applied row by row. On either, the float32 products sum
/// dV and dK by chunks of keys, each over the rows from the first to the last that see it. The
/// two paths give the same bits on the same visible ranges. Counted once per tile and pass,
/// process-wide.
enum class PartialTilePath { exact_parts, general };
std::uint64_t partial_tile_calls(PartialTilePath path);
/// For tests: false sends every such tile down the general path with dV and dK summed over all
/// the tile's rows (the tile path as it was before both), to compare them bit for bit.
/// Process-wide; true (the default) restores them.
void set_exact_parts(bool on);

}  // namespace xg::nn
