/// \file
/// Attention layers (SPEC 6-8, 11): one core (nn/sdpa.hpp) and two thin front doors.
///
/// - MultiHeadAttention: self-attention with a packed W_QKV (5.22) and output projection W_O
///   (5.20). Any H_q and H_kv with H_q % H_kv == 0: H_kv == H_q is MHA, 1 < H_kv < H_q is
///   GQA, H_kv == 1 is MQA (5.36). W_QKV is [d_model, (H_q + 2 H_kv) d_h], columns
///   [Q heads | K heads | V heads], each block head-major ([h0 d_h | h1 d_h | ...]).
/// - CrossAttention: queries from X_q [B, T, d_q], keys and values from X_m [B, S, d_m] with a
///   packed W_KV [d_m, 2 H_kv d_h] (the text after (5.22)); d_q != d_m allowed. No causal mask
///   is implied: pass the source padding visibility; a target-side causal mask is not copied
///   here.
///
/// Weights are stored in x out (y = x W + b); nn/torch_layout.hpp converts to and from
/// PyTorch's out x in. Heads split features, not positions:
/// [B, T, H d_h] -> [B, T, H, d_h] -> [B, H, T, d_h] (SPEC 6).
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/nn/adapter.hpp>
#include <xgrad/nn/kv_cache.hpp>
#include <xgrad/nn/module.hpp>
#include <xgrad/nn/sdpa.hpp>
#include <xgrad/nn/visibility.hpp>
#include <xgrad/ops/rope.hpp>

namespace xg::nn {

/// Configuration of a MultiHeadAttention layer.
struct AttentionConfig {
  std::size_t d_model = 0;  ///< Input and output width d.
  std::size_t H_q = 1;      ///< Query heads.
  std::size_t H_kv = 0;    ///< Key/value heads; 0 means H_q (MHA). H_q must be a multiple of it.
  std::size_t d_head = 0;  ///< Head width d_h; 0 means d_model / H_q (which must then divide evenly).
  bool bias = true;        ///< Whether the projections have biases (b_QKV, b_O).
  double dropout = 0.0;  ///< Dropout probability on attention weights, in training mode.
  std::optional<double> scale;  ///< Score scale; default 1 / sqrt(d_head).
  DType dtype = default_dtype();  ///< Parameter dtype (default_dtype() when the config is made).
  SdpaImpl impl = SdpaImpl::automatic;  ///< Attention core (nn/sdpa.hpp).
  /// Sliding window W (0 = none): each query sees its own position and the W - 1 before it
  /// (Visibility::sliding_window), intersected with the call's visibility in forward() and
  /// forward_cached(); make_cache() then gives a windowed cache (KVCache::windowed).
  std::size_t window = 0;
  /// RoPE (ops/rope.hpp) on Q and K at their absolute positions (AttentionCall::positions,
  /// default 0 .. T-1, in forward(); the cache's next positions in forward_cached(), where K is
  /// cached already rotated). Unset: none.
  std::optional<ops::RopeConfig> rope;
  /// ALiBi: Visibility::alibi with alibi_slopes(H_q) by absolute position, added to (intersected
  /// with) the call's visibility in forward() and forward_cached().
  bool alibi = false;
  /// A registered attention core (nn::register_attention, nn/layer_registry.hpp) computing O
  /// from the heads in place of scaled_dot_product_attention, in forward() and
  /// forward_cached(); looked up when the layer is made (ValueError naming it if it is not
  /// registered). Empty: the built-in core (`impl`). A layer with one returns no weights.
  std::string core;
};

/// Configuration of a CrossAttention layer.
struct CrossAttentionConfig {
  /// Widths of the query-side input X_q (d_q) and of the memory X_m (d_m). @{
  std::size_t d_q = 0, d_m = 0;
  /// @}
  std::size_t H_q = 1;     ///< Query heads.
  std::size_t H_kv = 0;    ///< Key/value heads; 0 means H_q.
  std::size_t d_head = 0;  ///< Head width d_h; 0 means d_q / H_q.
  std::size_t d_out = 0;   ///< Output width; 0 means d_q (residual connection).
  bool bias = true;        ///< Whether the projections have biases (b_Q, b_KV, b_O).
  double dropout = 0.0;    ///< Dropout probability on attention weights, in training mode.
  std::optional<double> scale;  ///< Score scale; default 1 / sqrt(d_head).
  DType dtype = default_dtype();  ///< Parameter dtype (default_dtype() when the config is made).
  SdpaImpl impl = SdpaImpl::automatic;  ///< Attention core (nn/sdpa.hpp).
};

/// Per-call inputs that are not tensors.
struct AttentionCall {
  Visibility visibility = Visibility::all();  ///< Which keys each query may see.
  BoolArray query_valid = {};      ///< [B, T], true = real query; empty = all valid.
  Generator* generator = nullptr;  ///< Dropout source, needed when training with dropout > 0.
  bool return_weights = false;     ///< Also return the weights A (composed path).
  bool check_finite = true;        ///< Check inputs and scores for NaN/Inf (SdpaOptions::check_finite).
  /// Absolute positions of the T positions of X in MultiHeadAttention::forward(), shared by
  /// every sample of the batch: what RoPE rotates Q and K by, and what ALiBi and the config's
  /// sliding window measure distances in. Empty: 0 .. T-1. They need not increase: packed
  /// documents restart them per document (Hugging Face's position_ids), with
  /// Visibility::documents in `visibility` keeping each document to itself and causal
  /// (docs/attention.md, "Positions"). T entries, each >= 0: otherwise ShapeError / ValueError
  /// naming "positions". Only forward() takes them: forward_cached() numbers positions by its
  /// cache and CrossAttention has no positions; both refuse non-empty positions (ValueError).
  std::vector<Position> positions = {};
};

/// What an attention layer returns.
struct AttentionOutput {
  Tensor Y;        ///< The output [B, T, d_out].
  Tensor weights;      ///< A [B, H_q, T, S] if return_weights.
  Array dropout_mask;  ///< m / q [B, H_q, T, S] if dropout was applied (composed path).
  std::uint64_t dropout_seed = 0;  ///< Regenerates the mask on either path (SdpaResult).
  /// The attention implementation that ran (SdpaResult::path): composed or fused, never
  /// automatic. The config's `impl` picks it; automatic takes fused unless weights are requested.
  SdpaImpl path = SdpaImpl::composed;
};

/// Multi-head self-attention with any number of key/value heads (MHA, GQA, MQA).
class MultiHeadAttention : public Module {
 public:
  /// A layer configured by `cfg` with weights drawn from `gen` (Xavier-uniform, biases zero).
  /// ValueError if the head counts or widths do not fit.
  MultiHeadAttention(const AttentionConfig& cfg, Generator& gen);
  /// A layer configured by `cfg` from given `weights`, no generator: the parameters by name
  /// ("W_QKV" [d_model, (H_q + 2 H_kv) d_h], "b_QKV", "W_O" [H_q d_h, d_model], "b_O"; the
  /// biases only when cfg.bias), in cfg.dtype, checked as Module::set_weights checks them.
  MultiHeadAttention(const AttentionConfig& cfg, const std::vector<std::pair<std::string, Array>>& weights);

  /// X [B, T, d_model] -> Y [B, T, d_model], with the visibility, validity, dropout source and
  /// options in `call`. With positions p = call.positions (default 0 .. T-1): RoPE rotates by p,
  /// ALiBi is alibi(slopes, p, p), and a window W intersects call.visibility with
  /// sliding_window(p, p, W) (key j visible iff p_i - W < p_j <= p_i).
  AttentionOutput forward(const Tensor& X, const AttentionCall& call);
  /// forward(X, call) with only the visibility `vis` set; returns Y.
  Tensor operator()(const Tensor& X, const Visibility& vis);

  /// Incremental decoding: X_new [B, n, d_model] holds the next n positions (absolute
  /// positions cache.next_position() .. +n-1). Their K and V are appended to `cache` and the n
  /// queries attend causally by absolute position to every cached key (sliding-window causal
  /// when the config has a window; intersected with call.visibility, which must then be
  /// [.., n, S] with S the cache length after the append). A cache windowed more narrowly than
  /// the layer (or windowed for a layer without a window) is a ValueError. If the call throws,
  /// the cache is left as it was (a windowed cache may have dropped keys no query can see).
  AttentionOutput forward_cached(const Tensor& X_new, KVCache& cache, const AttentionCall& call = {});
  /// An empty KV cache for this layer: `batch` samples, room for `capacity` positions; with a
  /// window W in the config, KVCache::windowed with room for min(W, `capacity`) positions
  /// (it grows if more are appended, never past what the window needs).
  KVCache make_cache(std::size_t batch, std::size_t capacity) const;

  /// The configuration, with H_kv resolved (never 0).
  const AttentionConfig& config() const { return cfg_; }
  /// The head width d_h in use.
  std::size_t d_head() const { return d_h_; }
  /// The ALiBi bias for queries at `q_pos` over keys at `k_pos` with this layer's slopes
  /// (alibi_slopes(H_q)); Visibility::all() when cfg.alibi is false.
  Visibility position_bias(const std::vector<Position>& q_pos, const std::vector<Position>& k_pos) const;

  /// The projections an adapter can be attached to: the query, key and value column blocks
  /// of W_QKV (d_model -> H_q d_h, H_kv d_h, H_kv d_h) and the output projection W_O
  /// (H_q d_h -> d_model).
  enum class Projection {
    q,  ///< X W_Q: W_QKV's first H_q d_h columns.
    k,  ///< X W_K: the next H_kv d_h columns.
    v,  ///< X W_V: the last H_kv d_h columns.
    o   ///< C W_O, C the merged heads.
  };
  /// "q", "k", "v" or "o".
  static const char* projection_name(Projection p);
  /// Attaches `adapter` to projection `p` (nn/adapter.hpp): its term is added to that
  /// projection's output (before RoPE, as the term of a separate q_proj would be), in forward()
  /// and forward_cached(). Its parameters appear as `q.<name>` (`k.`, `v.`, `o.`), a LoRA's
  /// as `q.lora_A`. A null adapter or a second one on `p` is a ValueError, widths that are not
  /// the projection's a ShapeError, another dtype a DTypeError.
  void set_adapter(Projection p, std::unique_ptr<Adapter> adapter);
  /// The adapter attached to `p`, or null.
  Adapter* adapter(Projection p) const { return adapters_[static_cast<std::size_t>(p)].get(); }
  /// Detaches the adapter of `p` and returns it (null if none).
  std::unique_ptr<Adapter> remove_adapter(Projection p);
  /// Folds the adapter of `p` into its columns of W_QKV (or into W_O) and removes it; the
  /// weight keeps its requires_grad. ValueError if `p` has no adapter.
  void merge_adapter(Projection p);

  /// Parameters: W_QKV [d_model, (H_q + 2 H_kv) d_h] and b_QKV [(H_q + 2 H_kv) d_h], W_O
  /// [H_q d_h, d_model] and b_O [d_model]; the biases are undefined when cfg.bias is false. @{
  Tensor W_QKV, b_QKV, W_O, b_O;
  /// @}

 private:
  // P = X W_QKV + b_QKV plus the q, k and v adapters' terms in their columns.
  Tensor packed(const Tensor& X) const;
  // packed() as one nn::lora_affine op when every adapter on q, k, v is low-rank, else undefined.
  Tensor packed_low_rank(const Tensor& X, const Adapter* const a[3], const std::size_t widths[3]) const;
  // C W_O + b_O plus the o adapter's term.
  Tensor output(const Tensor& C) const;
  // The input and output widths of projection p.
  std::pair<std::size_t, std::size_t> projection_widths(Projection p) const;

  // Q [B, H_q, T, d_h], K, V [B, H_kv, T, d_h] from the packed projection P = X W_QKV + b_QKV.
  void split(const Tensor& P, Tensor& Q, Tensor& K, Tensor& V) const;
  AttentionOutput finish(const Tensor& Q, const Tensor& K, const Tensor& V, const Visibility& vis,
                         const AttentionCall& call);
  // O [B, H_q, T, d_h] of the registered core, its shape and dtype checked.
  Tensor registered_core(const Tensor& Q, const Tensor& K, const Tensor& V, const Visibility& vis,
                         const AttentionCall& call) const;
  // Whether forward_cached() of n new positions with the packed projection P (Q's dtype, and
  // whether Q needs gradients) may take the decoding step (decoding_step): one query, nothing
  // recorded for gradients, no weights, dropout, ALiBi, extra visibility or invalid queries, and
  // not forced onto the composed path.
  bool one_query_step(const AttentionCall& call, std::size_t n, const Tensor& P) const;
  // forward_cached() of one position per sample, P its packed projection, q_pos its position:
  // the heads read from P, attention on the cache in place (nn::attention_one_query).
  AttentionOutput decoding_step(const Tensor& P, KVCache& cache, const AttentionCall& call,
                                const std::vector<std::int64_t>& q_pos);

  void init(Generator* gen);  // registers the parameters: random from gen, or zeros

  AttentionConfig cfg_;
  std::size_t d_h_;
  std::vector<double> slopes_;  // ALiBi slopes when cfg_.alibi
  std::array<std::unique_ptr<Adapter>, 4> adapters_;  // by Projection
  AttentionFn core_;  // the registered core of cfg_.core, empty for the built-in one
};

/// Cross-attention: queries from one sequence, keys and values from another (the memory).
class CrossAttention : public Module {
 public:
  /// A layer configured by `cfg` with weights drawn from `gen` (Xavier-uniform, biases zero).
  /// ValueError if the head counts or widths do not fit.
  CrossAttention(const CrossAttentionConfig& cfg, Generator& gen);
  /// A layer configured by `cfg` from given `weights` by name ("W_Q", "b_Q", "W_KV" (K and V
  /// packed), "b_KV", "W_O", "b_O"), checked as Module::set_weights checks them.
  CrossAttention(const CrossAttentionConfig& cfg, const std::vector<std::pair<std::string, Array>>& weights);

  /// X_q [B, T, d_q], X_m [B, S, d_m] -> Y [B, T, d_out], with the visibility (source
  /// padding), validity, dropout source and options in `call`.
  AttentionOutput forward(const Tensor& X_q, const Tensor& X_m, const AttentionCall& call);
  /// The memory's K and V heads [B, H_kv, S, d_h] from X_m, computed once and reused while
  /// decoding.
  std::pair<Tensor, Tensor> project_memory(const Tensor& X_m) const;
  /// forward() with the memory's K and V heads `KV` from project_memory() instead of X_m.
  AttentionOutput forward_with_memory(const Tensor& X_q, const std::pair<Tensor, Tensor>& KV,
                                      const AttentionCall& call);

  /// The configuration, with H_kv and d_out resolved (never 0).
  const CrossAttentionConfig& config() const { return cfg_; }
  /// The head width d_h in use.
  std::size_t d_head() const { return d_h_; }

  /// Parameters: W_Q [d_q, H_q d_h] and b_Q, the packed W_KV [d_m, 2 H_kv d_h] (columns
  /// [K heads | V heads]) and b_KV, W_O [H_q d_h, d_out] and b_O; the biases are undefined
  /// when cfg.bias is false. @{
  Tensor W_Q, b_Q, W_KV, b_KV, W_O, b_O;
  /// @}

 private:
  void init(Generator* gen);

  CrossAttentionConfig cfg_;
  std::size_t d_h_;
};

/// [B, T, H d_h] -> [B, H, T, d_h]: X's features split into `H` heads (SPEC 6: heads split
/// features, not positions).
Tensor split_heads(const Tensor& X, std::size_t H);
/// [B, H, T, d_h] -> [B, T, H d_h]: the heads of `O` concatenated along the features.
Tensor merge_heads(const Tensor& O);

/// Checks per-call `positions` for an input of `T` positions: T entries (ShapeError) and none
/// negative (ValueError), both naming `op` and "positions".
void check_positions(const std::string& op, const std::vector<Position>& positions, std::size_t T);

}  // namespace xg::nn
