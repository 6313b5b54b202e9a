// Root-mean-square normalisation over the last axis, one op with a hand-written VJP. Per row
// of D features (Zhang and Sennrich 2019, "Root Mean Square Layer Normalization"; Llama):
//   ms = mean x^2,  r = 1 / sqrt(ms + eps),  xh = x r
//   y = xh * w
// VJP, with gh = y_bar * w (gh = y_bar without a weight):
//   dr/dx_j = -r^3 x_j / D, so x_bar_j = r gh_j - r^3 x_j mean(gh x) = r (gh_j - xh_j mean(gh * xh))
//   w_bar = sum over rows of y_bar * xh
// The forward keeps r per row; xh is recomputed. eps > 0 keeps r finite on a row of zeros
// (r = 1/sqrt(eps), y = 0, x_bar = r gh). The mean square is accumulated in double in both
// dtypes, so float32 rows with |x| up to float's maximum do not overflow to r = 0.
// rms_norm_composed() builds the same function from mul, mean, add, sqrt and div: the test
// oracle for this VJP. Under create_graph x_bar is one recorded op, rms_norm_backward (ops/norm_backward.cpp).
#include <xgrad/ops/rms_norm.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include <xgrad/core/check.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/ops/detail/norm_backward.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/unary.hpp>

namespace xg::ops {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void check_args(const char* op, const Tensor& x, const Tensor& weight, double eps) {
  check::rank_at_least(op, "x", x, 1);
  if (!(eps > 0) || !std::isfinite(eps))
    throw ValueError(op_message(op, "eps must be positive and finite, got " + num(eps)));
  if (!weight.defined()) return;
  check::same_dtype(op, "x", x, "weight", weight);
  const Shape feat{x.shape().back()};
  if (weight.shape() != feat)
    throw ShapeError(op_message(op, "weight has shape " + shape_str(weight.shape()) + ", expected " + shape_str(feat) +
                                        " for x of shape " + shape_str(x.shape())));
}

constexpr std::size_t kRowsGrain = 64;

}  // namespace

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_args("rms_norm", x, weight, eps);
  const std::size_t D = x.shape().back(), N = D ? x.size() / D : 0;
  const bool has_w = weight.defined();
  Array y = Array::empty(x.shape(), x.dtype());
  auto rinv = std::make_shared<Array>(Array::empty({N}, x.dtype()));  // r per row
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.value().data<T>();
    const T* pw = has_w ? weight.value().data<T>() : nullptr;
    T* py = y.data<T>();
    T* pr = rinv->data<T>();
    detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t r = lo; r < hi; ++r) {
        const T* xr = px + r * D;
        T* yr = py + r * D;
        double ss = 0;
        for (std::size_t j = 0; j < D; ++j) ss += static_cast<double>(xr[j]) * xr[j];
        const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
        pr[r] = rs;
        if (pw)
          for (std::size_t j = 0; j < D; ++j) yr[j] = xr[j] * rs * pw[j];
        else
          for (std::size_t j = 0; j < D; ++j) yr[j] = xr[j] * rs;
      }
    });
  });
  std::vector<Tensor> inputs{x};
  if (has_w) inputs.push_back(weight);
  return record("rms_norm", std::move(y), inputs, [rinv, has_w, D, N](const VjpContext& c) {
    Cotangents cot(c.inputs.size());
    detail::dispatch(c.output.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* px = c.inputs[0].data<T>();
      const T* pw = has_w ? c.inputs[1].data<T>() : nullptr;
      const T* gy = c.grad_output.data<T>();
      const T* pr = rinv->data<T>();
      Array dx = c.needs(0) ? Array::empty(c.inputs[0].shape(), c.inputs[0].dtype()) : Array();
      T* pdx = dx.defined() ? dx.data<T>() : nullptr;
      const bool want_w = has_w && c.needs(1);
      const std::size_t chunks = detail::parallel_chunks(N, kRowsGrain);
      std::vector<T> part(want_w ? chunks * D : 0, T(0));  // per chunk: partial w_bar
      detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t ch) {
        T* dw = want_w ? part.data() + ch * D : nullptr;
        for (std::size_t r = lo; r < hi; ++r) {
          const T* xr = px + r * D;
          const T* gr = gy + r * D;
          const T rs = pr[r];
          if (dw)
            for (std::size_t j = 0; j < D; ++j) dw[j] += gr[j] * (xr[j] * rs);
          if (!pdx) continue;
          double m = 0;  // mean(gh * xh)
          for (std::size_t j = 0; j < D; ++j) {
            const T gh = pw ? gr[j] * pw[j] : gr[j];
            m += static_cast<double>(gh) * (xr[j] * rs);
          }
          const T mt = static_cast<T>(m / static_cast<double>(D));
          for (std::size_t j = 0; j < D; ++j) {
            const T gh = pw ? gr[j] * pw[j] : gr[j];
            pdx[r * D + j] = rs * (gh - (xr[j] * rs) * mt);
          }
        }
      });
      cot[0] = dx;
      if (want_w) {  // chunk partial sums added in chunk order (deterministic)
        Array dweight = Array::zeros({D}, c.output.dtype());
        T* pdw = dweight.data<T>();
        for (std::size_t ch = 0; ch < chunks; ++ch)
          for (std::size_t j = 0; j < D; ++j) pdw[j] += part[ch * D + j];
        cot[1] = dweight;
      }
    });
    return cot;
  }, second_order([eps, has_w](const DiffVjpContext& c) {
    // create_graph: x_bar as one recorded op (rms_norm_backward); w_bar as a column sum.
    DiffCotangents cot(c.inputs.size());
    if (c.needs(0)) cot[0] = recorded_norm_backward("rms_norm_backward", c, eps, has_w, false);
    if (has_w && c.needs(1))
      cot[1] = sum_to(c.grad_output * rms_norm(c.inputs[0], Tensor(), eps), c.inputs[1].shape());
    return cot;
  }));
}

Tensor rms_norm_composed(const Tensor& x, const Tensor& weight, double eps) {
  check_args("rms_norm_composed", x, weight, eps);
  Tensor y = x / sqrt(mean(x * x, {-1}, true) + eps);
  if (weight.defined()) y = y * weight;
  return y;
}

}  // namespace xg::ops
