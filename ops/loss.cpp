// cross_entropy = -sum_i w_i log_softmax(z_i)[t_i] / sum_i w_i: one op with its own VJP
// softmax(z_i) - onehot(t_i), scaled by w_i / sum w (issue 21: one pass over the logits each
// way). cross_entropy_composed builds the same function from log_softmax (dedicated VJP),
// gather, mul and sum: the fused op's test oracle, and the fused op's second-order rule
// (create_graph) differentiates that composition. mse = mean((a - b)^2) likewise.
#include <xgrad/ops/loss.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <xgrad/core/check.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/detail/vmath.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/index.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/softmax.hpp>

namespace xg::ops {

namespace {

// Rows per parallel chunk: about 8K logits.
std::size_t xent_grain(std::size_t C) { return std::max<std::size_t>(1, (std::size_t{1} << 13) / std::max<std::size_t>(C, 1)); }

// The max and the sum of a row of C values in 8 interleaved partials (element j in partial
// j % 8 of its block of 8, a tail in partial 0), combined in one fixed order. A single float
// chain (max or sum) cannot be vectorized and waits on each add's latency; 8 partials are
// vector lanes, and the order, so the bits, is the same on every ISA.
template <class T> T row_max(const T* z, std::size_t C) {
  T m[8];
  for (T& v : m) v = z[0];
  std::size_t j = 0;
  for (; j + 8 <= C; j += 8)
    for (std::size_t k = 0; k < 8; ++k) m[k] = std::max(m[k], z[j + k]);
  for (; j < C; ++j) m[0] = std::max(m[0], z[j]);
  return std::max(std::max(std::max(m[0], m[1]), std::max(m[2], m[3])),
                  std::max(std::max(m[4], m[5]), std::max(m[6], m[7])));
}
template <class T> T row_sum(const T* x, std::size_t C) {
  T s[8] = {};
  std::size_t j = 0;
  for (; j + 8 <= C; j += 8)
    for (std::size_t k = 0; k < 8; ++k) s[k] += x[j + k];
  for (; j < C; ++j) s[0] += x[j];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// The composed cross-entropy of the (already checked) safe targets and weights w [..., 1].
Tensor composed_loss(const Tensor& logits, const IndexArray& safe, const Array& w, double total) {
  const Tensor picked = gather(log_softmax(logits, -1), -1, safe);  // [..., 1]
  return -sum(picked * Tensor(w)) / total;
}

// The fused op's VJP as a named type: its second-order rule reads the targets and weights.
struct CrossEntropyVjp {
  std::shared_ptr<std::vector<double>> lse;
  std::vector<std::int64_t> tgt;
  Array w;
  double total;
  std::size_t N, C;
  Cotangents operator()(const VjpContext& c) const;
};

// One op: per row i of C logits z, m = max z, lse = m + log sum exp(z - m) (kept per row), and
// L = sum_i w_i (lse_i - z_i[t_i]) / total. VJP: z_bar = g w_i / total (exp(z - lse) - onehot(t_i)).
// A row's max and sum of exp(z - m) in 8 partials (row_max, row_sum); the per-row losses are
// added in row order in double.
Tensor fused_cross_entropy(const Tensor& logits, const std::vector<std::int64_t>& tgt, const Array& w, double total) {
  const std::size_t C = logits.shape().back(), N = C ? logits.size() / C : 0;
  auto lse = std::make_shared<std::vector<double>>(N);
  std::vector<double> row_loss(N);
  detail::dispatch(logits.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pz = logits.value().data<T>();
    detail::parallel_for(N, xent_grain(C), [&](std::size_t lo, std::size_t hi, std::size_t) {
      std::vector<T> buf(C);
      for (std::size_t r = lo; r < hi; ++r) {
        const T* zr = pz + r * C;
        const T m = row_max(zr, C);
        for (std::size_t j = 0; j < C; ++j) buf[j] = zr[j] - m;
        vmath::exp(buf.data(), buf.data(), C);
        const T s = row_sum(buf.data(), C);
        const double l = static_cast<double>(m) + std::log(static_cast<double>(s));
        (*lse)[r] = l;
        const double wr = w.flat(r);
        row_loss[r] = wr == 0 ? 0.0 : wr * (l - static_cast<double>(zr[tgt[r]]));
      }
    });
  });
  double L = 0;
  for (double v : row_loss) L += v;
  Array out = Array::full({}, L / total, logits.dtype());
  return record("cross_entropy", std::move(out), {logits}, CrossEntropyVjp{lse, tgt, w, total, N, C},
                second_order([](const DiffVjpContext& c) {
                  const CrossEntropyVjp& v = c.first_order_as<CrossEntropyVjp>();
                  const IndexArray safe(v.w.shape(), v.tgt);
                  return composed_vjp(c, [&](const std::vector<Tensor>& in) { return composed_loss(in[0], safe, v.w, v.total); });
                }));
}

Cotangents CrossEntropyVjp::operator()(const VjpContext& c) const {
  Array dz = Array::empty(c.inputs[0].shape(), c.inputs[0].dtype());
  const double g = c.grad_output.flat(0);
  detail::dispatch(dz.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pz = c.inputs[0].data<T>();
    T* pd = dz.data<T>();
    detail::parallel_for(N, xent_grain(C), [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t r = lo; r < hi; ++r) {
        T* dr = pd + r * C;
        const double wr = w.flat(r);
        if (wr == 0) {
          std::fill(dr, dr + C, T(0));
          continue;
        }
        const T* zr = pz + r * C;
        const T l = static_cast<T>((*lse)[r]);
        for (std::size_t j = 0; j < C; ++j) dr[j] = zr[j] - l;
        vmath::exp(dr, dr, C);
        const T scale = static_cast<T>(g * wr / total);
        for (std::size_t j = 0; j < C; ++j) dr[j] *= scale;
        dr[tgt[r]] -= scale;
      }
    });
  });
  return Cotangents{dz};
}

Tensor cross_entropy_impl(const Tensor& logits, const IndexArray& targets, const CrossEntropyOptions& opts,
                          bool composed) {
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
  if (composed) return composed_loss(logits, safe, w, total);
  return fused_cross_entropy(logits, safe.data, w, total);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const IndexArray& targets, const CrossEntropyOptions& opts) {
  return cross_entropy_impl(logits, targets, opts, false);
}

Tensor cross_entropy_composed(const Tensor& logits, const IndexArray& targets, const CrossEntropyOptions& opts) {
  return cross_entropy_impl(logits, targets, opts, true);
}

Tensor mse(const Tensor& a, const Tensor& b) {
  check::same_dtype("mse", "a", a, "b", b);
  check::same_shape("mse", "a", a.shape(), "b", b.shape());
  const Tensor d = a - b;
  return mean(d * d);
}

}  // namespace xg::ops
