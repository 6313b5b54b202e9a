/// \file
/// KV-cache equivalence checker for any decoder (docs/gradcheck.md, "KV-cache checks for your
/// own decoder"). A decoder with a cache must give, for every position, the same output
/// whether the sequence arrives at once (prefill), in chunks, or one token at a time, and the
/// same as its full forward pass without a cache. The checker takes a decoder as three
/// functions -- the full forward, a factory of a fresh decoding state (the caches), and the
/// cached forward of the next positions -- runs several chunk schedules, and reports the
/// first schedule and position that differ, by how much, against a tolerance by dtype.
///
///   KVCacheReport r = check_kv_cache(kv_cache_decoder(
///       [&](const IndexArray& t) { return model.logits(t); },
///       [&] { return model.make_caches(B, T); },
///       [&](std::vector<nn::KVCache>& c, const IndexArray& t) { return model.logits_cached(t, c); }),
///       tokens);
///
/// In a gradcheck suite, XG_KVCACHE_CHECK or add_kv_cache_check register one as a row of the
/// table (kind "kv-cache").
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <xgrad/checks/suite.hpp>
#include <xgrad/core/array.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/tensor.hpp>

namespace xg {

/// What a decoder reads: token ids [B, T] or values [B, T, ...] (embeddings, features).
/// Axis 0 is the batch, axis 1 the position; the checker cuts it along axis 1.
class DecoderInput {
 public:
  DecoderInput() = default;  ///< No input (length 0): the checker refuses it.
  /// Token ids [B, T] (rank 2, ShapeError otherwise).
  DecoderInput(IndexArray tokens);  // NOLINT: implicit on purpose
  /// Values [B, T, ...] of rank >= 2 (ShapeError otherwise).
  DecoderInput(Array values);  // NOLINT: implicit on purpose

  /// Whether this holds token ids (else values).
  bool is_tokens() const { return is_tokens_; }
  /// The token ids; ValueError if this holds values.
  const IndexArray& tokens() const;
  /// The values; ValueError if this holds token ids.
  const Array& values() const;
  /// The shape [B, T] or [B, T, ...].
  Shape shape() const;
  /// B, the batch size (0 for an empty input).
  std::size_t batch() const;
  /// T, the number of positions (0 for an empty input).
  std::size_t length() const;
  /// Positions [begin, end) of every sample: [B, end - begin, ...]; ValueError unless
  /// begin < end <= length().
  DecoderInput slice(std::size_t begin, std::size_t end) const;

 private:
  bool is_tokens_ = true;
  IndexArray tokens_;
  Array values_;
};

/// A decoder under test, as three functions. The state is opaque to the checker: whatever the
/// decoder keeps between calls (one nn::KVCache per layer, a position counter, ...).
struct KVCacheDecoder {
  /// The full forward pass: input [B, T, ...] -> outputs [B, T, ...] (rank >= 2).
  std::function<Tensor(const DecoderInput& input)> forward;
  /// A fresh decoding state (nothing decoded yet); must not return null.
  std::function<std::shared_ptr<void>()> make_state;
  /// The next positions: `state` (from make_state) and `new_input` [B, n, ...] -> outputs
  /// [B, n, ...] for those n positions, advancing the state.
  std::function<Tensor(void* state, const DecoderInput& new_input)> forward_cached;
};

namespace detail {
template <class F, class... Pre>
Tensor call_with_decoder_input(F& f, const DecoderInput& in, Pre&... pre) {
  if constexpr (std::is_invocable_v<F&, Pre&..., const DecoderInput&>) {
    return f(pre..., in);
  } else if constexpr (std::is_invocable_v<F&, Pre&..., const IndexArray&>) {
    return f(pre..., in.tokens());
  } else {
    static_assert(std::is_invocable_v<F&, Pre&..., const Array&>,
                  "kv_cache_decoder: the functions must take the input as const DecoderInput&, "
                  "const IndexArray& (token ids) or const Array& (values)");
    return f(pre..., in.values());
  }
}
}  // namespace detail

/// A KVCacheDecoder from three callables with a typed state:
///   forward(input) -> Tensor,  make_state() -> State,  cached(State&, new_input) -> Tensor,
/// where input is taken as `const IndexArray&` (token ids), `const Array&` (values) or
/// `const DecoderInput&`. State is whatever make_state returns (moved into the checker).
template <class Forward, class MakeState, class Cached>
KVCacheDecoder kv_cache_decoder(Forward forward, MakeState make_state, Cached cached) {
  using State = std::decay_t<decltype(make_state())>;
  KVCacheDecoder d;
  d.forward = [forward](const DecoderInput& in) mutable -> Tensor {
    return detail::call_with_decoder_input(forward, in);
  };
  d.make_state = [make_state]() mutable -> std::shared_ptr<void> { return std::make_shared<State>(make_state()); };
  d.forward_cached = [cached](void* state, const DecoderInput& in) mutable -> Tensor {
    return detail::call_with_decoder_input(cached, in, *static_cast<State*>(state));
  };
  return d;
}

/// One way to feed the sequence to the cached forward: chunk sizes that sum to T.
struct KVSchedule {
  std::string name;                 ///< e.g. "token by token", "chunks 1,2,3".
  std::vector<std::size_t> chunks;  ///< Positive sizes summing to T.
};

/// The schedules the checker runs when none are given, for T positions (duplicates dropped):
/// "prefill" {T}; "token by token" {1, ..., 1}; "chunks 1,2,3" (cycling, the last one cut);
/// "uneven split" {T - T/3, T/3}; "prefill then decode" {T - k, 1 x k}, k = min(3, T - 1).
std::vector<KVSchedule> default_kv_schedules(std::size_t T);

/// What to run and how strictly to compare.
struct KVCacheCheckOptions {
  /// The schedules; empty means default_kv_schedules(T). Each must sum to T with no zero
  /// chunk (ValueError).
  std::vector<KVSchedule> schedules;
  /// Also check that the full forward is causal: outputs before position p = T / 2 do not
  /// change when every input from p on changes (token ids are swapped for other ids of the
  /// input, values get 1 added). Turn off for a decoder that is not causal.
  bool prefix_isolation = true;
  /// Pass when |cached - full| <= atol + rtol * max |full| at every element. Negative means by
  /// the output's dtype: rtol 1e-10, atol 1e-12 in float64; rtol 1e-4, atol 1e-6 in float32
  /// (a cached path may sum in another order; any cache bug is orders of magnitude larger).
  double rtol = -1;
  double atol = -1;  ///< See rtol.
};

/// The comparison of one schedule (or of the prefix-isolation run) with the full forward.
struct KVComparison {
  std::string name;                 ///< The schedule's name, or "prefix isolation".
  std::vector<std::size_t> chunks;  ///< The schedule's chunks (empty for prefix isolation).
  bool passed = false;              ///< No element differs by more than the tolerance.
  double max_abs_diff = 0;          ///< Largest |difference| (NaN counts as infinite).
  std::string worst;                ///< Where it is largest: "out[b, t, ...]".
  /// The first position (in order) whose largest difference exceeds the tolerance, and that
  /// difference; position is npos when the comparison passed.
  std::size_t first_bad_position = npos;
  double first_bad_diff = 0;  ///< See first_bad_position.
  /// The chunk (0-based) holding first_bad_position, and its positions [chunk_begin, chunk_end).
  /// @{
  std::size_t bad_chunk = 0, chunk_begin = 0, chunk_end = 0;
  /// @}
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);  ///< "no position".
};

/// The result of check_kv_cache.
struct KVCacheReport {
  bool passed = false;                   ///< Every comparison passed.
  Shape output_shape;                    ///< The full forward's output shape [B, T, ...].
  DType dtype = DType::float64;          ///< The full forward's output dtype.
  double scale = 0;                      ///< max |full forward output|.
  double tolerance = 0;                  ///< atol + rtol * scale.
  std::vector<KVComparison> comparisons;  ///< Each schedule in order, then prefix isolation.
  /// Empty when passed; otherwise the first failing comparison in one line, e.g.
  /// `KV cache: schedule "token by token" [1, 1, 1, 1]: position 2 (chunk 2, positions 2..2)
  /// differs from the full forward by 3.1e-01 > tolerance 1.2e-10 (largest at out[0, 3, 1])`.
  std::string message;
  /// One line: "KV cache: N schedules and prefix isolation agree with the full forward ..." or
  /// the message.
  std::string summary() const;
};

/// Runs the full forward once, then every schedule through a fresh state, and compares the
/// outputs position by position (and prefix isolation when asked). A mismatch is reported in
/// the result, not thrown. Bad input throws: T == 0 or B == 0 or a bad schedule (ValueError),
/// a missing function or a null state (ValueError), a full output that is not [B, T, ...] or a
/// cached output that is not [B, n, ...] with the full output's trailing shape (ShapeError,
/// naming the schedule and chunk), a dtype that differs from the full output's (DTypeError).
KVCacheReport check_kv_cache(const KVCacheDecoder& decoder, const DecoderInput& input,
                             const KVCacheCheckOptions& options = {});

/// A KV cache that does not match the full forward (require_kv_cache_equivalence).
class KVCacheMismatch : public ValueError {
 public:
  /// The report and its message as what().
  explicit KVCacheMismatch(KVCacheReport report)
      : ValueError(report.message), report_(std::move(report)) {}
  /// The failing report.
  const KVCacheReport& report() const { return report_; }

 private:
  KVCacheReport report_;
};

/// check_kv_cache, throwing KVCacheMismatch when a comparison fails; returns the report.
KVCacheReport require_kv_cache_equivalence(const KVCacheDecoder& decoder, const DecoderInput& input,
                                           const KVCacheCheckOptions& options = {});

/// A report as one row of a gradcheck table (mode "property"; the error is the largest
/// difference, the worst element names the schedule, the message is the report's).
CheckResult to_check_result(const KVCacheReport& report);

/// Everything a suite row needs: the decoder, the input and the options.
struct KVCacheCheck {
  KVCacheDecoder decoder;        ///< The decoder under test.
  DecoderInput input;            ///< The sequence to decode.
  KVCacheCheckOptions options;   ///< Schedules and tolerances.
};

/// Registers a KV-cache check in `suite` (kind "kv-cache"): `make(ctx)` builds the decoder and
/// its input (ctx gives the run's dtype and generator), the row is check_kv_cache's verdict.
GradcheckSuite& add_kv_cache_check(GradcheckSuite& suite, const std::string& name, const std::string& config,
                                   std::function<KVCacheCheck(CheckContext&)> make);

namespace detail {
/// XG_KVCACHE_CHECK's registration into default_gradcheck_suite().
bool register_default_kv_cache_check(const char* name, const char* config, KVCacheCheck (*fn)(CheckContext&));
}  // namespace detail

}  // namespace xg

/// Registers a KV-cache check in default_gradcheck_suite() at program start, like
/// XG_GRADCHECK; the body gets `xg::CheckContext& ctx` and returns an xg::KVCacheCheck:
///
///   XG_KVCACHE_CHECK("my_decoder/kv-cache", "1 layer, d 8, tokens (2, 7)") {
///     auto model = std::make_shared<MyDecoder>(ctx.gen(), ctx.dtype());
///     return xg::KVCacheCheck{xg::kv_cache_decoder(...), tokens, {}};
///   }
#define XG_KVCACHE_CHECK(name, config)                                                                        \
  static ::xg::KVCacheCheck XG_GRADCHECK_CAT(xg_kvcache_fn_, __LINE__)(::xg::CheckContext & ctx);            \
  [[maybe_unused]] static const bool XG_GRADCHECK_CAT(xg_kvcache_registered_, __LINE__) =                    \
      ::xg::detail::register_default_kv_cache_check(name, config, &XG_GRADCHECK_CAT(xg_kvcache_fn_, __LINE__)); \
  static ::xg::KVCacheCheck XG_GRADCHECK_CAT(xg_kvcache_fn_, __LINE__)([[maybe_unused]] ::xg::CheckContext & ctx)
