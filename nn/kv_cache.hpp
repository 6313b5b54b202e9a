/// \file
/// KV cache for incremental decoding, one per attention layer (SPEC 11, (5.36); its size is
/// the text after (5.36)). Holds the projected keys and values of every position seen so far,
/// [B, H_kv, length, d], and their absolute positions 0 .. length-1. Per sample it stores
/// 2 * S * H_kv * d_h elements. Values only: the cache is for inference and records nothing
/// on any tape.
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

  std::size_t length() const { return length_; }      ///< Positions held now.
  /// The absolute position the next appended key takes (length() while no position has been
  /// dropped). Decoding code uses this, never length(), as the position of the next token.
  std::size_t next_position() const { return length_; }
  std::size_t capacity() const { return capacity_; }  ///< Positions it has room for.
  /// Bytes held at full capacity: 2 * B * capacity * H_kv * d * sizeof(dtype) (for d_k == d_v).
  std::size_t bytes() const;

  /// Appends n positions: K_new [B, H_kv, n, d_k], V_new [B, H_kv, n, d_v]. They take the
  /// absolute positions length() .. length()+n-1. Going past capacity is a ValueError; a wrong
  /// shape a ShapeError, a wrong dtype a DTypeError.
  void append(const Array& K_new, const Array& V_new);

  Array keys() const;    ///< The cached keys [B, H_kv, length, d_k].
  Array values() const;  ///< The cached values [B, H_kv, length, d_v].
  std::vector<std::int64_t> positions() const;  ///< Their absolute positions 0 .. length-1.
  /// Forgets every position (length 0; the storage is kept).
  void clear() { length_ = 0; }
  /// Forgets every position from `length` on (undoing an append); ValueError if length > length().
  void truncate(std::size_t length);

 private:
  std::size_t B_, H_kv_, capacity_, d_k_, d_v_;
  DType dtype_;
  std::size_t length_ = 0;
  Array K_, V_;  // [B, H_kv, capacity, d]
};

}  // namespace xg::nn
