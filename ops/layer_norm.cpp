// Layer normalisation over the last axis, one op with a hand-written VJP. Per row of D
// features (population variance, as torch.nn.LayerNorm):
//   mu = mean x,  var = mean (x - mu)^2,  r = 1 / sqrt(var + eps),  xh = (x - mu) r
//   y = xh * gamma + beta
// VJP, with gh = y_bar * gamma:
//   x_bar = r (gh - mean(gh) - xh * mean(gh * xh))
//   gamma_bar = sum over rows of y_bar * xh,  beta_bar = sum over rows of y_bar
// The forward keeps mu and r per row; xh is recomputed. layer_norm_composed() builds the same
// function from mean, sub, mul, sqrt and div: the test oracle for this VJP. Under create_graph
// x_bar is one recorded op, layer_norm_backward (ops/norm_backward.cpp), with its own fused VJP.
#include <xgrad/ops/layer_norm.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <vector>

#include <xgrad/core/check.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/fused_kernels.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/ops/detail/norm_backward.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/unary.hpp>

namespace xg::ops {

namespace {

void check_args(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  check::rank_at_least("layer_norm", "x", x, 1);
  if (!(eps > 0) || !std::isfinite(eps)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", eps);
    throw ValueError(op_message("layer_norm", std::string("eps must be positive and finite, got ") + buf));
  }
  const Shape feat{x.shape().back()};
  for (const auto& [name, p] : {std::pair<const char*, const Tensor&>{"gamma", gamma}, {"beta", beta}}) {
    if (!p.defined()) continue;
    check::same_dtype("layer_norm", "x", x, name, p);
    if (p.shape() != feat)
      throw ShapeError(op_message("layer_norm", std::string(name) + " has shape " + shape_str(p.shape()) +
                                                    ", expected " + shape_str(feat) + " for x of shape " +
                                                    shape_str(x.shape())));
  }
}

constexpr std::size_t kRowsGrain = 64;

}  // namespace

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  check_args(x, gamma, beta, eps);
  const std::size_t D = x.shape().back(), N = D ? x.size() / D : 0;
  const bool has_g = gamma.defined(), has_b = beta.defined();
  Array y = Array::empty(x.shape(), x.dtype());
  auto stats = std::make_shared<Array>(Array::empty({N, 2}, x.dtype()));  // (mu, r) per row
  if (x.dtype() == DType::float32) {  // vectorised rows (core/detail/fused_kernels.hpp)
    const float* px = x.value().data<float>();
    const float* pg = has_g ? gamma.value().data<float>() : nullptr;
    const float* pb = has_b ? beta.value().data<float>() : nullptr;
    float* py = y.data<float>();
    float* st = stats->data<float>();
    detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t) {
      fused::layer_norm_forward(px + lo * D, pg, pb, py + lo * D, st + 2 * lo, hi - lo, D, static_cast<float>(eps));
    });
  } else
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.value().data<T>();
    const T* pg = has_g ? gamma.value().data<T>() : nullptr;
    const T* pb = has_b ? beta.value().data<T>() : nullptr;
    T* py = y.data<T>();
    T* st = stats->data<T>();
    detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t r = lo; r < hi; ++r) {
        const T* xr = px + r * D;
        T* yr = py + r * D;
        T mu = 0;
        for (std::size_t j = 0; j < D; ++j) mu += xr[j];
        mu /= static_cast<T>(D);
        T var = 0;
        for (std::size_t j = 0; j < D; ++j) var += (xr[j] - mu) * (xr[j] - mu);
        var /= static_cast<T>(D);
        const T rs = T(1) / std::sqrt(var + static_cast<T>(eps));
        st[2 * r] = mu;
        st[2 * r + 1] = rs;
        for (std::size_t j = 0; j < D; ++j) {
          T v = (xr[j] - mu) * rs;
          if (pg) v *= pg[j];
          if (pb) v += pb[j];
          yr[j] = v;
        }
      }
    });
  });
  std::vector<Tensor> inputs{x};
  if (has_g) inputs.push_back(gamma);
  if (has_b) inputs.push_back(beta);
  return record("layer_norm", std::move(y), inputs, [stats, has_g, has_b, D, N](const VjpContext& c) {
    Cotangents cot(c.inputs.size());
    detail::dispatch(c.output.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* px = c.inputs[0].data<T>();
      const T* pg = has_g ? c.inputs[1].data<T>() : nullptr;
      const T* gy = c.grad_output.data<T>();
      const T* st = stats->data<T>();
      Array dx = c.needs(0) ? Array::empty(c.inputs[0].shape(), c.inputs[0].dtype()) : Array();
      T* pdx = dx.defined() ? dx.data<T>() : nullptr;
      const bool want_params = (has_g && c.needs(1)) || (has_b && c.needs(has_g ? 2 : 1));
      const std::size_t chunks = detail::parallel_chunks(N, kRowsGrain);
      std::vector<T> part(want_params ? chunks * 2 * D : 0, T(0));  // per chunk: gamma_bar | beta_bar
      if constexpr (std::is_same_v<T, float>)
        detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t ch) {
          fused::layer_norm_backward(px + lo * D, pg, gy + lo * D, st + 2 * lo, pdx ? pdx + lo * D : nullptr,
                                     want_params ? part.data() + ch * 2 * D : nullptr, hi - lo, D);
        });
      else
      detail::parallel_for(N, kRowsGrain, [&](std::size_t lo, std::size_t hi, std::size_t ch) {
        T* dg = want_params ? part.data() + ch * 2 * D : nullptr;
        for (std::size_t r = lo; r < hi; ++r) {
          const T* xr = px + r * D;
          const T* gr = gy + r * D;
          const T mu = st[2 * r], rs = st[2 * r + 1];
          T m1 = 0, m2 = 0;  // mean(gh), mean(gh * xh)
          for (std::size_t j = 0; j < D; ++j) {
            const T xh = (xr[j] - mu) * rs;
            const T gh = pg ? gr[j] * pg[j] : gr[j];
            m1 += gh;
            m2 += gh * xh;
            if (dg) {
              dg[j] += gr[j] * xh;
              dg[D + j] += gr[j];
            }
          }
          m1 /= static_cast<T>(D);
          m2 /= static_cast<T>(D);
          if (pdx)
            for (std::size_t j = 0; j < D; ++j) {
              const T xh = (xr[j] - mu) * rs;
              const T gh = pg ? gr[j] * pg[j] : gr[j];
              pdx[r * D + j] = rs * (gh - m1 - xh * m2);
            }
        }
      });
      cot[0] = dx;
      if (want_params) {  // chunk partial sums added in chunk order (deterministic)
        Array dgamma = Array::zeros({D}, c.output.dtype()), dbeta = Array::zeros({D}, c.output.dtype());
        T* pgm = dgamma.data<T>();
        T* pbt = dbeta.data<T>();
        for (std::size_t ch = 0; ch < chunks; ++ch)
          for (std::size_t j = 0; j < D; ++j) {
            pgm[j] += part[ch * 2 * D + j];
            pbt[j] += part[ch * 2 * D + D + j];
          }
        std::size_t k = 1;
        if (has_g) cot[k++] = c.needs(1) ? dgamma : Array();
        if (has_b) cot[k] = c.needs(k) ? dbeta : Array();
      }
    });
    return cot;
  }, second_order([eps, has_g, has_b](const DiffVjpContext& c) {
    // x_bar as one recorded op (layer_norm_backward); gamma_bar and beta_bar as column sums.
    DiffCotangents cot(c.inputs.size());
    if (c.needs(0)) cot[0] = recorded_norm_backward("layer_norm_backward", c, eps, has_g, true);
    if (has_g && c.needs(1))
      cot[1] = sum_to(c.grad_output * layer_norm(c.inputs[0], Tensor(), Tensor(), eps), c.inputs[1].shape());
    const std::size_t ib = has_g ? 2 : 1;
    if (has_b && c.needs(ib)) cot[ib] = sum_to(c.grad_output, c.inputs[ib].shape());
    return cot;
  }));
}

Tensor layer_norm_composed(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  check_args(x, gamma, beta, eps);
  const Tensor d = x - mean(x, {-1}, true);
  const Tensor v = mean(d * d, {-1}, true);
  Tensor y = d / sqrt(v + eps);
  if (gamma.defined()) y = y * gamma;
  if (beta.defined()) y = y + beta;
  return y;
}

}  // namespace xg::ops
