// Binary elementwise ops. Forward:  out = a (op) b  with NumPy broadcasting.
// VJPs (g = cotangent of out, S = kernels::sum_to_shape back to the input's shape):
//   add: a_bar = S(g),        b_bar = S(g)
//   sub: a_bar = S(g),        b_bar = -S(g)
//   mul: a_bar = S(g * b),    b_bar = S(g * a)
//   div: a_bar = S(g / b),    b_bar = -S(g * out / b)
//   where: a_bar = S(cond ? g : 0), b_bar = S(cond ? 0 : g)
// Second-order rules (create_graph, docs/higher-order.md): the same formulas with recorded
// ops, S = ops::sum_to; div's uses the recorded output.
// A tensor and a number (the operators): a + s, a - s, a * s and a / s, recorded with the one
// input a: a_bar = g, g, g * s and g / s.
#include <xgrad/ops/elementwise.hpp>

#include <algorithm>
#include <cmath>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/detail/map.hpp>
#include <xgrad/core/detail/record.hpp>
#include <xgrad/core/detail/same_shape.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/unary.hpp>

namespace xg::ops {

namespace {

Shape checked_broadcast(const std::string& op, const Tensor& a, const Tensor& b) {
  check::same_dtype(op, "a", a, "b", b);
  return broadcast_shapes(op, "a", a.shape(), "b", b.shape());
}

// checked_broadcast for ops that do not need the shape (the kernel makes it). The common
// cases (one dtype, equal shapes or a 0-d operand, which broadcasts with any shape) return
// before any name is made into a string; anything else runs the full checks, whose errors
// name the op and the arguments.
void check_binary(const char* op, const Tensor& a, const Tensor& b) {
  if (a.defined() && b.defined()) {
    const Array& va = a.value();
    const Array& vb = b.value();
    if (va.dtype() == vb.dtype() && (va.ndim() == 0 || vb.ndim() == 0 || detail::same_shape(va.shape(), vb.shape())))
      return;
  }
  check::same_dtype(op, "a", a, "b", b);
  check_broadcastable(op, a.shape(), b.shape());
}

// The flat index of the first NaN in `out`, or out.size(). Past the first non-finite value
// only: an x/0 = inf before it must not hide a 0/0 after it.
std::size_t first_nan(const Array& out) {
  for (std::size_t i = out.first_nonfinite(); i < out.size(); ++i)
    if (std::isnan(out.flat(i))) return i;
  return out.size();
}

// The VJPs below build their results with these rather than a braced Cotangents{...} or a
// copy: a braced list copies each Array (a reference count up, then down for the temporary).
// Two cotangents moved into place.
Cotangents cotangents(Array a, Array b) {
  Cotangents c(2);
  c[0] = std::move(a);
  c[1] = std::move(b);
  return c;
}
// kernels::sum_to_shape of a temporary `g`: g itself (moved) when it already has `shape`.
Array sum_to_owned(Array g, const Shape& shape) {
  if (detail::same_shape(g.shape(), shape)) return g;
  return kernels::sum_to_shape(g, shape);
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_binary("add", a, b);
  return detail::record_refs(
      "add", kernels::add(a.value(), b.value()), {&a, &b},
      [](const VjpContext& c) {
        return cotangents(c.needs(0) ? kernels::sum_to_shape(c.grad_output, c.inputs[0].shape()) : Array(),
                          c.needs(1) ? kernels::sum_to_shape(c.grad_output, c.inputs[1].shape()) : Array());
      },
      second_order([](const DiffVjpContext& c) {
        return DiffCotangents{c.needs(0) ? sum_to(c.grad_output, c.inputs[0].shape()) : Tensor(),
                              c.needs(1) ? sum_to(c.grad_output, c.inputs[1].shape()) : Tensor()};
      }));
}

Tensor sub(const Tensor& a, const Tensor& b) {
  check_binary("sub", a, b);
  return detail::record_refs("sub", kernels::sub(a.value(), b.value()), {&a, &b}, [](const VjpContext& c) {
    return cotangents(
        c.needs(0) ? kernels::sum_to_shape(c.grad_output, c.inputs[0].shape()) : Array(),
        c.needs(1) ? kernels::scale(kernels::sum_to_shape(c.grad_output, c.inputs[1].shape()), -1.0)
                   : Array());
  }, second_order([](const DiffVjpContext& c) {
    return DiffCotangents{c.needs(0) ? sum_to(c.grad_output, c.inputs[0].shape()) : Tensor(),
                          c.needs(1) ? neg(sum_to(c.grad_output, c.inputs[1].shape())) : Tensor()};
  }));
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_binary("mul", a, b);
  return detail::record_refs("mul", kernels::mul(a.value(), b.value()), {&a, &b}, [](const VjpContext& c) {
    const Array& A = c.inputs[0];
    const Array& B = c.inputs[1];
    return cotangents(c.needs(0) ? sum_to_owned(kernels::mul(c.grad_output, B), A.shape()) : Array(),
                      c.needs(1) ? sum_to_owned(kernels::mul(c.grad_output, A), B.shape()) : Array());
  }, second_order([](const DiffVjpContext& c) {
    const Tensor &A = c.inputs[0], &B = c.inputs[1], &g = c.grad_output;
    return DiffCotangents{c.needs(0) ? sum_to(g * B, A.shape()) : Tensor(),
                          c.needs(1) ? sum_to(g * A, B.shape()) : Tensor()};
  }));
}

Tensor div(const Tensor& a, const Tensor& b) {
  check_binary("div", a, b);
  Array out = kernels::div(a.value(), b.value());
  // 0/0 is the one finite-input case that makes NaN: refuse it rather than hide it.
  const std::size_t bad = first_nan(out);
  if (bad < out.size() && a.value().all_finite() && b.value().all_finite())
    throw ValueError(op_message("div", "0/0 at output flat index " + std::to_string(bad) +
                                           " (a has shape " + shape_str(a.shape()) +
                                           ", b has shape " + shape_str(b.shape()) + ")"));
  return detail::record_refs("div", std::move(out), {&a, &b}, [](const VjpContext& c) {
    const Array& A = c.inputs[0];
    const Array& B = c.inputs[1];
    const Array g_over_b = kernels::div(c.grad_output, B);
    return cotangents(
        c.needs(0) ? kernels::sum_to_shape(g_over_b, A.shape()) : Array(),
        c.needs(1)
            ? kernels::scale(kernels::sum_to_shape(kernels::mul(g_over_b, c.output), B.shape()), -1.0)
            : Array());
  }, second_order([](const DiffVjpContext& c) {
    const Tensor &A = c.inputs[0], &B = c.inputs[1];
    const Tensor g_over_b = c.grad_output / B;
    return DiffCotangents{c.needs(0) ? sum_to(g_over_b, A.shape()) : Tensor(),
                          c.needs(1) ? neg(sum_to(g_over_b * c.output, B.shape())) : Tensor()};
  }));
}

namespace {

// where's VJP as a named type: its second-order rule reads the condition from it.
struct WhereVjp {
  std::shared_ptr<BoolArray> keep;
  Cotangents operator()(const VjpContext& c) const {
    const Array& g = c.grad_output;
    const Array zero = Array::zeros({}, g.dtype());
    return Cotangents{
        c.needs(0) ? kernels::sum_to_shape(kernels::select(keep->data, keep->shape, g, zero),
                                           c.inputs[0].shape())
                   : Array(),
        c.needs(1) ? kernels::sum_to_shape(kernels::select(keep->data, keep->shape, zero, g),
                                           c.inputs[1].shape())
                   : Array()};
  }
};

}  // namespace

Tensor where(const BoolArray& cond, const Tensor& a, const Tensor& b) {
  const Shape ab = checked_broadcast("where", a, b);
  broadcast_shapes("where", "condition", cond.shape, "values", ab);
  Array out = kernels::select(cond.data, cond.shape, a.value(), b.value());
  return record("where", std::move(out), {a, b}, WhereVjp{std::make_shared<BoolArray>(cond)},
                second_order([](const DiffVjpContext& c) {
                  const BoolArray& keep = *c.first_order_as<WhereVjp>().keep;
                  const Tensor& g = c.grad_output;
                  const Tensor zero = scalar_like(g, 0.0);
                  return DiffCotangents{c.needs(0) ? sum_to(where(keep, g, zero), c.inputs[0].shape()) : Tensor(),
                                        c.needs(1) ? sum_to(where(keep, zero, g), c.inputs[1].shape()) : Tensor()};
                }));
}

namespace {

// a (op) s for a double s, the operators' tensor-and-number forms: one recorded input, the
// number a constant (as PyTorch's wrapped numbers are). Values and gradients are those of the
// binary op against scalar_like(a, s), bit for bit (s is rounded to a's dtype first, and
// s * a = a * s, s + a = a + s exactly), without making the 0-d tensor, broadcasting it and
// recording it: that was a third of a one-element op's cost (docs/performance.md, "Per-op
// overhead").
Cotangents one_cotangent(Array a) {
  Cotangents c(1);
  c[0] = std::move(a);
  return c;
}

// a + s or a - s, as Kernel computes it: a's cotangent is g itself.
template <Array (*Kernel)(const Array&, double)> Tensor shifted(const std::string& op, const Tensor& a, double s) {
  check::defined(op, "a", a);
  return detail::record_refs(
      op, Kernel(a.value(), s), {&a}, [](const VjpContext& c) { return one_cotangent(c.grad_output); },
      second_order([](const DiffVjpContext& c) { return DiffCotangents{c.grad_output}; }));
}

Tensor add_number(const Tensor& a, double s) { return shifted<&kernels::add_scalar>("add", a, s); }
Tensor sub_number(const Tensor& a, double s) { return shifted<&kernels::sub_scalar>("sub", a, s); }

Tensor mul_number(const Tensor& a, double s) {
  check::defined("mul", "a", a);
  return detail::record_refs(
      "mul", kernels::scale(a.value(), s), {&a},
      [s](const VjpContext& c) { return one_cotangent(kernels::scale(c.grad_output, s)); },
      second_order([s](const DiffVjpContext& c) { return DiffCotangents{mul_number(c.grad_output, s)}; }));
}

Tensor div_number(const Tensor& a, double s) {
  check::defined("div", "a", a);
  Array out = kernels::div_scalar(a.value(), s);
  const std::size_t bad = first_nan(out);
  if (bad < out.size() && std::isfinite(s) && a.value().all_finite())
    throw ValueError(op_message("div", "0/0 at output flat index " + std::to_string(bad) + " (a has shape " +
                                           shape_str(a.shape()) + ", divided by a number that is 0 in " +
                                           dtype_name(a.dtype()) + ")"));
  return detail::record_refs(
      "div", std::move(out), {&a},
      [s](const VjpContext& c) { return one_cotangent(kernels::div_scalar(c.grad_output, s)); },
      second_order([s](const DiffVjpContext& c) { return DiffCotangents{div_number(c.grad_output, s)}; }));
}

}  // namespace

Tensor scalar_like(const Tensor& x, double value) {
  if (!x.defined()) check::defined("scalar", "x", x);  // throws, naming the op and argument
  return Tensor(Array::scalar(value, x.dtype()));
}

}  // namespace xg::ops

namespace xg {

Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
Tensor operator-(const Tensor& a) { return ops::neg(a); }
Tensor operator+(const Tensor& a, double s) { return ops::add_number(a, s); }
Tensor operator-(const Tensor& a, double s) { return ops::sub_number(a, s); }
Tensor operator*(const Tensor& a, double s) { return ops::mul_number(a, s); }
Tensor operator/(const Tensor& a, double s) { return ops::div_number(a, s); }
Tensor operator+(double s, const Tensor& a) { return ops::add_number(a, s); }
Tensor operator-(double s, const Tensor& a) { return ops::sub(ops::scalar_like(a, s), a); }
Tensor operator*(double s, const Tensor& a) { return ops::mul_number(a, s); }
Tensor operator/(double s, const Tensor& a) { return ops::div(ops::scalar_like(a, s), a); }

}  // namespace xg
