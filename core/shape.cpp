#include <xgrad/core/shape.hpp>

#include <algorithm>
#include <atomic>
#include <limits>
#include <sstream>

#include <xgrad/core/error.hpp>

namespace xg {

namespace {
std::atomic<DType> g_default_dtype{DType::float32};
}  // namespace

DType default_dtype() { return g_default_dtype.load(std::memory_order_relaxed); }
void set_default_dtype(DType dtype) { g_default_dtype.store(dtype, std::memory_order_relaxed); }

const char* dtype_name(DType d) { return d == DType::float32 ? "float32" : "float64"; }

std::size_t numel(const Shape& s) {
  std::size_t n = 1;
  bool zero = false;
  for (std::size_t d : s) zero = zero || d == 0;
  if (zero) return 0;
  for (std::size_t d : s) {
    if (n > std::numeric_limits<std::size_t>::max() / d)
      throw ShapeError(op_message("shape", "shape " + shape_str(s) + " has more elements than fit in size_t"));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "(";
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

Shape broadcast_shapes(const std::string& op, const std::string& a_name, const Shape& a,
                       const std::string& b_name, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::size_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ShapeError(op_message(op, "shapes do not broadcast: " + a_name + " has shape " +
                                          shape_str(a) + ", " + b_name + " has shape " +
                                          shape_str(b)));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

void check_broadcastable(const std::string& op, const Shape& a, const Shape& b) {
  if (a == b || a.empty() || b.empty()) return;  // the common cases, without a new shape
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::size_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) broadcast_shapes(op, "a", a, "b", b);  // throws its ShapeError
  }
}

std::size_t normalize_axis(const std::string& op, const std::string& arg, int axis,
                           std::size_t ndim) {
  const long n = static_cast<long>(ndim);
  const long a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n)
    throw AxisError(op_message(op, arg + " " + std::to_string(axis) +
                                       " is out of range for a tensor with " +
                                       std::to_string(ndim) + " dimension(s)"));
  return static_cast<std::size_t>(a);
}

std::vector<std::size_t> normalize_axes(const std::string& op, const std::string& arg,
                                        const Axes& axes, std::size_t ndim) {
  std::vector<std::size_t> out;
  if (axes.empty()) {
    for (std::size_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (int a : axes) out.push_back(normalize_axis(op, arg, a, ndim));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw AxisError(op_message(op, arg + " names the same axis twice"));
  return out;
}

std::vector<std::size_t> unravel_index(std::size_t flat, const Shape& s) {
  std::vector<std::size_t> idx(s.size());
  for (std::size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? flat % s[d] : 0;
    flat = s[d] ? flat / s[d] : 0;
  }
  return idx;
}

std::string index_list(const std::vector<std::size_t>& idx) {
  std::ostringstream os;
  for (std::size_t i = 0; i < idx.size(); ++i) os << (i ? ", " : "") << idx[i];
  return os.str();
}

AxisSplit split_at_axis(const Shape& s, std::size_t axis) {
  AxisSplit r;
  for (std::size_t i = 0; i < axis; ++i) r.outer *= s[i];
  r.len = s[axis];
  for (std::size_t i = axis + 1; i < s.size(); ++i) r.inner *= s[i];
  return r;
}

std::vector<std::ptrdiff_t> contiguous_strides(const Shape& s) {
  std::vector<std::ptrdiff_t> st(s.size());
  std::ptrdiff_t acc = 1;
  for (std::size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= static_cast<std::ptrdiff_t>(s[i]);
  }
  return st;
}

std::vector<std::ptrdiff_t> broadcast_strides(const Shape& in, const Shape& out) {
  std::vector<std::ptrdiff_t> st(out.size(), 0);
  const auto cs = contiguous_strides(in);
  const std::size_t lead = out.size() - in.size();
  for (std::size_t i = 0; i < in.size(); ++i)
    st[lead + i] = (in[i] == 1 && out[lead + i] != 1) ? 0 : cs[i];
  return st;
}

}  // namespace xg
