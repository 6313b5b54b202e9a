#include <xgrad/core/detail/kernels.hpp>

#include <algorithm>
#include <limits>

#include <xgrad/core/parallel.hpp>
#include <xgrad/core/detail/same_shape.hpp>
#include <xgrad/core/detail/strided.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>

namespace xg::kernels {

namespace {

constexpr std::size_t kGrain = 1 << 14;  // elements per chunk below which one thread does it all

// How operand `x` (shape sx) broadcasts against out_shape, in the cases with a plain loop:
//   same      x has out's shape
//   scalar    one element
//   rows      x is out's trailing axes (a bias [D] against [N, D]): x[k % inner]
//   cols      x is out's leading axes with trailing ones ([N, 1] against [N, D]): x[k / inner]
enum class Bcast { same, scalar, rows, cols, general };

using detail::same_shape;

Bcast classify(const Shape& sx, const Shape& out, std::size_t& inner) {
  if (same_shape(sx, out)) return Bcast::same;
  if (sx.empty()) return Bcast::scalar;  // 0-d: one element
  const std::size_t n = numel(sx);
  if (n == 1) return Bcast::scalar;
  // Left-pad sx to out's rank.
  Shape p(out.size() - std::min(out.size(), sx.size()), 1);
  p.insert(p.end(), sx.begin(), sx.end());
  if (p.size() != out.size()) return Bcast::general;
  // rows: leading axes of p are 1, the rest equal out's.
  std::size_t d = 0;
  while (d < p.size() && p[d] == 1) ++d;
  bool ok = true;
  for (std::size_t e = d; e < p.size(); ++e) ok = ok && p[e] == out[e];
  if (ok) {
    inner = n;
    return Bcast::rows;
  }
  // cols: trailing axes of p are 1, the leading ones equal out's.
  std::size_t t = p.size();
  while (t > 0 && p[t - 1] == 1) --t;
  ok = true;
  for (std::size_t e = 0; e < t; ++e) ok = ok && p[e] == out[e];
  if (ok) {
    inner = numel(out) / n;
    return Bcast::cols;
  }
  return Bcast::general;
}

template <class F> Array binary(const Array& a, const Array& b, F f) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  Shape broadcast;  // made only when neither operand's shape is the result's
  const Shape& out_shape = same_shape(sa, sb) || sb.empty() ? sa
                           : sa.empty()           ? sb
                                                  : (broadcast = broadcast_shapes("broadcast", "a", sa, "b", sb));
  // Both defined (shape() checked that): the fields are read directly, not through the
  // checked accessors, one call each of which is a visible share of a one-element op.
  const detail::Storage& A = a.storage();
  const detail::Storage& B = b.storage();
  Array out = Array::empty(out_shape, A.dtype);
  const detail::Storage& O = out.storage();
  std::size_t ia = 0, ib = 0;
  const Bcast ka = classify(sa, out_shape, ia), kb = classify(sb, out_shape, ib);
  detail::dispatch(A.dtype, [&](auto t) {
    using T = decltype(t);
    const T* pa = static_cast<const T*>(A.ptr);
    const T* pb = B.dtype == A.dtype ? static_cast<const T*>(B.ptr) : b.data<T>();  // b.data: the DTypeError
    T* po = static_cast<T*>(O.ptr);
    const std::size_t n = O.size;
    auto index = [](Bcast k, std::size_t inner, std::size_t i) {
      switch (k) {
        case Bcast::same: return i;
        case Bcast::scalar: return std::size_t{0};
        case Bcast::rows: return i % inner;
        default: return i / inner;
      }
    };
    if (ka == Bcast::same && kb == Bcast::same) {
      detail::parallel_for(n, kGrain, [&](std::size_t lo, std::size_t hi, std::size_t) {
        for (std::size_t i = lo; i < hi; ++i) po[i] = f(pa[i], pb[i]);
      });
    } else if (ka == Bcast::same && kb == Bcast::scalar) {
      const T sv = pb[0];
      detail::parallel_for(n, kGrain, [&](std::size_t lo, std::size_t hi, std::size_t) {
        for (std::size_t i = lo; i < hi; ++i) po[i] = f(pa[i], sv);
      });
    } else if (ka == Bcast::same && kb == Bcast::rows) {
      const std::size_t rows = n / ib;
      detail::parallel_for(rows, std::max<std::size_t>(1, kGrain / ib), [&](std::size_t lo, std::size_t hi, std::size_t) {
        for (std::size_t r = lo; r < hi; ++r)
          for (std::size_t k = 0; k < ib; ++k) po[r * ib + k] = f(pa[r * ib + k], pb[k]);
      });
    } else if (ka != Bcast::general && kb != Bcast::general) {
      detail::parallel_for(n, kGrain, [&](std::size_t lo, std::size_t hi, std::size_t) {
        for (std::size_t i = lo; i < hi; ++i) po[i] = f(pa[index(ka, ia, i)], pb[index(kb, ib, i)]);
      });
    } else {
      detail::for_each_strided(out_shape, broadcast_strides(sa, out_shape),
                               broadcast_strides(sb, out_shape),
                               [&](std::size_t i, std::ptrdiff_t xa, std::ptrdiff_t xb) {
                                 po[i] = f(pa[xa], pb[xb]);
                               });
    }
  });
  return out;
}

}  // namespace

Array add(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x + y; }); }
Array sub(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x - y; }); }
Array mul(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x * y; }); }
Array div(const Array& a, const Array& b) { return binary(a, b, [](auto x, auto y) { return x / y; }); }

Array masked_add(const Array& x, const Array& bias) {
  return binary(x, bias, [](auto v, auto b) {
    return b == -std::numeric_limits<decltype(b)>::infinity() ? b : v + b;
  });
}
Array masked_grad(const Array& g, const Array& bias) {
  return binary(g, bias, [](auto v, auto b) {
    return b == -std::numeric_limits<decltype(b)>::infinity() ? decltype(v)(0) : v;
  });
}

namespace {
// out = f(a, s) elementwise, s in a's dtype.
// The fields are read from the storage, as in binary(): the checked accessors' calls are a
// visible share of a one-element op.
template <class F> Array with_scalar(const Array& a, double s, F f) {
  const detail::Storage& A = a.storage();  // throws for an undefined a
  Array out = Array::empty(A.shape, A.dtype);
  const detail::Storage& O = out.storage();
  detail::dispatch(A.dtype, [&](auto t) {
    using T = decltype(t);
    const T* p = static_cast<const T*>(A.ptr);
    T* o = static_cast<T*>(O.ptr);
    const T c = static_cast<T>(s);
    detail::parallel_for(A.size, kGrain, [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t i = lo; i < hi; ++i) o[i] = f(p[i], c);
    });
  });
  return out;
}
}  // namespace

Array scale(const Array& a, double s) { return with_scalar(a, s, [](auto x, auto c) { return x * c; }); }
Array add_scalar(const Array& a, double s) { return with_scalar(a, s, [](auto x, auto c) { return x + c; }); }
Array sub_scalar(const Array& a, double s) { return with_scalar(a, s, [](auto x, auto c) { return x - c; }); }
Array div_scalar(const Array& a, double s) { return with_scalar(a, s, [](auto x, auto c) { return x / c; }); }

Array sum_to_shape(const Array& g, const Shape& target) {
  if (same_shape(g.shape(), target)) return g;
  // Checks that target broadcasts to g's shape (an engine invariant when called from VJPs).
  const Shape b = broadcast_shapes("sum_to_shape", "target", target, "gradient", g.shape());
  if (b != g.shape())
    throw InternalError(op_message("sum_to_shape", "target " + shape_str(target) +
                                                       " does not broadcast to gradient shape " +
                                                       shape_str(g.shape())));
  std::size_t inner = 0;
  const Bcast k = classify(target, g.shape(), inner);
  if (k == Bcast::rows || k == Bcast::cols || k == Bcast::scalar) {
    // Contiguous reductions: over leading rows (bias gradients), within rows (keepdims), or all.
    Array out = Array::empty(target, g.dtype());
    detail::dispatch(g.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* pg = g.data<T>();
      T* po = out.data<T>();
      const std::size_t n = g.size();
      if (k == Bcast::cols) {  // out[r] = sum of row r (inner contiguous elements)
        const std::size_t rows = n / inner;
        detail::parallel_for(rows, std::max<std::size_t>(1, kGrain / inner), [&](std::size_t lo, std::size_t hi, std::size_t) {
          for (std::size_t r = lo; r < hi; ++r) {
            T acc = 0;
            for (std::size_t j = 0; j < inner; ++j) acc += pg[r * inner + j];
            po[r] = acc;
          }
        });
        return;
      }
      const std::size_t width = k == Bcast::scalar ? 1 : inner, rows = n / width;
      // Partial sums per chunk of rows, added in chunk order: deterministic for a thread count.
      // Rows as wide as a grain: one chunk a thread (the serial sum of the parts grows with them).
      const std::size_t grain = std::max<std::size_t>(1, kGrain / width);
      const std::size_t per_thread = width >= kGrain ? 1 : detail::kChunksPerThread;
      const std::size_t chunks = detail::parallel_chunks(rows, grain, per_thread);
      std::vector<T> part(chunks * width, T(0));
      detail::parallel_for(rows, grain, [&](std::size_t lo, std::size_t hi, std::size_t c) {
        // acc does not alias pg (__restrict): the rows' sums vectorise across j, each acc[j]
        // adding its rows in order.
        T* __restrict acc = part.data() + c * width;
        const T* __restrict in = pg;
        if (width == 1) {  // a scalar sum: 16 partial sums, lane l taking elements lo + l + 16 i in order,
                           // then added in a fixed tree; one add chain would wait on each add's latency
          constexpr std::size_t kLanes = 16;
          T lane[kLanes] = {};
          std::size_t r = lo;
          for (; r + kLanes <= hi; r += kLanes)
            for (std::size_t l = 0; l < kLanes; ++l) lane[l] += in[r + l];
          for (std::size_t l = 0; r < hi; ++r, ++l) lane[l] += in[r];
          for (std::size_t w = kLanes / 2; w > 0; w /= 2)
            for (std::size_t l = 0; l < w; ++l) lane[l] += lane[l + w];
          acc[0] += lane[0];
          return;
        }
        for (std::size_t r = lo; r < hi; ++r)
          for (std::size_t j = 0; j < width; ++j) acc[j] += in[r * width + j];
      }, per_thread);
      for (std::size_t j = 0; j < width; ++j) {
        T acc = 0;
        for (std::size_t c = 0; c < chunks; ++c) acc += part[c * width + j];
        po[j] = acc;
      }
    });
    return out;
  }
  Array out = Array::zeros(target, g.dtype());
  detail::dispatch(g.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    const auto st = broadcast_strides(target, g.shape());
    detail::for_each_strided(g.shape(), st, st,
                             [&](std::size_t i, std::ptrdiff_t io, std::ptrdiff_t) {
                               po[io] += pg[i];
                             });
  });
  return out;
}

Shape reduced_shape(const Shape& s, const std::vector<std::size_t>& axes, bool keepdims) {
  Shape out;
  for (std::size_t d = 0; d < s.size(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced)
      out.push_back(s[d]);
    else if (keepdims)
      out.push_back(1);
  }
  return out;
}

Array broadcast_to(const Array& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  Array out = Array::empty(shape, a.dtype());
  std::size_t inner = 0;
  const Bcast kind = classify(a.shape(), shape, inner);
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.data<T>();
    T* po = out.data<T>();
    const std::size_t n = out.size();
    // The plain cases (a sum's or a mean's gradient: one value, or the kept axes' values, spread
    // over a large array) as copies over the pool; the order of the copies changes no bits.
    if (kind == Bcast::scalar) {
      const T v = pa[0];
      detail::parallel_for(n, kGrain, [&](std::size_t lo, std::size_t hi, std::size_t) { std::fill(po + lo, po + hi, v); });
      return;
    }
    if (kind == Bcast::rows || kind == Bcast::cols) {  // out's rows of `inner`: a's whole, or one value of a each
      const std::size_t rows = inner ? n / inner : 0;
      detail::parallel_for(rows, std::max<std::size_t>(1, kGrain / std::max<std::size_t>(inner, 1)),
                           [&](std::size_t lo, std::size_t hi, std::size_t) {
                             for (std::size_t r = lo; r < hi; ++r) {
                               T* row = po + r * inner;
                               if (kind == Bcast::rows)
                                 std::copy(pa, pa + inner, row);
                               else
                                 std::fill(row, row + inner, pa[r]);
                             }
                           });
      return;
    }
    const auto st = broadcast_strides(a.shape(), shape);
    detail::for_each_strided(shape, st, st, [&](std::size_t i, std::ptrdiff_t ia, std::ptrdiff_t) {
      po[i] = pa[ia];
    });
  });
  return out;
}

Array permute(const Array& a, const std::vector<std::size_t>& perm) {
  const Shape& s = a.shape();
  Shape out_shape(s.size());
  const auto cs = contiguous_strides(s);
  std::vector<std::ptrdiff_t> st(s.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    out_shape[i] = s[perm[i]];
    st[i] = cs[perm[i]];
  }
  Array out = Array::empty(out_shape, a.dtype());
  const std::size_t nd = s.size();
  if (nd >= 2 && perm[nd - 1] == nd - 1 && out.size() > 0) {
    // The last axis stays last: copy whole rows of it (split_heads / merge_heads).
    const std::size_t row = s[nd - 1], rows = out.size() / row;
    detail::dispatch(a.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* pa = a.data<T>();
      T* po = out.data<T>();
      detail::parallel_for(rows, std::max<std::size_t>(1, kGrain / row), [&](std::size_t lo, std::size_t hi, std::size_t) {
        for (std::size_t r = lo; r < hi; ++r) {
          std::size_t rem = r;
          std::ptrdiff_t off = 0;
          for (std::size_t d = nd - 1; d-- > 0;) {
            off += static_cast<std::ptrdiff_t>(rem % out_shape[d]) * st[d];
            rem /= out_shape[d];
          }
          std::copy(pa + off, pa + off + row, po + r * row);
        }
      });
    });
    return out;
  }
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.data<T>();
    T* po = out.data<T>();
    detail::for_each_strided(out_shape, st, st, [&](std::size_t i, std::ptrdiff_t ia, std::ptrdiff_t) {
      po[i] = pa[ia];
    });
  });
  return out;
}

Array transpose_last2(const Array& a) {
  std::vector<std::size_t> perm(a.ndim());
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
  return permute(a, perm);
}

Array select(const std::vector<unsigned char>& cond, const Shape& cond_shape, const Array& a,
             const Array& b) {
  const Shape ab = broadcast_shapes("select", "a", a.shape(), "b", b.shape());
  const Shape out_shape = broadcast_shapes("select", "condition", cond_shape, "values", ab);
  Array ba = broadcast_to(a, out_shape);
  Array bb = broadcast_to(b, out_shape);
  Array out = Array::empty(out_shape, a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = ba.data<T>();
    const T* pb = bb.data<T>();
    T* po = out.data<T>();
    const auto sc = broadcast_strides(cond_shape, out_shape);
    detail::for_each_strided(out_shape, sc, sc, [&](std::size_t i, std::ptrdiff_t ic, std::ptrdiff_t) {
      po[i] = cond[static_cast<std::size_t>(ic)] ? pa[i] : pb[i];
    });
  });
  return out;
}

}  // namespace xg::kernels
