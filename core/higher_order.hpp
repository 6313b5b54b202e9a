/// \file
/// Derivatives of derivatives, as functions of a function (docs/higher-order.md): jvp (forward
/// mode, by linearising the reverse mode), hvp (reverse over reverse), hessian (small inputs) and
/// hutchinson_diagonal (an estimate of the Hessian's diagonal from Hessian-vector products).
/// All of them run on a scoped tape of their own and return values; they need every op f uses to
/// have a second-order rule (create_graph), and refuse one that has none (TapeError naming it).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>

namespace xg {

/// A function of tensors to one tensor: what jvp() differentiates.
using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;
/// A function of one tensor to a one-element tensor: what hvp() and hessian() differentiate.
using ScalarFn = std::function<Tensor(const Tensor&)>;
/// A one-element loss computed from leaves that already exist (a model's parameters): what the
/// parameter forms of hvp() and hutchinson_diagonal() differentiate.
using LossFn = std::function<Tensor()>;

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

/// H v with respect to existing leaves `params` (a model's parameters, each requiring grad),
/// with f computing the one-element loss from them: returns (H v)_k for each params[k], where H
/// is the Hessian over all the parameters together and v = (v[0], v[1], ...). One v per
/// parameter, of its shape and dtype (ShapeError / DTypeError naming v[k]); a parameter that is
/// not a leaf requiring grad is a ValueError. Does not touch the parameters' .grad().
std::vector<Array> hvp(const LossFn& f, const std::vector<Tensor>& params, const std::vector<Array>& v);

/// Hutchinson's estimator of the Hessian's diagonal: the mean over `samples` Rademacher vectors
/// v (entries +1 or -1 with equal probability, drawn from `gen`) of v * (H v), elementwise.
/// Unbiased; exact for a diagonal Hessian; for element i the error of the mean has standard
/// deviation sqrt(sum_{j != i} H_ij^2 / samples). The gradient is recorded once and each sample
/// costs one more reverse pass. samples >= 1 (ValueError).
Array hutchinson_diagonal(const ScalarFn& f, const Array& x, std::size_t samples, Generator& gen);
/// The same for existing leaves `params` (as the parameter form of hvp()): one estimate per
/// parameter, of its shape.
std::vector<Array> hutchinson_diagonal(const LossFn& f, const std::vector<Tensor>& params, std::size_t samples,
                                       Generator& gen);

/// The largest input hessian() accepts, in elements: it runs one reverse pass per element and
/// returns size^2 values.
constexpr std::size_t kHessianMaxElements = 1024;

/// The Hessian of the one-element f at `x`, shape x.shape + x.shape (as
/// torch.autograd.functional.hessian): row i is the gradient of (df/dx)_i, one reverse pass
/// over the recorded gradient each. x may have at most `max_elements` (at most
/// kHessianMaxElements) elements: ValueError beyond.
Array hessian(const ScalarFn& f, const Array& x, std::size_t max_elements = kHessianMaxElements);

}  // namespace xg
