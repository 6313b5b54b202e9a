/// \file
/// Shapes, dtypes and the checks every op runs on entry. Errors name the op, the argument
/// and the shapes (see core/error.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

/// xgrad: arrays and tensors (core/), differentiable ops (xg::ops), modules and attention
/// (xg::nn). Everything a program needs is in the umbrella header <xgrad/xgrad.hpp>.
namespace xg {

/// Element type of an Array, chosen at run time: float32 for training, float64 for
/// gradient checks (the same op code serves both).
enum class DType { float32, float64 };
/// \var DType::float32
/// 32-bit IEEE float (`float`): training.
/// \var DType::float64
/// 64-bit IEEE float (`double`): gradient checks and reference computations.

/// Name of dtype `d`: "float32" or "float64".
const char* dtype_name(DType d);

/// The dtype every creation helper and layer uses when none is given: float32 at program
/// start, as in PyTorch and JAX. Process-wide.
DType default_dtype();
/// Sets the default dtype to `dtype`, like torch.set_default_dtype: a gradient-check program
/// or a float64 test suite calls set_default_dtype(DType::float64) first.
void set_default_dtype(DType dtype);

/// Extents of an array, outermost first (row-major). An empty shape is a scalar.
using Shape = std::vector<std::size_t>;
/// A list of axes; each may be negative (counted from the end), as in NumPy.
using Axes = std::vector<int>;

/// Number of elements of shape `s` (1 for a scalar); ShapeError if the count overflows size_t.
std::size_t numel(const Shape& s);
/// Text of shape `s`, e.g. "(2, 3)"; a scalar is "()".
std::string shape_str(const Shape& s);

/// NumPy broadcasting of shape `a` (argument `a_name`) with shape `b` (argument `b_name`):
/// the broadcast shape, or a ShapeError naming `op` and both arguments with their shapes.
Shape broadcast_shapes(const std::string& op, const std::string& a_name, const Shape& a,
                       const std::string& b_name, const Shape& b);

/// broadcast_shapes(op, "a", a, "b", b) without making the shape: throws the same ShapeError
/// when `a` and `b` do not broadcast, and allocates nothing when they do.
void check_broadcastable(const std::string& op, const Shape& a, const Shape& b);

/// Maps a possibly negative `axis` of an array with `ndim` dimensions into [0, ndim); throws
/// AxisError naming `op` and the argument `arg` otherwise.
std::size_t normalize_axis(const std::string& op, const std::string& arg, int axis,
                           std::size_t ndim);
/// Normalises (as normalize_axis), sorts and de-duplicates a list of `axes` of an array with
/// `ndim` dimensions; an axis named twice is an AxisError naming `op` and `arg`.
/// An empty list means "all axes".
std::vector<std::size_t> normalize_axes(const std::string& op, const std::string& arg,
                                        const Axes& axes, std::size_t ndim);

/// Multi-index of the flat row-major position `flat` in shape `s`.
std::vector<std::size_t> unravel_index(std::size_t flat, const Shape& s);
/// Text of a multi-index `idx`: "1, 2, 3" (no brackets).
std::string index_list(const std::vector<std::size_t>& idx);

/// A contiguous array viewed as [outer, len, inner] around one axis: elements along the axis
/// are `inner` apart, and slices along it start every `len * inner` elements.
struct AxisSplit {
  /// Product of the extents before the axis; the axis's extent; product of the extents after
  /// it. @{
  std::size_t outer = 1, len = 1, inner = 1;
  /// @}
};
/// The [outer, len, inner] view of shape `s` around axis `axis` (already normalised).
AxisSplit split_at_axis(const Shape& s, std::size_t axis);

/// Row-major strides in elements of a contiguous array of shape `s`.
std::vector<std::ptrdiff_t> contiguous_strides(const Shape& s);
/// Strides of a contiguous array of shape `in` read as if broadcast to `out`
/// (0 on broadcast axes, leading axes added). Requires `in` to broadcast to `out`.
std::vector<std::ptrdiff_t> broadcast_strides(const Shape& in, const Shape& out);

}  // namespace xg
