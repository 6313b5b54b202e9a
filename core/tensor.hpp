// Tensor: the user-facing handle. A leaf holds a value (and, if it requires grad, receives
// gradients that accumulate until zero_grad(), like PyTorch). A non-leaf is the output of an
// op recorded on a tape (core/tape.hpp) and knows its tape, generation and node index.
// Copying a Tensor copies the handle, not the data.
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

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Array value, bool requires_grad = false);  // a leaf

  bool defined() const { return static_cast<bool>(impl_); }
  const Array& value() const;
  DType dtype() const { return value().dtype(); }
  const Shape& shape() const { return value().shape(); }
  std::size_t ndim() const { return value().ndim(); }
  std::size_t size() const { return value().size(); }
  double item() const { return value().item(); }

  bool requires_grad() const;
  bool is_leaf() const;
  Tensor& requires_grad_(bool on = true);  // leaves only

  // Accumulated gradient of a leaf; undefined until a backward pass reaches it.
  const Array& grad() const;
  bool has_grad() const { return grad().defined(); }
  void zero_grad();  // drops the accumulated gradient (PyTorch's set_to_none)
  void set_grad(Array g);  // replaces a leaf's gradient (clipping); shape and dtype must match

  // Replaces a leaf's value (optimizers). Shape and dtype must stay the same.
  void set_value(Array v);

  Tensor detach() const;  // same value, a constant leaf: no tape, no grad

  // backward(y): y must hold one element. backward(y, seed): seed has y's shape.
  void backward() const;
  void backward(const Array& seed) const;

  const std::string& name() const;
  Tensor& set_name(std::string name);

  std::shared_ptr<detail::TensorImpl> impl() const { return impl_; }
  explicit Tensor(std::shared_ptr<detail::TensorImpl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<detail::TensorImpl> impl_;
};

// Prints like PyTorch: "tensor(<values>, dtype=float32)", adding ", requires_grad=true" for
// leaves that require grad, ", grad_fn=<op>" for an op's output while its tape still holds
// it, ", name=<name>" when named; "tensor(<undefined>)" for an undefined Tensor.
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Creation helpers. The default dtype is default_dtype(): float32 unless set, as in PyTorch.
Tensor tensor(Array value, bool requires_grad = false);
Tensor zeros(const Shape& shape, DType dtype = default_dtype(), bool requires_grad = false);
Tensor ones(const Shape& shape, DType dtype = default_dtype(), bool requires_grad = false);
Tensor full(const Shape& shape, double value, DType dtype = default_dtype(),
            bool requires_grad = false);
Tensor arange(double start, double stop, double step = 1.0, DType dtype = default_dtype());
Tensor randn(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
             bool requires_grad = false);
Tensor rand(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
            bool requires_grad = false);  // uniform on [0, 1)

}  // namespace xg
