// Shape ops move or copy elements without arithmetic, so each VJP is the inverse move:
//   reshape/squeeze/unsqueeze: x_bar = reshape(g, x.shape)
//   permute(dims):             x_bar = permute(g, inverse(dims))
//   broadcast_to:              x_bar = sum_to_shape(g, x.shape)
// Second-order rules: the same moves, recorded (sum_to for broadcast_to).
#include <xgrad/ops/shape_ops.hpp>

#include <algorithm>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/ops/reduce.hpp>

namespace xg::ops {

namespace {

std::vector<long> long_shape(const Shape& s) { return std::vector<long>(s.begin(), s.end()); }

Tensor reshaped_as(const std::string& op, const Tensor& x, const Shape& s) {
  return record(
      op, x.value().view(s), {x},
      [](const VjpContext& c) { return Cotangents{c.grad_output.view(c.inputs[0].shape())}; },
      second_order([](const DiffVjpContext& c) {
        return DiffCotangents{reshape(c.grad_output, long_shape(c.inputs[0].shape()))};
      }));
}

// permute's VJP as a named type: its second-order rule reads the inverse permutation.
struct PermuteVjp {
  std::vector<std::size_t> inverse;
  Cotangents operator()(const VjpContext& c) const { return Cotangents{kernels::permute(c.grad_output, inverse)}; }
};

}  // namespace

Tensor reshape(const Tensor& x, const std::vector<long>& shape) {
  check::defined("reshape", "x", x);
  Shape s(shape.size());
  long infer = -1;
  std::size_t known = 1;
  auto shape_text = [&] {
    std::string t = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
    return t + ")";
  };
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0)
        throw ShapeError(op_message("reshape", "shape " + shape_text() + " has more than one -1"));
      infer = static_cast<long>(i);
    } else if (shape[i] < 0) {
      throw ShapeError(op_message("reshape", "shape " + shape_text() + " has a negative size"));
    } else {
      s[i] = static_cast<std::size_t>(shape[i]);
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.size() % known != 0)
      throw ShapeError(op_message("reshape", "cannot reshape x of shape " + shape_str(x.shape()) +
                                                 " into " + shape_text()));
    s[static_cast<std::size_t>(infer)] = x.size() / known;
  }
  if (numel(s) != x.size())
    throw ShapeError(op_message("reshape", "cannot reshape x of shape " + shape_str(x.shape()) +
                                               " (" + std::to_string(x.size()) + " elements) into " +
                                               shape_text()));
  return reshaped_as("reshape", x, s);
}

Tensor permute(const Tensor& x, const std::vector<int>& dims) {
  check::defined("permute", "x", x);
  if (dims.size() != x.ndim())
    throw AxisError(op_message("permute", "dims has " + std::to_string(dims.size()) +
                                              " entries for x of shape " + shape_str(x.shape())));
  std::vector<std::size_t> perm(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i)
    perm[i] = normalize_axis("permute", "dims", dims[i], x.ndim());
  std::vector<std::size_t> sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw AxisError(op_message("permute", "dims repeats an axis for x of shape " + shape_str(x.shape())));
  std::vector<std::size_t> inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = i;
  return record("permute", kernels::permute(x.value(), perm), {x}, PermuteVjp{inverse},
                second_order([](const DiffVjpContext& c) {
                  const auto& inv = c.first_order_as<PermuteVjp>().inverse;
                  return DiffCotangents{permute(c.grad_output, std::vector<int>(inv.begin(), inv.end()))};
                }));
}

Tensor transpose(const Tensor& x, int axis0, int axis1) {
  check::rank_at_least("transpose", "x", x, 2);
  const std::size_t a = normalize_axis("transpose", "axis0", axis0, x.ndim());
  const std::size_t b = normalize_axis("transpose", "axis1", axis1, x.ndim());
  std::vector<int> dims(x.ndim());
  for (std::size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int>(i);
  std::swap(dims[a], dims[b]);
  return permute(x, dims);
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check::defined("broadcast_to", "x", x);
  const Shape b = broadcast_shapes("broadcast_to", "x", x.shape(), "shape", shape);
  if (b != shape)
    throw ShapeError(op_message("broadcast_to", "x of shape " + shape_str(x.shape()) +
                                                    " cannot be broadcast to " + shape_str(shape)));
  return record(
      "broadcast_to", kernels::broadcast_to(x.value(), shape), {x},
      [](const VjpContext& c) { return Cotangents{kernels::sum_to_shape(c.grad_output, c.inputs[0].shape())}; },
      second_order([](const DiffVjpContext& c) { return DiffCotangents{sum_to(c.grad_output, c.inputs[0].shape())}; }));
}

Tensor squeeze(const Tensor& x, int axis) {
  check::defined("squeeze", "x", x);
  const std::size_t a = normalize_axis("squeeze", "axis", axis, x.ndim());
  if (x.shape()[a] != 1)
    throw ShapeError(op_message("squeeze", "axis " + std::to_string(axis) + " of x has size " +
                                               std::to_string(x.shape()[a]) + ", not 1 (shape " +
                                               shape_str(x.shape()) + ")"));
  Shape s = x.shape();
  s.erase(s.begin() + static_cast<long>(a));
  return reshaped_as("squeeze", x, s);
}

Tensor unsqueeze(const Tensor& x, int axis) {
  check::defined("unsqueeze", "x", x);
  const std::size_t a = normalize_axis("unsqueeze", "axis", axis, x.ndim() + 1);
  Shape s = x.shape();
  s.insert(s.begin() + static_cast<long>(a), 1);
  return reshaped_as("unsqueeze", x, s);
}

}  // namespace xg::ops
