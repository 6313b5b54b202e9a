#include <xgrad/nn/kv_cache.hpp>

#include <cstring>

#include <xgrad/core/error.hpp>
#include <xgrad/core/xt.hpp>

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
}  // namespace

KVCache::KVCache(std::size_t batch, std::size_t H_kv, std::size_t capacity, std::size_t d_k, std::size_t d_v,
                 DType dtype)
    : B_(batch), H_kv_(H_kv), capacity_(capacity), d_k_(d_k), d_v_(d_v), dtype_(dtype),
      K_(Array::zeros({batch, H_kv, capacity, d_k}, dtype)),
      V_(Array::zeros({batch, H_kv, capacity, d_v}, dtype)) {}

std::size_t KVCache::bytes() const { return (K_.size() + V_.size()) * (dtype_ == DType::float32 ? 4 : 8); }

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
  if (length_ + n > capacity_)
    throw ValueError(op_message(kOp, "overflow: appending " + std::to_string(n) + " position(s) to " +
                                         std::to_string(length_) + " cached would exceed the capacity of " +
                                         std::to_string(capacity_)));
  copy_block(K_new, n, 0, K_, capacity_, length_, n, B_ * H_kv_, d_k_);
  copy_block(V_new, n, 0, V_, capacity_, length_, n, B_ * H_kv_, d_v_);
  length_ += n;
}

void KVCache::truncate(std::size_t length) {
  if (length > length_)
    throw ValueError(op_message(kOp, "cannot truncate to " + std::to_string(length) + " positions: only " +
                                         std::to_string(length_) + " are cached"));
  length_ = length;
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
  for (std::size_t i = 0; i < length_; ++i) p[i] = static_cast<std::int64_t>(i);
  return p;
}

}  // namespace xg::nn
