// layer_norm is composed from mean, sub, mul, add, sqrt and div, so its VJP follows by
// composition and is checked by finite differences like every other op. A fused kernel
// with a hand-written VJP can replace it later, with this composition as its test oracle.
#include "ops/layer_norm.hpp"

#include "core/check.hpp"
#include "ops/elementwise.hpp"
#include "ops/reduce.hpp"
#include "ops/unary.hpp"

namespace xg::ops {

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  check::rank_at_least("layer_norm", "x", x, 1);
  if (!(eps > 0)) throw ValueError(op_message("layer_norm", "eps must be positive, got " + std::to_string(eps)));
  const Shape feat{x.shape().back()};
  for (const auto& [name, p] : {std::pair<const char*, const Tensor&>{"gamma", gamma}, {"beta", beta}}) {
    if (!p.defined()) continue;
    check::same_dtype("layer_norm", "x", x, name, p);
    if (p.shape() != feat)
      throw ShapeError(op_message("layer_norm", std::string(name) + " has shape " + shape_str(p.shape()) +
                                                    ", expected " + shape_str(feat) + " for x of shape " +
                                                    shape_str(x.shape())));
  }
  const Tensor d = x - mean(x, {-1}, true);
  const Tensor v = mean(d * d, {-1}, true);
  Tensor y = d / sqrt(v + eps);
  if (gamma.defined()) y = y * gamma;
  if (beta.defined()) y = y + beta;
  return y;
}

}  // namespace xg::ops
