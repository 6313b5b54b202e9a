/// \file
/// Checkpoint conversion from multi-head to grouped-query attention: the key and
/// value heads of each group are mean-pooled (Ainslie et al. 2023, GQA uptraining). With
/// H_kv old key/value heads and G new ones, r = H_kv / G and old head h joins group
/// g(h) = floor(h / r); the new head g is the mean of the old heads of its group, for the
/// weight columns and the bias entries alike. Query and output projections are untouched.
/// Works from MHA (H_kv = H_q) and from GQA to fewer groups; G = H_kv copies the layer.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/array.hpp>
#include <xgrad/nn/attention.hpp>
#include <xgrad/nn/transformer.hpp>

namespace xg::nn {

/// Mean-pools the key and value heads held in the last dimension of `W` (a weight [rows,
/// columns] or a bias [columns]). Its columns are `q_columns` query columns (copied), then
/// H_kv key heads of `d_h` columns each, then H_kv value heads, head-major; the result has
/// q_columns + 2 G d_h columns, new head g the mean of old heads h with floor(h / (H_kv / G))
/// == g. ValueError unless 1 <= G <= H_kv and G divides H_kv, or if the width does not fit.
Array pool_kv_columns(const Array& W, std::size_t q_columns, std::size_t H_kv, std::size_t d_h, std::size_t G);

/// The weights (by name: W_QKV, b_QKV, W_O, b_O) of `layer` with its key/value heads
/// mean-pooled to `G`; build the layer with H_kv = G from them. A layer with an adapter
/// attached (nn/adapter.hpp) is a ValueError: merge it first.
std::vector<std::pair<std::string, Array>> pooled_kv_weights(const MultiHeadAttention& layer, std::size_t G);
/// The weights (W_Q, b_Q, W_KV, b_KV, W_O, b_O) of the cross-attention `layer` with its
/// key/value heads mean-pooled to `G`.
std::vector<std::pair<std::string, Array>> pooled_kv_weights(const CrossAttention& layer, std::size_t G);

/// ValueError naming H_q, H_kv and G unless 1 <= G <= H_kv and G divides H_kv (then G
/// divides H_q too).
void check_kv_groups(std::size_t H_q, std::size_t H_kv, std::size_t G);

/// A new GPT like `model` with H_kv = G in every layer: key/value heads mean-pooled, every
/// other parameter copied.
std::unique_ptr<GPT> with_kv_heads(const GPT& model, std::size_t G);
/// A new EncoderDecoder like `model` with H_kv = G in every self-attention layer (encoder and
/// decoder) and every cross-attention layer (they share the configuration's H_kv).
std::unique_ptr<EncoderDecoder> with_kv_heads(const EncoderDecoder& model, std::size_t G);

}  // namespace xg::nn
