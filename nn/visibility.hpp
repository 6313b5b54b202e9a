/// \file
/// Visibility: which keys each query may attend to (SPEC 3, (5.11)-(5.12)).
///
/// Boolean masks have no universal polarity (PyTorch's SDPA takes true = allowed, its
/// nn.MultiheadAttention true = forbidden), so xgrad never takes a bare bool array and
/// guesses: each constructor says what its input means, and everything is converted once,
/// here, to the internal convention "allowed" (true = the query may see the key), plus an
/// optional finite additive bias (a soft bias, not a prohibition).
///
/// Shapes: a Visibility is rank 4, [B or 1, H or 1, T, S], broadcast against the scores
/// [B, H_q, T, S]. Constructors that take [T, S], [B, T, S] or [B, S] insert the missing axes
/// (a [B, T, S] mask applies to every head).
///
/// Integers: positions, lengths and sizes are std::int64_t (Position) throughout, as document
/// ids and token ids are; a negative one is a ValueError.
/// Positions are ABSOLUTE: causal(q_pos, k_pos) allows key j for query i iff
/// k_pos[j] <= q_pos[i], so a suffix of queries over a cached prefix is bottom-right aligned.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/core/array.hpp>

namespace xg::nn {

/// Positions, lengths and sizes in the Visibility constructors.
using Position = std::int64_t;

namespace vis_detail {
struct VisRule;
struct VisCache;
}  // namespace vis_detail

class VisibilityPlan;

/// Which keys each query may see, with an optional soft bias; built by named constructors
/// that each state their polarity, combined with operator&.
class Visibility {
 public:
  Visibility() = default;  ///< Every key visible (as all()).
  /// Every key visible to every query (no constraint).
  static Visibility all();
  /// m[.., i, j] true = query i MAY see key j. m is [T, S], [B|1, T, S] (every head) or
  /// [B|1, H|1, T, S].
  static Visibility allowed(const BoolArray& m);
  /// m[.., i, j] true = query i must NOT see key j. Shapes as allowed().
  static Visibility forbidden(const BoolArray& m);
  /// Additive float bias M (5.11): 0 allowed, -inf forbidden, finite = soft bias (allowed).
  /// Shapes as allowed(). NaN and +inf are errors.
  static Visibility additive(const Array& bias);
  /// Causal by absolute positions (5.12): key j visible to query i iff k_pos[j] <= q_pos[i].
  static Visibility causal(const std::vector<Position>& q_pos, const std::vector<Position>& k_pos);
  /// Causal for T queries that are the LAST T of S positions (keys at 0..S-1, queries at
  /// S-T..S-1): bottom-right aligned. T == S is the usual square causal mask. T > S is an error.
  static Visibility causal(Position T, Position S);
  /// Sliding-window causal by absolute positions: key j visible to query i iff
  /// q_pos[i] - W < k_pos[j] <= q_pos[i], i.e. the query sees its own position and the W - 1
  /// positions before it. W = 1: only itself; W >= the sequence length: plain causal.
  /// W < 1 is a ValueError naming W. (FlashAttention window_size = (W - 1, 0); docs/attention.md.)
  static Visibility sliding_window(const std::vector<Position>& q_pos, const std::vector<Position>& k_pos,
                                   Position W);
  /// Sliding-window causal for T queries that are the LAST T of S positions (keys at
  /// 0 .. S-1, queries at S-T .. S-1), aligned as causal(T, S). T > S is an error.
  static Visibility sliding_window(Position T, Position S, Position W);
  /// Key padding (SPEC 3.5): sample b has lengths[b] real keys (0 .. lengths[b]-1); the rest
  /// are padding, hidden from every query and head. Shape [B, 1, 1, S].
  static Visibility key_lengths(const std::vector<Position>& lengths, Position S);
  /// Key padding from a [B, S] mask `valid`: true = a real key.
  static Visibility valid_keys(const BoolArray& valid);
  /// Key padding from a [B, S] mask `padding`: true = padding (hidden).
  static Visibility padded_keys(const BoolArray& padding);
  /// Packed documents (SPEC 3.7): query i sees key j iff doc[i] == doc[j] and, when causal,
  /// j <= i (block-diagonal, causal inside each document; bidirectional inside each document
  /// with causal = false). doc_ids is [T] (shared by the batch) or [B, T]; T == S. Separator
  /// tokens isolate nothing; only this mask does.
  static Visibility documents(const IndexArray& doc_ids, bool causal = true);
  /// Packed documents, general form: queries and keys carry their own document ids and
  /// absolute positions, so T != S works, e.g. a suffix of queries over a cached packed prefix.
  /// Query i sees key j iff k_doc[.., j] == q_doc[.., i] and, when causal, k_pos[j] <= q_pos[i].
  /// q_doc is [T] or [B, T], k_doc [S] or [B, S] (batch sizes equal when both have one);
  /// q_pos has T entries, k_pos S. Disagreeing sizes are a ShapeError naming the rule.
  static Visibility documents(const IndexArray& q_doc, const IndexArray& k_doc, const std::vector<Position>& q_pos,
                              const std::vector<Position>& k_pos, bool causal = true);
  /// ALiBi (Press et al. 2022): a soft bias by absolute position, hiding no key. Head h adds
  /// -slopes[h] * |q_pos[i] - k_pos[j]| to the score of query i and key j: for causal use
  /// (k_pos <= q_pos) that is the paper's -m_h (i - j); for keys after the query
  /// (bidirectional use) the same distance penalty, mirrored ("symmetric ALiBi").
  /// Shape [1, H, T, S] with H = slopes.size(); combine with causal() etc. by operator&.
  /// Slopes must be finite and >= 0 (ValueError); no slopes is a ValueError.
  static Visibility alibi(const std::vector<double>& slopes, const std::vector<Position>& q_pos,
                          const std::vector<Position>& k_pos);

  /// Streaming source (SPEC 8): which source positions exist yet. `arrival`[b, j] is the time
  /// step at which source position j of sample b becomes available, `query_time`[b, i] the
  /// time step at which query i of sample b is computed; query i sees key j iff
  /// arrival[b, j] <= query_time[b, i] (a position that arrives at the query's own step is
  /// visible). arrival is [S] or [B, S], query_time [T] or [B, T] (batch sizes equal when both
  /// have one); times are >= 0 (ValueError), other shapes are a ShapeError, both naming
  /// available(arrival, query_time). Shape [B, 1, T, S]; intersect it with padding and other
  /// rules by operator&. A valid query with no source position yet is an empty row (SPEC 3.8):
  /// mark it invalid.
  static Visibility available(const IndexArray& arrival, const IndexArray& query_time);

  /// Intersection of the allowed sets of this and `other` (SPEC 3.4); soft biases add. The
  /// shapes must broadcast (ShapeError).
  Visibility operator&(const Visibility& other) const;

  /// \name Internal convention, used by the attention core
  /// A Visibility is a list of rules (positions, key lengths, document ids, a dense mask, a
  /// soft bias), kept as rules: nothing is expanded to [B, H, T, S] unless asked for. The
  /// allowed set is the intersection of the rules' sets; the soft bias is the sum of theirs.
  /// @{

  /// Whether there is no rule at all (every key visible, no bias).
  bool unconstrained() const { return rules_.empty(); }
  /// Broadcast shape of this visibility (rank 4); {1,1,1,1} when unconstrained.
  Shape shape() const;
  /// Additive bias (0 / -inf / soft) with this visibility's own rank-4 shape, in `dtype`. Built
  /// once per dtype and cached (copies of a Visibility share the cache).
  Array bias(DType dtype) const;
  /// allowed[b, h, i, j] for the full score shape `BHTS` [B, H, T, S] (0/1 bytes). Throws
  /// ShapeError naming `op` if this visibility does not broadcast to it.
  std::vector<unsigned char> expand_allowed(const std::string& op, const Shape& BHTS) const;
  /// Row-by-row access for kernels that never materialise the scores (the fused attention
  /// path). Throws ShapeError naming `op` if this visibility does not broadcast to `BHTS`.
  VisibilityPlan plan(const std::string& op, const Shape& BHTS) const;
  /// @}

 private:
  explicit Visibility(std::shared_ptr<const vis_detail::VisRule> rule);
  std::vector<std::shared_ptr<const vis_detail::VisRule>> rules_;
  std::shared_ptr<vis_detail::VisCache> cache_;  // set whenever rules_ is non-empty
};

/// A Visibility bound to a score shape [B, H, T, S], read one query row at a time. Cheap to
/// copy; immutable; safe to use from several threads.
class VisibilityPlan {
 public:
  /// Keys that query (b, h, i) may see all lie in [lo, hi) (lo == hi: none); `lo` and `hi` are
  /// written. Returns true when every key in that range is allowed and no soft bias applies to
  /// the row: apply() would then change nothing.
  bool range(std::size_t b, std::size_t h, std::size_t i, std::size_t& lo, std::size_t& hi) const;
  /// Applies the visibility to the float32 scores `row` of query (b, h, i) for keys lo .. hi-1
  /// (row[0] is key lo): forbidden keys become -inf, soft biases are added.
  void apply(std::size_t b, std::size_t h, std::size_t i, std::size_t lo, std::size_t hi, float* row) const;
  /// The same for float64 scores.
  void apply(std::size_t b, std::size_t h, std::size_t i, std::size_t lo, std::size_t hi, double* row) const;
  /// Whether any rule is a soft bias (finite values added to the scores) rather than a hard
  /// allowed/forbidden rule.
  bool has_soft() const;
  /// Whether no rule depends on the head (each broadcasts over H): range() and apply() then
  /// give every head of a (b, i) row the same answer.
  bool head_independent() const;
  /// The score shape [B, H, T, S] this plan is bound to.
  const Shape& shape() const { return BHTS_; }

 private:
  friend class Visibility;
  std::vector<std::shared_ptr<const vis_detail::VisRule>> rules_;
  Shape BHTS_;
};

/// The standard ALiBi head slopes for `H` heads (Press et al. 2022, their reference code):
/// for H a power of two, slope_h = 2^(-8 (h+1) / H), h = 0 .. H-1; otherwise, with n the
/// largest power of two below H, the n slopes of n heads followed by the slopes 0, 2, 4, ..
/// (every other one) of 2n heads, H - n of them. ValueError for H = 0.
std::vector<double> alibi_slopes(std::size_t H);

/// Query validity flags b_i (SPEC 3.8, Algorithm 5.1): true = a real query, false = padding.
/// An invalid query's output row is exactly zero and it sends zero gradient everywhere.
/// Returns [B, T] flags: sample b has `lengths`[b] real queries out of `T`.
BoolArray valid_queries_from_lengths(const std::vector<Position>& lengths, Position T);

}  // namespace xg::nn
