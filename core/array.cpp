#include <xgrad/core/array.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <sstream>
#include <type_traits>
#include <vector>

#include <xgrad/core/allocator.hpp>
#include <xgrad/core/detail/sanitizer.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/parallel.hpp>

namespace xg {
namespace detail {

namespace {

// Recycled Storage descriptors. Copying a shape into a new Storage allocates the shape's
// vector on the heap; an op on small arrays makes two Storages (its output, and in backward
// its cotangent), and that malloc and free were a tenth of its overhead. A Storage whose last
// Array goes away therefore gives its buffer back but keeps its shape vector (and that
// vector's capacity) on a list of this thread, and the next make() or view() assigns the new
// shape into it: no heap call for shapes of at most the rank the descriptor had before. The
// list is plain data (constant-initialised) and bounded like the block pool (kPoolBlocks; more
// are deleted); a Storage released on another thread joins that thread's list, and a
// thread's list is deleted when the thread ends (after that, released Storages are deleted at
// once). Under AddressSanitizer nothing is kept, so ASan sees every free.
struct RecycledStorages {
  Storage* head;  // linked through Storage::ptr while on the list
  std::size_t count;
  bool armed;
  bool dead;
};
thread_local RecycledStorages tl_storages{};

// The bytes of the buffer s owns: size elements (a view or an inline array owns none).
std::size_t owned_bytes(const Storage& s) noexcept {
  return s.size * (s.dtype == DType::float32 ? sizeof(float) : sizeof(double));
}

// Gives back the buffer s owns (a view owns none: it drops its reference to the base).
void release_buffer(Storage& s) noexcept {
  if (!s.base.defined() && s.ptr && s.ptr != s.small) cached_free(s.ptr, owned_bytes(s));
  s.base = Array();
  s.ptr = nullptr;
}

void delete_recycled_storages() noexcept {
  while (Storage* s = tl_storages.head) {
    tl_storages.head = static_cast<Storage*>(s->ptr);
    --tl_storages.count;
    s->ptr = nullptr;  // owns nothing: its buffer went back when it was recycled
    delete s;
  }
}

struct RecycledStoragesGuard {
  ~RecycledStoragesGuard() {
    tl_storages.dead = true;
    delete_recycled_storages();
  }
};

// shape = from, for a recycled descriptor's shape: a descriptor usually comes back for an array
// of the rank it had, and then this is a loop of stores, where vector assignment calls memmove.
inline void assign_shape(Shape& to, const Shape& from) {
  const std::size_t n = from.size();
  if (to.size() != n) {
    to = from;  // into the vector's capacity: no allocation for a rank it had before
    return;
  }
  for (std::size_t d = 0; d < n; ++d) to[d] = from[d];
}

// A Storage with no buffer (ptr null, no base) and a count of 1, recycled when one is at hand.
// Its fields other than the shape are the caller's to set; its shape holds whatever it held
// before (assign it).
Storage* new_storage() {
  Storage* s = nullptr;
#if !XG_UNDER_ASAN
  if (!tl_storages.dead && tl_storages.head) {
    s = tl_storages.head;
    tl_storages.head = static_cast<Storage*>(s->ptr);
    --tl_storages.count;
    s->ptr = nullptr;
    s->refs.store(1, std::memory_order_relaxed);
    // The next make() reads the new head's link: start loading it now (the list runs through
    // descriptors freed a while ago, so it is often out of cache).
    if (tl_storages.head) __builtin_prefetch(&tl_storages.head->ptr, 1);
  }
#endif
  if (!s) s = new Storage;
  return s;
}

}  // namespace

Array Storage::make(const Shape& shape, DType dtype) {
  // numel (ShapeError on overflow) past rank 1; a scalar or a vector cannot overflow
  const std::size_t n = shape.empty() ? 1 : shape.size() == 1 ? shape[0] : numel(shape);
  const std::size_t width = dtype == DType::float32 ? sizeof(float) : sizeof(double);
  if (n > static_cast<std::size_t>(-1) / width)
    throw ShapeError(op_message("array", "shape " + shape_str(shape) + " needs more bytes than size_t counts"));
  const std::size_t bytes = n * width;
  Array out(new_storage());  // on throw below: recycled with no buffer
  Storage* s = out.st();
  assign_shape(s->shape, shape);
  s->dtype = dtype;
  s->size = n;
  s->ptr = bytes <= sizeof(s->small) ? s->small : cached_alloc(bytes);
  return out;
}

Storage::~Storage() { release_buffer(*this); }

Array Storage::view(const Array& a, const Shape& shape) {
  Array out(new_storage());
  Storage* s = out.st();
  assign_shape(s->shape, shape);
  const Storage* from = a.st();
  s->dtype = from->dtype;
  s->size = from->size;
  s->ptr = from->ptr;
  s->base = from->base.defined() ? from->base : a;
  return out;
}

Array Storage::view_at(const Array& a, std::size_t offset, const Shape& shape) {
  const std::size_t n = shape.empty() ? 1 : numel(shape);
  const Storage* from = a.st();
  if (offset > from->size || n > from->size - offset)
    throw ShapeError(op_message("array", "a view of shape " + shape_str(shape) + " at element " +
                                             std::to_string(offset) + " does not fit in an array of " +
                                             std::to_string(from->size) + " elements"));
  const std::size_t width = from->dtype == DType::float32 ? sizeof(float) : sizeof(double);
  Array out(new_storage());
  Storage* s = out.st();
  assign_shape(s->shape, shape);
  s->dtype = from->dtype;
  s->size = n;
  s->ptr = static_cast<unsigned char*>(from->ptr) + offset * width;
  s->base = from->base.defined() ? from->base : a;
  return out;
}

// The deleter of every Storage, called by the last of its Arrays: recycles it (see
// RecycledStorages) or deletes it.
void release_storage(StorageCount* c) noexcept {
  Storage* s = static_cast<Storage*>(c);
  release_buffer(*s);
#if !XG_UNDER_ASAN
  if (!tl_storages.dead && tl_storages.count < kPoolBlocks) {
    if (!tl_storages.armed) {
      tl_storages.armed = true;
      static thread_local RecycledStoragesGuard guard;  // deletes the list when this thread ends
      (void)guard;
    }
    s->ptr = tl_storages.head;
    tl_storages.head = s;
    ++tl_storages.count;
    return;
  }
#endif
  delete s;
}

}  // namespace detail

static_assert(sizeof(detail::Storage) == 128, "a Storage's fields fill one cache line, its inline buffer the next");

detail::Storage* Array::st() const { return static_cast<detail::Storage*>(s_); }

namespace {
// Whole-array passes of Array itself (full, zeros, first_nonfinite) run over the pool in
// contiguous ranges of at least this many elements, from twice this size: the fused attention's
// large gradients it fills and the inputs it checks before every pass.
constexpr std::size_t kGrainElems = std::size_t(1) << 16;

void require_defined(const Array& a, const char* what) {
  if (!a.defined()) throw ValueError(op_message("array", std::string(what) + " of an undefined Array"));
}
}  // namespace

Array Array::empty(const Shape& shape, DType dtype) { return detail::Storage::make(shape, dtype); }

Array Array::zeros(const Shape& shape, DType dtype) { return full(shape, 0.0, dtype); }

Array Array::full(const Shape& shape, double value, DType dtype) {
  Array a = empty(shape, dtype);
  detail::dispatch(dtype, [&](auto t) {
    using T = decltype(t);
    T* p = a.data<T>();
    const T v = static_cast<T>(value);
    // Large arrays (gradients the fused attention adds into) over the pool (kGrainElems).
    const std::size_t n = a.size();
    if (n < 2 * kGrainElems) {
      std::fill(p, p + n, v);
      return;
    }
    detail::parallel_for(n, kGrainElems,
                         [&](std::size_t lo, std::size_t hi, std::size_t) { std::fill(p + lo, p + hi, v); });
  });
  return a;
}

Array Array::scalar(double value, DType dtype) { return full({}, value, dtype); }

Array Array::from_vector(const Shape& shape, const std::vector<double>& values, DType dtype) {
  if (numel(shape) != values.size())
    throw ShapeError(op_message("array", "shape " + shape_str(shape) + " needs " +
                                             std::to_string(numel(shape)) + " values, got " +
                                             std::to_string(values.size())));
  Array a = empty(shape, dtype);
  detail::dispatch(dtype, [&](auto t) {
    using T = decltype(t);
    std::transform(values.begin(), values.end(), a.data<T>(),
                   [](double v) { return static_cast<T>(v); });
  });
  return a;
}

Array Array::of(std::initializer_list<double> v, DType dtype) {
  return from_vector({v.size()}, std::vector<double>(v), dtype);
}

Array Array::of(std::initializer_list<std::initializer_list<double>> v, DType dtype) {
  std::vector<double> flat;
  const std::size_t cols = v.size() ? v.begin()->size() : 0;
  for (const auto& row : v) {
    if (row.size() != cols)
      throw ShapeError(op_message("array", "ragged nested list: rows of length " +
                                               std::to_string(cols) + " and " +
                                               std::to_string(row.size())));
    flat.insert(flat.end(), row.begin(), row.end());
  }
  return from_vector({v.size(), cols}, flat, dtype);
}

Array Array::of3(std::initializer_list<std::initializer_list<std::initializer_list<double>>> v,
                DType dtype) {
  std::vector<double> flat;
  const std::size_t rows = v.size() ? v.begin()->size() : 0;
  const std::size_t cols = rows ? v.begin()->begin()->size() : 0;
  for (const auto& m : v) {
    if (m.size() != rows) throw ShapeError(op_message("array", "ragged nested list"));
    for (const auto& row : m) {
      if (row.size() != cols) throw ShapeError(op_message("array", "ragged nested list"));
      flat.insert(flat.end(), row.begin(), row.end());
    }
  }
  return from_vector({v.size(), rows, cols}, flat, dtype);
}

DType Array::dtype() const {
  require_defined(*this, "dtype");
  return st()->dtype;
}
const Shape& Array::shape() const {
  require_defined(*this, "shape");
  return st()->shape;
}
std::size_t Array::size() const {
  require_defined(*this, "size");
  return st()->size;
}

template <class T> T* Array::data() {
  if (dtype() != detail::dtype_of<T>())
    throw DTypeError(op_message("array", std::string("requested ") +
                                             dtype_name(detail::dtype_of<T>()) +
                                             " data of a " + dtype_name(dtype()) + " array"));
  return static_cast<T*>(st()->ptr);
}
template <class T> const T* Array::data() const { return const_cast<Array*>(this)->data<T>(); }
template float* Array::data<float>();
template double* Array::data<double>();
template const float* Array::data<float>() const;
template const double* Array::data<double>() const;

double Array::flat(std::size_t i) const {
  if (i >= size())
    throw ShapeError(op_message("array", "flat index " + std::to_string(i) +
                                             " out of range for shape " + shape_str(shape())));
  return detail::dispatch(dtype(), [&](auto t) {
    using T = decltype(t);
    return static_cast<double>(data<T>()[i]);
  });
}

void Array::set_flat(std::size_t i, double v) {
  if (i >= size())
    throw ShapeError(op_message("array", "flat index " + std::to_string(i) +
                                             " out of range for shape " + shape_str(shape())));
  detail::dispatch(dtype(), [&](auto t) {
    using T = decltype(t);
    data<T>()[i] = static_cast<T>(v);
  });
}

double Array::item() const {
  if (size() != 1)
    throw ShapeError(op_message("item", "needs exactly one element, array has shape " +
                                            shape_str(shape())));
  return flat(0);
}

double Array::at(const std::vector<std::size_t>& idx) const {
  const Shape& s = shape();
  if (idx.size() != s.size())
    throw ShapeError(op_message("at", std::to_string(idx.size()) +
                                          " indices for an array of shape " + shape_str(s)));
  std::size_t off = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (idx[i] >= s[i])
      throw ShapeError(op_message("at", "index " + std::to_string(idx[i]) + " on axis " +
                                            std::to_string(i) + " out of range for shape " +
                                            shape_str(s)));
    off = off * s[i] + idx[i];
  }
  return flat(off);
}

std::vector<double> Array::to_vector() const {
  std::vector<double> v(size());
  detail::dispatch(dtype(), [&](auto t) {
    using T = decltype(t);
    std::copy(data<T>(), data<T>() + size(), v.begin());
  });
  return v;
}

Array Array::clone() const {
  Array c = empty(shape(), dtype());
  detail::dispatch(dtype(), [&](auto t) {
    using T = decltype(t);
    std::copy(data<T>(), data<T>() + size(), c.data<T>());
  });
  return c;
}

Array Array::astype(DType d) const {
  if (d == dtype()) return *this;
  Array c = empty(shape(), d);
  detail::dispatch(dtype(), [&](auto ts) {
    using S = decltype(ts);
    detail::dispatch(d, [&](auto td) {
      using D = decltype(td);
      std::transform(data<S>(), data<S>() + size(), c.data<D>(),
                     [](S v) { return static_cast<D>(v); });
    });
  });
  return c;
}

Array Array::reshaped(const Shape& s) const {
  if (numel(s) != size())
    throw ShapeError(op_message("reshape", "cannot reshape an array of shape " +
                                               shape_str(shape()) + " into shape " + shape_str(s)));
  return clone().view(s);
}

Array Array::view(const Shape& s) const {
  if (numel(s) != size())
    throw ShapeError(op_message("reshape", "cannot reshape an array of shape " +
                                               shape_str(shape()) + " into shape " + shape_str(s)));
  return detail::Storage::view(*this, s);
}

std::size_t Array::first_nonfinite() const {
  return detail::dispatch(dtype(), [&](auto t) {
    using T = decltype(t);
    // A value is inf or NaN exactly when its exponent bits are all ones. Each block is tested
    // branch-free (an OR over the block, which vectorises); only a block that has one is
    // searched for the first index.
    using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
    constexpr U kExp = sizeof(T) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
    constexpr std::size_t kBlock = 1024;
    const T* p = data<T>();
    const std::size_t n = size();
    const auto scan = [p](std::size_t lo, std::size_t hi) {  // the first in [lo, hi), or hi
      for (std::size_t i0 = lo; i0 < hi; i0 += kBlock) {
        const std::size_t e = std::min(hi, i0 + kBlock);
        U bad = 0;
        for (std::size_t i = i0; i < e; ++i) {
          U bits;
          std::memcpy(&bits, p + i, sizeof bits);
          bad |= static_cast<U>((bits & kExp) == kExp);
        }
        if (bad)
          for (std::size_t i = i0; i < e; ++i)
            if (!std::isfinite(p[i])) return i;
      }
      return hi;
    };
    // Large arrays (the attention's inputs, checked before every pass) over the pool
    // (kGrainElems): the first non-finite one of the first range that has one.
    const std::size_t chunks = n < 2 * kGrainElems ? 1 : detail::parallel_chunks(n, kGrainElems);
    if (chunks <= 1) return scan(0, n);
    std::vector<std::size_t> first(chunks, n);
    detail::parallel_for(n, kGrainElems, [&](std::size_t lo, std::size_t hi, std::size_t c) {
      const std::size_t i = scan(lo, hi);
      if (i < hi) first[c] = i;
    });
    return *std::min_element(first.begin(), first.end());
  });
}

bool Array::all_finite() const { return first_nonfinite() == size(); }

std::ostream& operator<<(std::ostream& os, const Array& a) { return os << a.str(); }

std::string Array::str() const {
  if (!defined()) return "<undefined>";
  std::ostringstream os;
  os.precision(6);
  const Shape& s = shape();
  const auto v = to_vector();
  if (s.empty()) {
    os << v[0];
    return os.str();
  }
  // Block size of dimension d: a bracket opens where such a block starts and closes
  // where it ends.
  std::vector<std::size_t> block(s.size());
  for (std::size_t d = s.size(), acc = 1; d-- > 0;) block[d] = acc *= s[d];
  const std::size_t limit = 512;
  for (std::size_t i = 0; i < v.size() && i < limit; ++i) {
    for (std::size_t d = 0; d < s.size(); ++d)
      if (i % block[d] == 0) os << "[";
    os << v[i];
    std::size_t closes = 0;
    for (std::size_t d = 0; d < s.size(); ++d)
      if ((i + 1) % block[d] == 0) ++closes;
    for (std::size_t c = 0; c < closes; ++c) os << "]";
    if (i + 1 < v.size()) os << (closes ? ",\n" : ", ");
  }
  if (v.size() > limit) os << " ... (" << v.size() << " elements)";
  return os.str();
}

detail::Storage& Array::storage() {
  require_defined(*this, "storage");
  return *st();
}
const detail::Storage& Array::storage() const {
  require_defined(*this, "storage");
  return *st();
}

double max_abs_diff(const Array& a, const Array& b) {
  if (a.shape() != b.shape())
    throw ShapeError(op_message("max_abs_diff", "a has shape " + shape_str(a.shape()) +
                                                    ", b has shape " + shape_str(b.shape())));
  const auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const double d = std::fabs(va[i] - vb[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace xg

namespace xg {

BoolArray::BoolArray(Shape s, std::vector<unsigned char> d) : shape(std::move(s)), data(std::move(d)) {
  if (numel(shape) != data.size())
    throw ShapeError(op_message("bool_array", "shape " + shape_str(shape) + " needs " +
                                                  std::to_string(numel(shape)) + " values, got " +
                                                  std::to_string(data.size())));
  for (auto& v : data) v = v ? 1 : 0;
}

BoolArray BoolArray::filled(Shape s, bool value) {
  const std::size_t n = numel(s);
  return BoolArray(std::move(s), std::vector<unsigned char>(n, value ? 1 : 0));
}

IndexArray::IndexArray(Shape s, std::vector<std::int64_t> d) : shape(std::move(s)), data(std::move(d)) {
  if (numel(shape) != data.size())
    throw ShapeError(op_message("index_array", "shape " + shape_str(shape) + " needs " +
                                                   std::to_string(numel(shape)) + " values, got " +
                                                   std::to_string(data.size())));
}

IndexArray::IndexArray(std::initializer_list<std::int64_t> v) : shape{v.size()}, data(v) {}

}  // namespace xg
