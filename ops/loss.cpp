// cross_entropy = -sum_i w_i log_softmax(z_i)[t_i] / sum_i w_i, composed from log_softmax
// (dedicated VJP), gather, mul and sum: the VJP is softmax(z_i) - onehot(t_i), scaled by
// w_i / sum w, by composition. mse = mean((a - b)^2) likewise.
#include <xgrad/ops/loss.hpp>

#include <cmath>

#include <xgrad/core/check.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/index.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/softmax.hpp>

namespace xg::ops {

Tensor cross_entropy(const Tensor& logits, const IndexArray& targets, const CrossEntropyOptions& opts) {
  check::rank_at_least("cross_entropy", "logits", logits, 1);
  const Shape& ls = logits.shape();
  const Shape lead(ls.begin(), ls.end() - 1);
  const std::size_t C = ls.back();
  if (targets.shape != lead)
    throw ShapeError(op_message("cross_entropy", "targets have shape " + shape_str(targets.shape) +
                                                     ", expected " + shape_str(lead) + " for logits of shape " +
                                                     shape_str(ls)));
  if (opts.weights.defined() && opts.weights.shape() != lead)
    throw ShapeError(op_message("cross_entropy", "weights have shape " + shape_str(opts.weights.shape()) +
                                                     ", expected the targets' shape " + shape_str(lead)));
  IndexArray safe = targets;  // ignored targets point at class 0 with weight 0
  Shape wshape = lead;
  wshape.push_back(1);
  Array w = Array::zeros(wshape, logits.dtype());
  safe.shape = wshape;
  double total = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    const std::int64_t t = targets.data[i];
    if (t == opts.ignore_index) {
      safe.data[i] = 0;
      continue;
    }
    if (t < 0 || static_cast<std::size_t>(t) >= C)
      throw ValueError(op_message("cross_entropy", "target " + std::to_string(t) + " at position " +
                                                       std::to_string(i) + " is outside [0, " +
                                                       std::to_string(C) + ") and is not ignore_index (" +
                                                       std::to_string(opts.ignore_index) + ")"));
    const double wi = opts.weights.defined() ? opts.weights.flat(i) : 1.0;
    if (!(wi >= 0) || !std::isfinite(wi))
      throw ValueError(op_message("cross_entropy", "weight " + std::to_string(wi) + " at position " +
                                                       std::to_string(i) + " must be finite and >= 0"));
    w.set_flat(i, wi);
    total += wi;
  }
  if (!(total > 0))
    throw ValueError(op_message("cross_entropy", "no target left to average: all " +
                                                     std::to_string(targets.size()) +
                                                     " are ignore_index or have weight 0"));
  const Tensor picked = gather(log_softmax(logits, -1), -1, safe);  // [..., 1]
  return -sum(picked * Tensor(w)) / total;
}

Tensor mse(const Tensor& a, const Tensor& b) {
  check::same_dtype("mse", "a", a, "b", b);
  check::same_shape("mse", "a", a.shape(), "b", b.shape());
  const Tensor d = a - b;
  return mean(d * d);
}

}  // namespace xg::ops
