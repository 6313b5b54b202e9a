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
// oracle for this VJP. Under create_graph x_bar is one recorded op, rms_norm_backward (below).
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

namespace {

// The backward pass x_bar = r (gh - xh mean(gh xh)), gh = g w, as one recorded op under
// create_graph ("rms_norm_backward", inputs x, [w], g). x_bar = J gh with the symmetric Jacobian
// J = r (I - xh xh^T / D) of xh in x, so for the cotangent u of x_bar, with Ju = r (u - xh
// mean(u xh)) (docs/math.md, as for layer_norm):
//   g_bar = w Ju,   w_bar = sum over rows of g Ju,
//   x_bar' = -r ( <u, x_bar> xh / D + <u, xh> x_bar / D + mean(gh xh) Ju )
// r is recomputed per row (the mean square in double, as the forward). The op's own rule is the
// same map with recorded ops.
struct RmsNormBackwardVjp {
  double eps = 1e-6;
  bool has_w = false;
  Cotangents operator()(const VjpContext& c) const {
    const std::size_t ig = has_w ? 2 : 1;
    const Array& X = c.inputs[0];
    const std::size_t D = X.shape().back(), N = D ? X.size() / D : 0;
    Cotangents cot(ig + 1);
    detail::dispatch(X.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* px = X.data<T>();
      const T* pwt = has_w ? c.inputs[1].data<T>() : nullptr;
      const T* pg = c.inputs[ig].data<T>();
      const T* pu = c.grad_output.data<T>();
      Array dx = c.needs(0) ? Array::empty(X.shape(), X.dtype()) : Array();
      Array dg = c.needs(ig) ? Array::empty(X.shape(), X.dtype()) : Array();
      T* pdx = dx.defined() ? dx.data<T>() : nullptr;
      T* pdg = dg.defined() ? dg.data<T>() : nullptr;
      const bool want_w = has_w && c.needs(1);
      const std::size_t chunks = detail::parallel_chunks(N, kRowsGrain);
      std::vector<T> part(want_w ? chunks * D : 0, T(0));
      detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t ch) {
        std::vector<T> xh(D), ju(D), xb(D);
        const T inv_d = T(1) / static_cast<T>(D);
        for (std::size_t r = lo; r < hi; ++r) {
          const T* xr = px + r * D;
          const T* gr = pg + r * D;
          const T* ur = pu + r * D;
          double ss = 0;
          for (std::size_t j = 0; j < D; ++j) ss += static_cast<double>(xr[j]) * xr[j];
          const T rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
          T cc = 0, mux = 0;  // mean(gh xh), mean(u xh)
          for (std::size_t j = 0; j < D; ++j) {
            xh[j] = xr[j] * rs;
            const T gh = pwt ? gr[j] * pwt[j] : gr[j];
            cc += gh * xh[j];
            mux += ur[j] * xh[j];
          }
          cc *= inv_d;
          mux *= inv_d;
          T f = 0, p = 0;  // <u, x_bar>, <u, xh>
          for (std::size_t j = 0; j < D; ++j) {
            const T gh = pwt ? gr[j] * pwt[j] : gr[j];
            xb[j] = rs * (gh - xh[j] * cc);
            ju[j] = rs * (ur[j] - xh[j] * mux);
            f += ur[j] * xb[j];
            p += ur[j] * xh[j];
          }
          if (pdx)
            for (std::size_t j = 0; j < D; ++j)
              pdx[r * D + j] = -rs * (f * inv_d * xh[j] + p * inv_d * xb[j] + cc * ju[j]);
          if (pdg)
            for (std::size_t j = 0; j < D; ++j) pdg[r * D + j] = pwt ? pwt[j] * ju[j] : ju[j];
          if (want_w)
            for (std::size_t j = 0; j < D; ++j) part[ch * D + j] += gr[j] * ju[j];
        }
      });
      cot[0] = dx;
      if (want_w) {
        Array gw = Array::zeros({D}, X.dtype());
        T* pgw = gw.data<T>();
        for (std::size_t ch = 0; ch < chunks; ++ch)
          for (std::size_t j = 0; j < D; ++j) pgw[j] += part[ch * D + j];
        cot[1] = gw;
      }
      cot[ig] = dg;
    });
    return cot;
  }
};

// x_bar of rms_norm as a recorded op, its value from the op's own first-order VJP.
Tensor rms_norm_backward(const DiffVjpContext& c, double eps, bool has_w) {
  std::vector<Array> values;
  for (const Tensor& in : c.inputs) values.push_back(in.value());
  std::vector<bool> needs(c.inputs.size(), false);
  needs[0] = true;
  Array dx = c.first_order(VjpContext{values, c.output.value(), c.grad_output.value(), needs})[0];
  std::vector<Tensor> inputs{c.inputs[0]};
  if (has_w) inputs.push_back(c.inputs[1]);
  inputs.push_back(c.grad_output);
  return record("rms_norm_backward", std::move(dx), inputs, RmsNormBackwardVjp{eps, has_w},
                second_order([](const DiffVjpContext& cc) {
                  const RmsNormBackwardVjp& v = cc.first_order_as<RmsNormBackwardVjp>();
                  return composed_vjp(cc, [&v](const std::vector<Tensor>& in) {
                    const Tensor& xx = in[0];
                    const Tensor& g = in[v.has_w ? 2 : 1];
                    const Tensor gh = v.has_w ? g * in[1] : g;
                    const Tensor rms = sqrt(mean(xx * xx, {-1}, true) + v.eps);
                    const Tensor xh = xx / rms;
                    return (gh - xh * mean(gh * xh, {-1}, true)) / rms;
                  });
                }));
}

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
    if (c.needs(0)) cot[0] = rms_norm_backward(c, eps, has_w);
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
