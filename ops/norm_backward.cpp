// The backward pass of layer_norm (center) and rms_norm as one recorded op under create_graph:
//   x_bar = r (gh - [mean(gh)] - xh mean(gh xh)),  gh = g gamma,
// xh = (x - [mu]) r (the bracketed terms for layer_norm only). x_bar = J gh with the symmetric
// Jacobian J = r (I - [1 1^T / D] - xh xh^T / D) of xh in x, so for the cotangent w of x_bar,
// with Jw = r (w - [mean(w)] - xh mean(w xh)), the same map applied to w (docs/math.md):
//   g_bar = gamma Jw,   gamma_bar = sum over rows of g Jw,
//   x_bar' = -r ( <w, x_bar> xh / D + <w, xh> x_bar / D + mean(gh xh) Jw )
// The row statistics are recomputed as each norm's forward computes them (layer_norm: mean and
// variance in the dtype; rms_norm: the mean square in double). The op's own second-order rule
// differentiates the same map written with recorded ops, so every order is available.
#include <xgrad/ops/detail/norm_backward.hpp>

#include <cmath>
#include <vector>

#include <xgrad/core/parallel.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/unary.hpp>

namespace xg::ops {

namespace {

constexpr std::size_t kRowsGrain = 64;

struct NormBackwardVjp {
  double eps = 1e-5;
  bool has_g = false;
  bool center = true;  // layer_norm (else rms_norm)
  Cotangents operator()(const VjpContext& c) const {
    const std::size_t ig = has_g ? 2 : 1;
    const Array& X = c.inputs[0];
    const std::size_t D = X.shape().back(), N = D ? X.size() / D : 0;
    Cotangents cot(ig + 1);
    detail::dispatch(X.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* px = X.data<T>();
      const T* pgam = has_g ? c.inputs[1].data<T>() : nullptr;
      const T* pg = c.inputs[ig].data<T>();
      const T* pw = c.grad_output.data<T>();
      Array dx = c.needs(0) ? Array::empty(X.shape(), X.dtype()) : Array();
      Array dg = c.needs(ig) ? Array::empty(X.shape(), X.dtype()) : Array();
      T* pdx = dx.defined() ? dx.data<T>() : nullptr;
      T* pdg = dg.defined() ? dg.data<T>() : nullptr;
      const bool want_gamma = has_g && c.needs(1);
      const std::size_t chunks = detail::parallel_chunks(N, kRowsGrain);
      std::vector<T> part(want_gamma ? chunks * D : 0, T(0));
      detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t ch) {
        std::vector<T> xh(D), jw(D), xb(D);
        const T inv_d = T(1) / static_cast<T>(D);
        for (std::size_t r = lo; r < hi; ++r) {
          const T* xr = px + r * D;
          const T* gr = pg + r * D;
          const T* wr = pw + r * D;
          T mu = 0, rs = 0;
          if (center) {
            for (std::size_t j = 0; j < D; ++j) mu += xr[j];
            mu *= inv_d;
            T var = 0;
            for (std::size_t j = 0; j < D; ++j) var += (xr[j] - mu) * (xr[j] - mu);
            rs = T(1) / std::sqrt(var * inv_d + static_cast<T>(eps));
          } else {
            double ss = 0;
            for (std::size_t j = 0; j < D; ++j) ss += static_cast<double>(xr[j]) * xr[j];
            rs = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
          }
          T a = 0, cc = 0, mw = 0, mwx = 0;  // mean(gh), mean(gh xh), mean(w), mean(w xh)
          for (std::size_t j = 0; j < D; ++j) {
            xh[j] = (xr[j] - mu) * rs;
            const T gh = pgam ? gr[j] * pgam[j] : gr[j];
            a += gh;
            cc += gh * xh[j];
            mw += wr[j];
            mwx += wr[j] * xh[j];
          }
          a = center ? a * inv_d : T(0);
          mw = center ? mw * inv_d : T(0);
          cc *= inv_d;
          mwx *= inv_d;
          T f = 0, p = 0;  // <w, x_bar>, <w, xh>
          for (std::size_t j = 0; j < D; ++j) {
            const T gh = pgam ? gr[j] * pgam[j] : gr[j];
            xb[j] = rs * (gh - a - xh[j] * cc);
            jw[j] = rs * (wr[j] - mw - xh[j] * mwx);
            f += wr[j] * xb[j];
            p += wr[j] * xh[j];
          }
          if (pdx)
            for (std::size_t j = 0; j < D; ++j)
              pdx[r * D + j] = -rs * (f * inv_d * xh[j] + p * inv_d * xb[j] + cc * jw[j]);
          if (pdg)
            for (std::size_t j = 0; j < D; ++j) pdg[r * D + j] = pgam ? pgam[j] * jw[j] : jw[j];
          if (want_gamma)
            for (std::size_t j = 0; j < D; ++j) part[ch * D + j] += gr[j] * jw[j];
        }
      });
      cot[0] = dx;
      if (want_gamma) {  // chunk partial sums added in chunk order (deterministic)
        Array gg = Array::zeros({D}, X.dtype());
        T* pgg = gg.data<T>();
        for (std::size_t ch = 0; ch < chunks; ++ch)
          for (std::size_t j = 0; j < D; ++j) pgg[j] += part[ch * D + j];
        cot[1] = gg;
      }
      cot[ig] = dg;
    });
    return cot;
  }
};

}  // namespace

Tensor recorded_norm_backward(const char* name, const DiffVjpContext& c, double eps, bool has_g, bool center) {
  std::vector<Array> values;
  for (const Tensor& in : c.inputs) values.push_back(in.value());
  std::vector<bool> needs(c.inputs.size(), false);
  needs[0] = true;
  Array dx = c.first_order(VjpContext{values, c.output.value(), c.grad_output.value(), needs})[0];
  std::vector<Tensor> inputs{c.inputs[0]};
  if (has_g) inputs.push_back(c.inputs[1]);
  inputs.push_back(c.grad_output);
  return record(name, std::move(dx), inputs, NormBackwardVjp{eps, has_g, center},
                second_order([](const DiffVjpContext& cc) {
                  const NormBackwardVjp& v = cc.first_order_as<NormBackwardVjp>();
                  return composed_vjp(cc, [&v](const std::vector<Tensor>& in) {
                    const Tensor& xx = in[0];
                    const Tensor& g = in[v.has_g ? 2 : 1];
                    const Tensor gh = v.has_g ? g * in[1] : g;
                    const Tensor d = v.center ? xx - mean(xx, {-1}, true) : xx;
                    const Tensor sd = sqrt(mean(d * d, {-1}, true) + v.eps);
                    const Tensor xh = d / sd;
                    const Tensor centred = v.center ? gh - mean(gh, {-1}, true) : gh;
                    return (centred - xh * mean(gh * xh, {-1}, true)) / sd;
                  });
                }));
}

}  // namespace xg::ops
