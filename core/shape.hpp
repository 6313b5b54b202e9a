// Shapes, dtypes and the checks every op runs on entry. Errors name the op, the argument
// and the shapes (see core/error.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace xg {

enum class DType { float32, float64 };
const char* dtype_name(DType d);  // "float32" / "float64"

// The dtype every creation helper and layer uses when none is given: float32 at start, as in
// PyTorch and JAX. Process-wide; set_default_dtype(DType::float64) is what a gradient-check
// program or a float64 test suite calls first (like torch.set_default_dtype).
DType default_dtype();
void set_default_dtype(DType dtype);

using Shape = std::vector<std::size_t>;
using Axes = std::vector<int>;  // may be negative (counted from the end), as in NumPy

std::size_t numel(const Shape& s);  // ShapeError if the count overflows size_t
std::string shape_str(const Shape& s);  // "(2, 3)"; a scalar is "()"

// NumPy broadcasting of two shapes; throws ShapeError naming op and both arguments.
Shape broadcast_shapes(const std::string& op, const std::string& a_name, const Shape& a,
                       const std::string& b_name, const Shape& b);

// Maps a possibly negative axis into [0, ndim); throws AxisError otherwise.
std::size_t normalize_axis(const std::string& op, const std::string& arg, int axis,
                           std::size_t ndim);
// Normalises, sorts and de-duplicates a list of axes (repeats are an error).
// An empty list means "all axes".
std::vector<std::size_t> normalize_axes(const std::string& op, const std::string& arg,
                                        const Axes& axes, std::size_t ndim);

// Multi-index of a flat row-major position in shape s, and its text "1, 2, 3" (no brackets).
std::vector<std::size_t> unravel_index(std::size_t flat, const Shape& s);
std::string index_list(const std::vector<std::size_t>& idx);

// A contiguous array viewed as [outer, len, inner] around one axis: elements along the axis
// are `inner` apart, and slices along it start every `len * inner` elements.
struct AxisSplit {
  std::size_t outer = 1, len = 1, inner = 1;
};
AxisSplit split_at_axis(const Shape& s, std::size_t axis);

// Row-major strides in elements.
std::vector<std::ptrdiff_t> contiguous_strides(const Shape& s);
// Strides of a contiguous array of shape `in` read as if broadcast to `out`
// (0 on broadcast axes, leading axes added). Requires in to broadcast to out.
std::vector<std::ptrdiff_t> broadcast_strides(const Shape& in, const Shape& out);

}  // namespace xg
