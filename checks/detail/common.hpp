// Helpers shared by the built-in checks (checks/*.cpp): random masks, head slices, and
// comparisons that say where two arrays differ most.
#pragma once

#include <string>
#include <vector>

#include <xgrad/checks/attention_reference.hpp>
#include <xgrad/checks/suite.hpp>
#include <xgrad/xgrad.hpp>

namespace xg::checks {

// A size as the Visibility constructors take it.
inline nn::Position pos(std::size_t n) { return static_cast<nn::Position>(n); }

// Random boolean mask of shape s (last axis S) in which every row has at least one true
// entry, so every query has a key to see.
BoolArray random_allowed(const Shape& s, Generator& g, double p_allowed = 0.6);

// causal(T, S) intersected with a random allowed mask of shape [B, H, T, S]; each query keeps
// its own position (key S - T + i) so no row is empty.
nn::Visibility causal_and_random(const Shape& BHTS, Generator& g, double p_allowed = 0.6);

// Heads [h, h+1) of a [B, H, ., .] tensor.
Tensor head(const Tensor& x, std::size_t h);

// Largest |a - b| and where it is ("name[i, j]"); shapes must match. NaN counts as infinite.
struct Diff {
  double max = 0;
  std::string where;
  void merge(const Diff& o) {
    if (o.max > max || where.empty()) *this = o;
  }
};
Diff max_diff(const Array& a, const Array& b, const std::string& name);
// Largest |a| and where.
Diff max_abs(const Array& a, const std::string& name);
// Largest |a| over all elements (0 for an empty array).
double max_abs_value(const Array& a);

// "B 2, H_q 4, H_kv 2, T 5, S 5, d_k 3, d_v 2"
std::string dims_text(std::size_t B, std::size_t H_q, std::size_t H_kv, std::size_t T, std::size_t S,
                      std::size_t d_k, std::size_t d_v);

// Attention dimensions: Q [B, H_q, T, d_k], K [B, H_kv, S, d_k], V [B, H_kv, S, d_v].
struct Dims {
  std::size_t B, H_q, H_kv, T, S, d_k, d_v;
  std::string text() const { return dims_text(B, H_q, H_kv, T, S, d_k, d_v); }
};

// A random attention configuration for the closed-form comparisons (no dropout): mask kind
// (none, causal, causal & random, random per head, soft bias with -inf), MHA/GQA/MQA,
// T != S unless self_attention, invalid rows (some with empty allowed sets). Every valid
// query keeps at least one allowed key.
struct RefConfig {
  Dims d;
  nn::Visibility vis;                // the library side
  reference::AllowedSets allowed;  // the same constraints as definitions, for the reference
  Array soft;                        // [B, H_q, T, S] soft bias for the reference, or undefined
  BoolArray valid;  // [B, T] or empty
  std::string text;
};
RefConfig random_ref_config(Generator& g, bool self_attention = false);

// An attention layer call with these fields (the rest default).
nn::AttentionCall make_call(const nn::Visibility& vis, const BoolArray& query_valid = {}, Generator* gen = nullptr);

// The soft part of a visibility expanded to the score shape (0 where forbidden), as
// nn::reference takes it.
Array soft_part(const nn::Visibility& v, const Shape& full);

// The closed-form reference's parameters (checks/attention_reference.hpp) of a layer, in float64:
// the packed W_QKV / b_QKV (self) or W_KV / b_KV (cross) cut into W_Q, W_K, W_V and biases
// (undefined where the layer has none).
reference::Layer reference_layer(const nn::MultiHeadAttention& m);
reference::Layer reference_layer(const nn::CrossAttention& m);

}  // namespace xg::checks
