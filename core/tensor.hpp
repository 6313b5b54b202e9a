/// \file
/// Tensor: the user-facing handle. A leaf holds a value (and, if it requires grad, receives
/// gradients that accumulate until zero_grad(), like PyTorch). A non-leaf is the output of an
/// op recorded on a tape (core/tape.hpp) and knows its tape, generation and node index.
/// Copying a Tensor copies the handle, not the data.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include <xgrad/core/array.hpp>
#include <xgrad/core/random.hpp>

namespace xg {

namespace detail {
struct TensorImpl;
}

/// A handle to a value that ops differentiate: a leaf (a value you made, optionally
/// requiring grad) or the output of a recorded op. Copies share the same tensor.
class Tensor {
 public:
  Tensor() = default;  ///< An undefined tensor; see defined().
  /// A leaf holding `value`, requiring grad if `requires_grad`.
  explicit Tensor(Array value, bool requires_grad = false);

  /// Whether this handle refers to a tensor.
  bool defined() const { return static_cast<bool>(impl_); }
  /// The tensor's value (never written to by xgrad once an op has recorded it).
  const Array& value() const;
  DType dtype() const { return value().dtype(); }           ///< The value's dtype.
  const Shape& shape() const { return value().shape(); }    ///< The value's shape.
  std::size_t ndim() const { return value().ndim(); }       ///< The value's number of dimensions.
  std::size_t size() const { return value().size(); }      ///< The value's number of elements.
  double item() const { return value().item(); }           ///< The value of a one-element tensor.

  /// Whether gradients flow to this tensor (always true for a recorded op's output).
  bool requires_grad() const;
  /// Whether this is a leaf (made by the user, not recorded by an op).
  bool is_leaf() const;
  /// Sets whether this leaf requires grad (`on`) and returns it; leaves only (TapeError).
  Tensor& requires_grad_(bool on = true);

  /// Accumulated gradient of a leaf; undefined until a backward pass reaches it.
  const Array& grad() const;
  /// Whether a gradient has been accumulated (grad() is defined).
  bool has_grad() const { return grad().defined(); }
  /// The accumulated gradient as a recorded Tensor, after backward() with create_graph (see
  /// BackwardOptions::create_graph); its value equals grad(). Undefined when the gradient did
  /// not come from such passes only: a plain backward into the leaf, zero_grad() and
  /// set_grad() drop it.
  Tensor grad_graph() const;
  /// Drops the accumulated gradient (PyTorch's set_to_none).
  void zero_grad();
  /// Replaces a leaf's gradient with `g` (clipping); shape and dtype must match.
  void set_grad(Array g);

  /// Replaces a leaf's value with `v` (optimizers). Shape and dtype must stay the same.
  void set_value(Array v);

  /// The same value as a constant leaf: no tape, no grad.
  Tensor detach() const;

  /// backward(y): y must hold one element. Accumulates gradients into the leaves (see
  /// xg::backward).
  void backward() const;
  /// backward(y, seed): `seed` has y's shape; accumulates d(seed . y)/d(leaf).
  void backward(const Array& seed) const;

  /// The tensor's name (for reports such as gradcheck's), empty if none was set.
  const std::string& name() const;
  /// Sets the tensor's name to `name` and returns it.
  Tensor& set_name(std::string name);

  /// Internal: the shared state this handle refers to.
  const std::shared_ptr<detail::TensorImpl>& impl() const { return impl_; }
  /// Internal: a handle to the shared state `impl`.
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

/// Prints like PyTorch: "tensor(<values>, dtype=float32)", adding ", requires_grad=true" for
/// leaves that require grad, ", grad_fn=<op>" for an op's output while its tape still holds
/// it, ", name=<name>" when named; "tensor(<undefined>)" for an undefined Tensor `t`. Returns `os`.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// A leaf holding `value`, requiring grad if `requires_grad`. The creation helpers below
/// default to default_dtype(): float32 unless set, as in PyTorch.
Tensor tensor(Array value, bool requires_grad = false);
/// A leaf of `shape` and `dtype` filled with zeros, requiring grad if `requires_grad`.
Tensor zeros(const Shape& shape, DType dtype = default_dtype(), bool requires_grad = false);
/// A leaf of `shape` and `dtype` filled with ones, requiring grad if `requires_grad`.
Tensor ones(const Shape& shape, DType dtype = default_dtype(), bool requires_grad = false);
/// A leaf of `shape` and `dtype` filled with `value`, requiring grad if `requires_grad`.
Tensor full(const Shape& shape, double value, DType dtype = default_dtype(),
            bool requires_grad = false);
/// A 1-d constant of `dtype` holding start, start + step, ... up to but excluding `stop`;
/// ValueError unless all three are finite and step != 0.
Tensor arange(double start, double stop, double step = 1.0, DType dtype = default_dtype());
/// A leaf of `shape` and `dtype` with standard normal elements from `gen`, requiring grad if
/// `requires_grad`.
Tensor randn(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
             bool requires_grad = false);
/// A leaf of `shape` and `dtype` with elements uniform on [0, 1) from `gen`, requiring grad
/// if `requires_grad`.
Tensor rand(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
            bool requires_grad = false);

}  // namespace xg
