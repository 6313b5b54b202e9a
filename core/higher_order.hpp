/// \file
/// Derivatives of derivatives, as functions of a function (docs/higher-order.md): jvp (forward
/// mode, by linearising the reverse mode), hvp (reverse over reverse) and hessian (small inputs).
/// All three run on a scoped tape of their own and return values; they need every op f uses to
/// have a second-order rule (create_graph), and refuse one that has none (TapeError naming it).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg {

/// A function of tensors to one tensor: what jvp() differentiates.
using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;
/// A function of one tensor to a one-element tensor: what hvp() and hessian() differentiate.
using ScalarFn = std::function<Tensor(const Tensor&)>;

/// What jvp() returns: f's value at the primals and the directional derivative J v.
struct JvpResult {
  Array output;   ///< f(primals).
  Array tangent;  ///< sum_k J_k tangents[k], with the output's shape.
};

/// Forward-mode product J v of f at `primals` with `tangents` (one per primal, same shape and
/// dtype: ShapeError / DTypeError naming the tangent otherwise). Computed by linearising the
/// reverse mode: with a dummy cotangent u, g(u) = J^T u is recorded (create_graph), and
/// J v = d/du <g(u), v> is one more reverse pass. Cost: about three reverse passes.
JvpResult jvp(const TensorFn& f, const std::vector<Array>& primals, const std::vector<Array>& tangents);

/// Hessian-vector product H v of the one-element f at `x` (reverse over reverse): the gradient
/// g = df/dx is recorded, then H v = d<g, v>/dx. `v` must have x's shape and dtype
/// (ShapeError / DTypeError otherwise); f must return one element (ValueError).
Array hvp(const ScalarFn& f, const Array& x, const Array& v);

/// The largest input hessian() accepts, in elements: it runs one reverse pass per element and
/// returns size^2 values.
constexpr std::size_t kHessianMaxElements = 1024;

/// The Hessian of the one-element f at `x`, shape x.shape + x.shape (as
/// torch.autograd.functional.hessian): row i is the gradient of (df/dx)_i, one reverse pass
/// over the recorded gradient each. x may have at most `max_elements` (at most
/// kHessianMaxElements) elements: ValueError beyond.
Array hessian(const ScalarFn& f, const Array& x, std::size_t max_elements = kHessianMaxElements);

}  // namespace xg
