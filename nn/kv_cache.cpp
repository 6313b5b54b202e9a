#include <xgrad/nn/kv_cache.hpp>

#include <algorithm>
#include <cstring>

#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/storage.hpp>

namespace xg::nn {

namespace {
const char* kOp = "kv_cache";

// Copies rows [0, n) of src [B, H, n, d] into rows [at, at+n) of dst [B, H, cap, d], or
// (reverse) rows [0, n) of the cache into a fresh [B, H, n, d].
void copy_block(const Array& src, std::size_t src_len, std::size_t src_at, Array& dst, std::size_t dst_len,
                std::size_t dst_at, std::size_t n, std::size_t BH, std::size_t d) {
  if (n == 0 || BH == 0 || d == 0) return;  // nothing to copy (buffers may be null)
  detail::dispatch(src.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* ps = src.data<T>();
    T* pd = dst.data<T>();
    for (std::size_t bh = 0; bh < BH; ++bh)
      std::memcpy(pd + (bh * dst_len + dst_at) * d, ps + (bh * src_len + src_at) * d, n * d * sizeof(T));
  });
}
// Moves rows [drop, drop+keep) of every (b, h) of the cache buffer a [B, H, cap, d] down to
// rows [0, keep) (ranges may overlap).
void move_down(Array& a, std::size_t drop, std::size_t keep, std::size_t d) {
  const Shape& s = a.shape();
  const std::size_t BH = s[0] * s[1], cap = s[2];
  if (keep == 0 || BH == 0 || d == 0) return;
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    T* p = a.data<T>();
    for (std::size_t bh = 0; bh < BH; ++bh) std::memmove(p + bh * cap * d, p + (bh * cap + drop) * d, keep * d * sizeof(T));
  });
}
}  // namespace

KVCache::KVCache(std::size_t batch, std::size_t H_kv, std::size_t capacity, std::size_t d_k, std::size_t d_v,
                 DType dtype)
    : B_(batch), H_kv_(H_kv), capacity_(capacity), d_k_(d_k), d_v_(d_v), dtype_(dtype),
      K_(Array::zeros({batch, H_kv, capacity, d_k}, dtype)),
      V_(Array::zeros({batch, H_kv, capacity, d_v}, dtype)) {
  if (dtype == DType::float32)
    Kt_ = Array::zeros({batch, H_kv, (capacity + kColumnTile - 1) / kColumnTile, d_k, kColumnTile}, dtype);
}

KVCache KVCache::windowed(std::size_t batch, std::size_t H_kv, std::size_t window, std::size_t d_k, std::size_t d_v,
                          DType dtype, std::size_t capacity) {
  if (window == 0)
    throw ValueError(op_message(kOp, "windowed: the window W must be >= 1, got W = 0 (use the plain KVCache for no window)"));
  KVCache c(batch, H_kv, capacity > 0 ? std::min(window, capacity) : window, d_k, d_v, dtype);
  c.window_ = window;
  c.Kt_ = Array();  // a window moves keys down: the decoding step transposes its tiles itself
  return c;
}

std::size_t KVCache::bytes() const {
  return (K_.size() + V_.size() + (Kt_.defined() ? Kt_.size() : 0)) * (dtype_ == DType::float32 ? 4 : 8);
}

void KVCache::append(const Array& K_new, const Array& V_new) {
  const Shape& ks = K_new.shape();
  const Shape& vs = V_new.shape();
  if (ks.size() != 4 || ks[0] != B_ || ks[1] != H_kv_ || ks[3] != d_k_ || vs.size() != 4 || vs[0] != B_ ||
      vs[1] != H_kv_ || vs[3] != d_v_ || vs[2] != ks[2])
    throw ShapeError(op_message(kOp, "append expects K [" + std::to_string(B_) + ", " + std::to_string(H_kv_) +
                                         ", n, " + std::to_string(d_k_) + "] and V [.., n, " + std::to_string(d_v_) +
                                         "], got K " + shape_str(ks) + ", V " + shape_str(vs)));
  if (K_new.dtype() != dtype_ || V_new.dtype() != dtype_)
    throw DTypeError(op_message(kOp, std::string("cache holds ") + dtype_name(dtype_) + ", got K " +
                                         dtype_name(K_new.dtype()) + ", V " + dtype_name(V_new.dtype())));
  const std::size_t n = ks[2];
  if (window_ > 0) {
    // Drop the keys no query at next_position() or later can see: keep the last W - 1.
    const std::size_t keep = std::min(length_, window_ - 1), drop = length_ - keep;
    if (drop > 0) {
      move_down(K_, drop, keep, d_k_);
      move_down(V_, drop, keep, d_v_);
      first_ += drop;
      length_ = keep;
    }
    if (length_ + n > capacity_) {
      // Out of room: at least what this append needs, doubling (amortised growth when the
      // storage started below the window) up to W - 1 + n, all a query of this chunk can see.
      const std::size_t cap = std::max(length_ + n, std::min(2 * capacity_, window_ - 1 + n));
      Array K = Array::zeros({B_, H_kv_, cap, d_k_}, dtype_), V = Array::zeros({B_, H_kv_, cap, d_v_}, dtype_);
      copy_block(K_, capacity_, 0, K, cap, 0, length_, B_ * H_kv_, d_k_);
      copy_block(V_, capacity_, 0, V, cap, 0, length_, B_ * H_kv_, d_v_);
      K_ = K;
      V_ = V;
      capacity_ = cap;
    }
  }
  if (length_ + n > capacity_)
    throw ValueError(op_message(kOp, "overflow: appending " + std::to_string(n) + " position(s) to " +
                                         std::to_string(length_) + " cached would exceed the capacity of " +
                                         std::to_string(capacity_)));
  copy_block(K_new, n, 0, K_, capacity_, length_, n, B_ * H_kv_, d_k_);
  copy_block(V_new, n, 0, V_, capacity_, length_, n, B_ * H_kv_, d_v_);
  if (Kt_.defined() && n > 0) {  // feature c of new key t (slot s = length_ + t) into tile s / T, row c, column s % T
    const float* k = K_new.data<float>();
    float* kt = Kt_.data<float>();
    const std::size_t T = kColumnTile, tiles = Kt_.shape()[2];
    for (std::size_t bh = 0; bh < B_ * H_kv_; ++bh)
      for (std::size_t t = 0; t < n; ++t) {
        const std::size_t s = length_ + t;
        float* col = kt + ((bh * tiles + s / T) * d_k_) * T + s % T;
        for (std::size_t c = 0; c < d_k_; ++c) col[c * T] = k[(bh * n + t) * d_k_ + c];
      }
  }
  length_ += n;
}

void KVCache::truncate(std::size_t position) {
  if (position > next_position())
    throw ValueError(op_message(kOp, "cannot truncate to position " + std::to_string(position) +
                                         ": the next position is " + std::to_string(next_position())));
  // A query at `position` sees keys from position - (W - 1) on (from 0 without a window).
  const std::size_t needed = window_ > 0 && position >= window_ - 1 ? position - (window_ - 1) : 0;
  if (needed < first_)
    throw ValueError(op_message(kOp, "cannot truncate to position " + std::to_string(position) + ": the key at " +
                                         std::to_string(needed) + " was dropped (window " + std::to_string(window_) +
                                         ", keys held from " + std::to_string(first_) + ")"));
  length_ = position - first_;
}

Array KVCache::keys() const {
  Array out = Array::empty({B_, H_kv_, length_, d_k_}, dtype_);
  copy_block(K_, capacity_, 0, out, length_, 0, length_, B_ * H_kv_, d_k_);
  return out;
}

Array KVCache::values() const {
  Array out = Array::empty({B_, H_kv_, length_, d_v_}, dtype_);
  copy_block(V_, capacity_, 0, out, length_, 0, length_, B_ * H_kv_, d_v_);
  return out;
}

std::vector<std::int64_t> KVCache::positions() const {
  std::vector<std::int64_t> p(length_);
  for (std::size_t i = 0; i < length_; ++i) p[i] = static_cast<std::int64_t>(first_ + i);
  return p;
}

}  // namespace xg::nn
