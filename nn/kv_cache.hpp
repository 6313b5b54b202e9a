/// \file
/// KV cache for incremental decoding, one per attention layer (SPEC 11, (5.36); its size is
/// the text after (5.36)). Holds the projected keys and values of every position seen so far,
/// [B, H_kv, length, d], and their absolute positions 0 .. length-1. Per sample it stores
/// 2 * S * H_kv * d_h elements. Values only: the cache is for inference and records nothing
/// on any tape.
///
/// A windowed cache (KVCache::windowed, for sliding-window attention of window W) keeps only
/// the keys a query at next_position() or later can still see: the last W - 1 positions, plus
/// the n positions of the latest append (a query inside that chunk sees earlier keys of the
/// same chunk). Keys older than that are dropped at the start of the next append, so the
/// positions held are a contiguous run first_position() .. next_position()-1 of at most
/// W - 1 + n entries, whatever the length of the sequence.
#pragma once

#include <cstdint>
#include <vector>

#include <xgrad/core/array.hpp>

namespace xg::nn {

/// The keys and values of the positions decoded so far, for one attention layer.
class KVCache {
 public:
  /// An empty cache for `batch` samples and `H_kv` key/value heads with room for `capacity`
  /// positions; keys of width `d_k`, values of width `d_v`, in `dtype` (allocated up front).
  KVCache(std::size_t batch, std::size_t H_kv, std::size_t capacity, std::size_t d_k, std::size_t d_v,
          DType dtype);
  /// A cache for sliding-window attention of window `window` (>= 1; ValueError naming it
  /// otherwise) that drops keys no later query can see (see the file comment). Its storage
  /// starts at min(`window`, `capacity`) positions (`capacity` 0: `window`, enough for
  /// decoding one token at a time; a caller that knows how many positions it will append
  /// passes that, so a window far longer than the sequence costs nothing) and grows when an
  /// append needs more room, doubling up to W - 1 + n for a chunk of n positions; there is no
  /// limit on the total number of positions.
  static KVCache windowed(std::size_t batch, std::size_t H_kv, std::size_t window, std::size_t d_k, std::size_t d_v,
                          DType dtype, std::size_t capacity = 0);

  std::size_t length() const { return length_; }      ///< Positions held now.
  /// The absolute position the next appended key takes (length() while no position has been
  /// dropped). Decoding code uses this, never length(), as the position of the next token.
  std::size_t next_position() const { return first_ + length_; }
  /// The absolute position of the first key held (0 until a windowed cache drops keys).
  std::size_t first_position() const { return first_; }
  /// The window W of a windowed cache; 0 for a cache that keeps every position.
  std::size_t window() const { return window_; }
  /// Positions it has room for now (a windowed cache grows it for large chunks).
  std::size_t capacity() const { return capacity_; }
  /// Bytes held at full capacity: 2 * B * capacity * H_kv * d * sizeof(dtype) (for d_k == d_v),
  /// plus B * H_kv * d_k * kColumnTile * ceil(capacity / kColumnTile) * 4 for key_columns() where
  /// it is kept.
  std::size_t bytes() const;

  /// Appends n positions: K_new [B, H_kv, n, d_k], V_new [B, H_kv, n, d_v]. They take the
  /// absolute positions next_position() .. next_position()+n-1. Going past capacity is a
  /// ValueError (a windowed cache first drops the keys older than its last W - 1 and grows
  /// instead); a wrong shape a ShapeError, a wrong dtype a DTypeError.
  void append(const Array& K_new, const Array& V_new);

  Array keys() const;    ///< The cached keys [B, H_kv, length, d_k].
  Array values() const;  ///< The cached values [B, H_kv, length, d_v].
  /// Their absolute positions first_position() .. next_position()-1 (0 .. length-1 unless a
  /// windowed cache dropped keys).
  std::vector<std::int64_t> positions() const;
  /// The storage itself, [B, H_kv, capacity(), d_k] and [.., d_v]: slots 0 .. length()-1 hold
  /// the positions first_position() .. next_position()-1, the rest is unused. For reading the
  /// keys in place (nn::attention_one_query); valid until the next append or truncate. @{
  const Array& key_buffer() const { return K_; }
  const Array& value_buffer() const { return V_; }
  /// @}
  /// The keys again, transposed tile by tile, [B, H_kv, tiles, d_k, kColumnTile] with tiles =
  /// ceil(capacity() / kColumnTile): element (b, h, s / kColumnTile, c, s % kColumnTile) is
  /// feature c of slot s, so that one tile of K^T (d_k rows of kColumnTile slots) is contiguous.
  /// Kept only by a float32 cache without a window (an undefined Array otherwise, see
  /// Array::defined()), written as keys are appended, so that the decoding step reads its tiles
  /// of K^T in place instead of transposing every key on every step (nn::attention_one_query).
  /// Slots from length() on hold zeros or keys undone by truncate(). Valid until the next append
  /// or truncate.
  const Array& key_columns() const { return Kt_; }
  /// Slots per tile of key_columns(): the fused attention's tile of keys.
  static constexpr std::size_t kColumnTile = 64;
  /// Forgets every position (length 0, next position 0; the storage is kept).
  void clear() {
    length_ = 0;
    first_ = 0;
  }
  /// Forgets every position from the absolute position `position` on (undoing an append), so
  /// that next_position() == position. ValueError if position > next_position(), or if a
  /// windowed cache already dropped a key a query at `position` would see.
  void truncate(std::size_t position);

 private:
  std::size_t B_, H_kv_, capacity_, d_k_, d_v_;
  DType dtype_;
  std::size_t length_ = 0;
  std::size_t first_ = 0;   // absolute position of slot 0
  std::size_t window_ = 0;  // 0: keeps every position
  Array K_, V_;  // [B, H_kv, capacity, d]
  Array Kt_;     // [B, H_kv, tiles, d_k, kColumnTile] (key_columns()), or undefined
};

}  // namespace xg::nn
