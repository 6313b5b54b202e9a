// Unary elementwise ops, g = cotangent of the output y:
//   neg:     y = -x                 x_bar = -g
//   exp:     y = e^x                x_bar = g * y          (reuses the output)
//   log:     y = ln x               x_bar = g / x
//   sqrt:    y = sqrt x             x_bar = g / (2 y)
//   pow:     y = x^p                x_bar = g * p * x^(p-1)
//   abs:     y = |x|                x_bar = g * sign(x)
//   tanh:    y = tanh x             x_bar = g * (1 - y^2)
//   sigmoid: y = 1/(1+e^-x)         x_bar = g * y (1 - y)
//   relu:    y = max(x, 0)          x_bar = g * [x > 0]
//   gelu:    y = x Phi(x)           x_bar = g * (Phi(x) + x phi(x))
//   gelu~:   y = x/2 (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi); derivative below
//   clamp:   y = min(max(x,lo),hi)  x_bar = g * [lo <= x <= hi]
//   silu:    y = x s, s = sigmoid x x_bar = g * s (1 + x (1 - s))
//   swiglu:  y = silu(a) b          a_bar = g * b * s (1 + a (1 - s)),  b_bar = g * silu(a)
//            (s = sigmoid a; one op for Llama's feed-forward gate, oracle swiglu_composed)
// Second-order rules (create_graph): the formulas above with recorded ops (the output y is
// recorded too); the indicator and sign factors of relu, abs and clamp are constants; exact
// GELU uses the recorded normal CDF Phi below; tanh-GELU, silu, swiglu and bias_gelu
// differentiate their compositions (composed_vjp).
#include <xgrad/ops/unary.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/detail/map.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/vmath.hpp>
#include <xgrad/core/detail/xt.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/shape_ops.hpp>

namespace xg::ops {

namespace {

// Throws if pred(x) holds for some element (domain errors that would make NaN).
template <class Pred>
void check_domain(const std::string& op, const Tensor& x, Pred bad, const std::string& why) {
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* p = x.value().data<T>();
    for (std::size_t i = 0, n = x.size(); i < n; ++i)
      if (bad(static_cast<double>(p[i])))
        throw ValueError(op_message(op, "x has " + std::to_string(p[i]) + " at flat index " +
                                            std::to_string(i) + " (shape " + shape_str(x.shape()) +
                                            "): " + why));
  });
}

// y = f(flat view of x), evaluated by xtensor (vectorised with xsimd).
template <class F> Array vectorised(const Tensor& x, F f) {
  Array y = Array::empty(x.shape(), x.dtype());
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    auto out = flat_view<T>(y);
    xt::noalias(out) = f(flat_view<T>(x.value()));
  });
  return y;
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

}  // namespace

Tensor neg(const Tensor& x) {
  check::defined("neg", "x", x);
  return record("neg", kernels::scale(x.value(), -1.0), {x}, [](const VjpContext& c) {
    return Cotangents{kernels::scale(c.grad_output, -1.0)};
  }, second_order([](const DiffVjpContext& c) { return DiffCotangents{neg(c.grad_output)}; }));
}

Tensor exp(const Tensor& x) {
  check::defined("exp", "x", x);
  Array y = vectorised(x, [](const auto& v) { return xt::exp(v); });
  return record("exp", std::move(y), {x}, [](const VjpContext& c) {
    return Cotangents{kernels::mul(c.grad_output, c.output)};
  }, second_order([](const DiffVjpContext& c) { return DiffCotangents{c.grad_output * c.output}; }));
}

Tensor log(const Tensor& x) {
  check::defined("log", "x", x);
  check_domain("log", x, [](double v) { return v < 0; }, "log of a negative number");
  Array y = vectorised(x, [](const auto& v) { return xt::log(v); });
  return record("log", std::move(y), {x}, [](const VjpContext& c) {
    return Cotangents{kernels::div(c.grad_output, c.inputs[0])};
  }, second_order([](const DiffVjpContext& c) { return DiffCotangents{c.grad_output / c.inputs[0]}; }));
}

Tensor sqrt(const Tensor& x) {
  check::defined("sqrt", "x", x);
  check_domain("sqrt", x, [](double v) { return v < 0; }, "sqrt of a negative number");
  Array y = detail::map1(x.value(), [](auto v) { return std::sqrt(v); });
  return record("sqrt", std::move(y), {x}, [](const VjpContext& c) {
    return Cotangents{detail::map2(c.grad_output, c.output, [](auto g, auto y) { return g / (2 * y); })};
  }, second_order([](const DiffVjpContext& c) { return DiffCotangents{c.grad_output / (c.output * 2.0)}; }));
}

Tensor pow(const Tensor& x, double p) {
  check::defined("pow", "x", x);
  if (p != std::floor(p))
    check_domain("pow", x, [](double v) { return v < 0; },
                 "negative base with non-integer exponent " + std::to_string(p));
  Array y = detail::map1(x.value(), [p](auto v) { return static_cast<decltype(v)>(std::pow(v, p)); });
  return record("pow", std::move(y), {x}, [p](const VjpContext& c) {
    return Cotangents{detail::map2(c.grad_output, c.inputs[0], [p](auto g, auto v) {
      using T = decltype(v);
      return p == 0 ? T(0) : static_cast<T>(g * p * std::pow(v, p - 1));
    })};
  }, second_order([p](const DiffVjpContext& c) {
    if (p == 0) return DiffCotangents{Tensor(Array::zeros(c.inputs[0].shape(), c.inputs[0].dtype()))};
    return DiffCotangents{c.grad_output * (pow(c.inputs[0], p - 1) * p)};
  }));
}

Tensor abs(const Tensor& x) {
  check::defined("abs", "x", x);
  return record("abs", detail::map1(x.value(), [](auto v) { return std::abs(v); }), {x},
                [](const VjpContext& c) {
                  return Cotangents{detail::map2(c.grad_output, c.inputs[0], [](auto g, auto v) {
                    using T = decltype(v);
                    return v > 0 ? g : (v < 0 ? -g : T(0));
                  })};
                },
                second_order([](const DiffVjpContext& c) {
                  const Array sign = detail::map1(c.inputs[0].value(), [](auto v) {
                    using T = decltype(v);
                    return v > 0 ? T(1) : (v < 0 ? T(-1) : T(0));
                  });
                  return DiffCotangents{c.grad_output * Tensor(sign)};
                }));
}

Tensor tanh(const Tensor& x) {
  check::defined("tanh", "x", x);
  Array y = vectorised(x, [](const auto& v) { return xt::tanh(v); });
  return record("tanh", std::move(y), {x}, [](const VjpContext& c) {
    return Cotangents{detail::map2(c.grad_output, c.output, [](auto g, auto y) { return g * (1 - y * y); })};
  }, second_order([](const DiffVjpContext& c) {
    return DiffCotangents{c.grad_output * (1.0 - c.output * c.output)};
  }));
}

Tensor sigmoid(const Tensor& x) {
  check::defined("sigmoid", "x", x);
  // Two branches so neither exp overflows: for v < 0 use e^v / (1 + e^v).
  Array y = detail::map1(x.value(), [](auto v) {
    using T = decltype(v);
    if (v >= 0) return T(1) / (T(1) + std::exp(-v));
    const T e = std::exp(v);
    return e / (T(1) + e);
  });
  return record("sigmoid", std::move(y), {x}, [](const VjpContext& c) {
    return Cotangents{detail::map2(c.grad_output, c.output, [](auto g, auto y) { return g * y * (1 - y); })};
  }, second_order([](const DiffVjpContext& c) {
    return DiffCotangents{c.grad_output * (c.output * (1.0 - c.output))};
  }));
}

Tensor relu(const Tensor& x) {
  check::defined("relu", "x", x);
  Array y = detail::map1(x.value(), [](auto v) { return v > 0 ? v : decltype(v)(0); });
  return record("relu", std::move(y), {x}, [](const VjpContext& c) {
    return Cotangents{detail::map2(c.grad_output, c.inputs[0], [](auto g, auto v) {
      return v > 0 ? g : decltype(g)(0);
    })};
  }, second_order([](const DiffVjpContext& c) {
    const Array& x = c.inputs[0].value();
    BoolArray pos(x.shape(), std::vector<unsigned char>(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i) pos.data[i] = x.flat(i) > 0 ? 1 : 0;
    return DiffCotangents{where(pos, c.grad_output, scalar_like(c.grad_output, 0.0))};
  }));
}

namespace {

// Exact GELU in float32: y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2, with erf from the
// vectorised float kernels (core/detail/vmath.hpp); Phi is kept for the VJP, which then needs only
// phi(x) = exp(-x^2 / 2) / sqrt(2 pi):  x_bar = g (Phi + x phi).
constexpr std::size_t kTile = 256;

void gelu_forward_f32(const float* x, float* y, float* Phi, std::size_t n) {
  detail::parallel_for(n, std::size_t{1} << 13, [&](std::size_t lo, std::size_t hi, std::size_t) {
    float t[kTile];
    for (std::size_t s = lo; s < hi; s += kTile) {
      const std::size_t m = std::min(kTile, hi - s);
      for (std::size_t i = 0; i < m; ++i) t[i] = x[s + i] * static_cast<float>(kInvSqrt2);
      vmath::erf(t, t, m);
      for (std::size_t i = 0; i < m; ++i) {
        const float p = 0.5f * (1.0f + t[i]);
        Phi[s + i] = p;
        y[s + i] = x[s + i] * p;
      }
    }
  });
}

void gelu_backward_f32(const float* x, const float* Phi, const float* g, float* d, std::size_t n) {
  detail::parallel_for(n, std::size_t{1} << 13, [&](std::size_t lo, std::size_t hi, std::size_t) {
    float t[kTile];
    for (std::size_t s = lo; s < hi; s += kTile) {
      const std::size_t m = std::min(kTile, hi - s);
      for (std::size_t i = 0; i < m; ++i) t[i] = -0.5f * x[s + i] * x[s + i];
      vmath::exp(t, t, m);
      for (std::size_t i = 0; i < m; ++i)
        d[s + i] = g[s + i] * (Phi[s + i] + x[s + i] * static_cast<float>(kInvSqrt2Pi) * t[i]);
    }
  });
}

}  // namespace

namespace {

// phi(x) = exp(-x^2 / 2) / sqrt(2 pi), recorded.
Tensor normal_pdf(const Tensor& x) { return exp(x * x * -0.5) * kInvSqrt2Pi; }

// The standard normal CDF Phi(x) = (1 + erf(x / sqrt 2)) / 2 as a recorded op, for exact
// GELU's second-order rule: Phi' = phi, itself recorded, so every order is available.
Tensor normal_cdf(const Tensor& x) {
  Array y = detail::map1(x.value(), [](auto v) {
    using T = decltype(v);
    return static_cast<T>(0.5 * (1.0 + std::erf(v * kInvSqrt2)));
  });
  return record(
      "normal_cdf", std::move(y), {x},
      [](const VjpContext& c) {
        return Cotangents{detail::map2(c.grad_output, c.inputs[0], [](auto g, auto v) {
          using T = decltype(v);
          return static_cast<T>(g * kInvSqrt2Pi * std::exp(-0.5 * double(v) * v));
        })};
      },
      second_order([](const DiffVjpContext& c) { return DiffCotangents{c.grad_output * normal_pdf(c.inputs[0])}; }));
}

Tensor gelu_backward(const Tensor& x, const Tensor& b, const Tensor& g);  // below

// Exact GELU's second-order rule: x_bar = g (Phi(x) + x phi(x)), as one recorded op.
DiffCotangents gelu_rule(const DiffVjpContext& c) { return DiffCotangents{gelu_backward(c.inputs[0], Tensor(), c.grad_output)}; }

}  // namespace

Tensor gelu(const Tensor& x, GeluApprox approx) {
  check::defined("gelu", "x", x);
  if (approx == GeluApprox::none && x.dtype() == DType::float32) {
    Array y = Array::empty(x.shape(), x.dtype());
    auto Phi = std::make_shared<Array>(Array::empty(x.shape(), x.dtype()));
    gelu_forward_f32(x.value().data<float>(), y.data<float>(), Phi->data<float>(), x.size());
    return record("gelu", std::move(y), {x}, [Phi](const VjpContext& c) {
      Array d = Array::empty(c.output.shape(), c.output.dtype());
      gelu_backward_f32(c.inputs[0].data<float>(), Phi->data<float>(), c.grad_output.data<float>(), d.data<float>(),
                        d.size());
      return Cotangents{d};
    }, second_order(gelu_rule));
  }
  if (approx == GeluApprox::none) {  // float64: scalar libm, the reference precision
    Array y = detail::map1(x.value(), [](auto v) {
      using T = decltype(v);
      return static_cast<T>(0.5 * v * (1.0 + std::erf(v * kInvSqrt2)));
    });
    return record("gelu", std::move(y), {x}, [](const VjpContext& c) {
      return Cotangents{detail::map2(c.grad_output, c.inputs[0], [](auto g, auto v) {
        using T = decltype(v);
        const double Phi = 0.5 * (1.0 + std::erf(v * kInvSqrt2));
        const double phi = kInvSqrt2Pi * std::exp(-0.5 * double(v) * v);
        return static_cast<T>(g * (Phi + v * phi));
      })};
    }, second_order(gelu_rule));
  }
  Array y = detail::map1(x.value(), [](auto v) {
    using T = decltype(v);
    const double inner = kSqrt2OverPi * (v + 0.044715 * double(v) * v * v);
    return static_cast<T>(0.5 * v * (1.0 + std::tanh(inner)));
  });
  return record("gelu_tanh", std::move(y), {x}, [](const VjpContext& c) {
    return Cotangents{detail::map2(c.grad_output, c.inputs[0], [](auto g, auto v) {
      using T = decltype(v);
      const double u = kSqrt2OverPi * (v + 0.044715 * double(v) * v * v);
      const double th = std::tanh(u);
      const double du = kSqrt2OverPi * (1.0 + 3 * 0.044715 * double(v) * v);
      return static_cast<T>(g * (0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * du));
    })};
  }, second_order([](const DiffVjpContext& c) {
    return composed_vjp(c, [](const std::vector<Tensor>& in) {
      const Tensor& v = in[0];
      return v * 0.5 * (1.0 + tanh((v + v * v * v * 0.044715) * kSqrt2OverPi));
    });
  }));
}

namespace {

void check_bias_gelu(const Tensor& x, const Tensor& b) {
  check::rank_at_least("bias_gelu", "x", x, 1);
  check::rank("bias_gelu", "b", b, 1);
  check::same_dtype("bias_gelu", "x", x, "b", b);
  if (b.shape()[0] != x.shape().back())
    throw ShapeError(op_message("bias_gelu", "b has shape " + shape_str(b.shape()) + ", x " + shape_str(x.shape()) +
                                                 " needs b of shape (" + std::to_string(x.shape().back()) + ")"));
}

// Columns per tile of the fused bias + GELU loops (a row is processed in tiles of this many).
constexpr std::size_t kBiasTile = 256;

// Rows per parallel chunk: about 8K elements.
std::size_t bias_gelu_grain(std::size_t C) { return std::max<std::size_t>(1, (std::size_t{1} << 13) / std::max<std::size_t>(C, 1)); }
// Chunks a thread for a pass that keeps per-chunk column sums (the bias's gradient): one when a
// chunk may be a few rows (C over 1024), so the serial sum of the parts stays small beside the rows.
std::size_t bias_gelu_per_thread(std::size_t C) { return bias_gelu_grain(C) >= 8 ? detail::kChunksPerThread : 1; }

// Phi[i] = (1 + erf(u_i / sqrt 2)) / 2 for u_i = x[i] + b[i] (u_i = x[i] when b is null), i < m:
// the one arithmetic of the normal CDF for every fused GELU pass, so that a pass that computes it
// again (bias_gelu's backward) gets the bits its forward got.
template <class T> void normal_cdf_tile(const T* x, const T* b, std::size_t m, T* Phi) {
  if (b)
    for (std::size_t i = 0; i < m; ++i) Phi[i] = (x[i] + b[i]) * static_cast<T>(kInvSqrt2);
  else
    for (std::size_t i = 0; i < m; ++i) Phi[i] = x[i] * static_cast<T>(kInvSqrt2);
  vmath::erf(Phi, Phi, m);
  for (std::size_t i = 0; i < m; ++i) Phi[i] = T(0.5) * (T(1) + Phi[i]);
}

}  // namespace

namespace {

// Exact GELU's backward pass as one recorded op (the second-order rule of gelu and bias_gelu):
// gelu_backward(x, b, g) = g gelu'(z), z = x + b (b [C] along the last axis; none for gelu),
// with gelu'(z) = Phi(z) + z phi(z) and gelu''(z) = phi(z) (2 - z^2). Its VJP, for the
// cotangent w: g_bar = w gelu'(z), x_bar = w g gelu''(z), b_bar = column sums of x_bar. Its
// own second-order rule writes the same with recorded ops (normal_cdf, normal_pdf), so every
// order is available. One pass each way, against the composed GELU's dozen.

// Calls f(i0, m, z, Phi, phi) for each tile of m <= kBiasTile elements starting at flat index
// i0 (rows of C columns, tiles within a row), rows split over the pool; part index ch for
// per-chunk sums.
template <class T, class F>
void gelu_tiles(const T* x, const T* b, std::size_t N, std::size_t C, F&& f) {
  detail::parallel_for(N, bias_gelu_grain(C), [&](std::size_t lo, std::size_t hi, std::size_t ch) {
    T z[kBiasTile], Phi[kBiasTile], phi[kBiasTile];
    for (std::size_t r = lo; r < hi; ++r)
      for (std::size_t c0 = 0; c0 < C; c0 += kBiasTile) {
        const std::size_t m = std::min(kBiasTile, C - c0), i0 = r * C + c0;
        for (std::size_t i = 0; i < m; ++i) z[i] = x[i0 + i] + (b ? b[c0 + i] : T(0));
        normal_cdf_tile<T>(z, nullptr, m, Phi);
        for (std::size_t i = 0; i < m; ++i) phi[i] = T(-0.5) * z[i] * z[i];
        vmath::exp(phi, phi, m);
        for (std::size_t i = 0; i < m; ++i) phi[i] *= static_cast<T>(kInvSqrt2Pi);
        f(i0, c0, m, z, Phi, phi, ch);
      }
  }, bias_gelu_per_thread(C));
}

struct GeluBackwardVjp {
  bool has_b = false;
  Cotangents operator()(const VjpContext& c) const {
    const std::size_t ig = has_b ? 2 : 1;
    const Array& X = c.inputs[0];
    const std::size_t C = has_b ? X.shape().back() : std::max<std::size_t>(X.size(), 1);
    const std::size_t N = X.size() ? X.size() / C : 0;
    Cotangents cot(ig + 1);
    detail::dispatch(X.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = X.data<T>();
      const T* pb = has_b ? c.inputs[1].data<T>() : nullptr;
      const T* pg = c.inputs[ig].data<T>();
      const T* pw = c.grad_output.data<T>();
      const bool want_x = c.needs(0) || (has_b && c.needs(1)), want_g = c.needs(ig);
      Array dx = want_x ? Array::empty(X.shape(), X.dtype()) : Array();
      Array dg = want_g ? Array::empty(X.shape(), X.dtype()) : Array();
      T* pdx = want_x ? dx.data<T>() : nullptr;
      T* pdg = want_g ? dg.data<T>() : nullptr;
      const bool want_b = has_b && c.needs(1);
      const std::size_t chunks = detail::parallel_chunks(N, bias_gelu_grain(C), bias_gelu_per_thread(C));
      std::vector<T> part(want_b ? chunks * C : 0, T(0));
      gelu_tiles(px, pb, N, C, [&](std::size_t i0, std::size_t c0, std::size_t m, const T* z, const T* Phi,
                                   const T* phi, std::size_t ch) {
        for (std::size_t i = 0; i < m; ++i) {
          const T w = pw[i0 + i];
          if (pdg) pdg[i0 + i] = w * (Phi[i] + z[i] * phi[i]);
          if (pdx) pdx[i0 + i] = w * pg[i0 + i] * phi[i] * (T(2) - z[i] * z[i]);
        }
        if (want_b)
          for (std::size_t i = 0; i < m; ++i) part[ch * C + c0 + i] += pdx[i0 + i];
      });
      if (c.needs(0)) cot[0] = dx;
      if (want_b) {
        Array gb = Array::zeros({C}, X.dtype());
        T* pgb = gb.data<T>();
        for (std::size_t ch = 0; ch < chunks; ++ch)
          for (std::size_t j = 0; j < C; ++j) pgb[j] += part[ch * C + j];
        cot[1] = gb;
      }
      if (want_g) cot[ig] = dg;
    });
    return cot;
  }
};

// g gelu'(x + b) recorded (b undefined: gelu's own).
Tensor gelu_backward(const Tensor& x, const Tensor& b, const Tensor& g) {
  const bool has_b = b.defined();
  const std::size_t C = has_b ? x.shape().back() : std::max<std::size_t>(x.size(), 1);
  const std::size_t N = x.size() ? x.size() / C : 0;
  Array out = Array::empty(x.shape(), x.dtype());
  detail::dispatch(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pg = g.value().data<T>();
    T* po = out.data<T>();
    gelu_tiles(x.value().data<T>(), has_b ? b.value().data<T>() : nullptr, N, C,
               [&](std::size_t i0, std::size_t, std::size_t m, const T* z, const T* Phi, const T* phi, std::size_t) {
                 for (std::size_t i = 0; i < m; ++i) po[i0 + i] = pg[i0 + i] * (Phi[i] + z[i] * phi[i]);
               });
  });
  const auto rule = second_order([](const DiffVjpContext& c) {
    const bool hb = c.inputs.size() == 3;
    const Tensor& x = c.inputs[0];
    const Tensor z = hb ? x + c.inputs[1] : x;
    const Tensor& g = c.inputs[hb ? 2 : 1];
    const Tensor& w = c.grad_output;
    DiffCotangents cot(c.inputs.size());
    const Tensor pdf = normal_pdf(z);
    if (c.needs(0) || (hb && c.needs(1))) {
      const Tensor dz = w * g * pdf * (2.0 - z * z);
      if (c.needs(0)) cot[0] = dz;
      if (hb && c.needs(1)) cot[1] = sum_to(dz, c.inputs[1].shape());
    }
    if (c.needs(hb ? 2 : 1)) cot[hb ? 2 : 1] = w * (normal_cdf(z) + z * pdf);
    return cot;
  });
  if (has_b) return record("gelu_backward", std::move(out), {x, b, g}, GeluBackwardVjp{true}, rule);
  return record("gelu_backward", std::move(out), {x, g}, GeluBackwardVjp{false}, rule);
}

}  // namespace

// Forward: per tile u = x + b, Phi = (1 + erf(u / sqrt 2)) / 2 (kept for the VJP, see below), y = u Phi.
// VJP: e = exp(-u^2 / 2), x_bar = g (Phi + u e / sqrt(2 pi)); b_bar = column sums of x_bar, per
// chunk of rows, the chunks added in order (deterministic for a thread count). Phi is kept from
// the forward, except for float32 inputs of kBiasGeluRecompute elements and more: there the
// backward computes it again from x and b by the same arithmetic (the same bits). At those sizes
// Phi has left the caches by the backward, and the vector erf costs less than writing it out and
// reading it back (step M's [2048, 1024]: the op 1.2x faster, forward and backward); smaller
// ones stay in cache, where keeping it is faster (step S's [1024, 256]: 1.1x), and float64's
// scalar libm erf is slow to redo. Not keeping it also frees an activation-sized buffer
// (PyTorch's GELU saves only its input).
constexpr std::size_t kBiasGeluRecompute = std::size_t(1) << 20;
Tensor bias_gelu(const Tensor& x, const Tensor& b) {
  check_bias_gelu(x, b);
  const std::size_t C = x.shape().back(), N = C ? x.size() / C : 0;
  Array y = Array::empty(x.shape(), x.dtype());
  auto Phi = std::make_shared<Array>();
  if (x.dtype() != DType::float32 || x.size() < kBiasGeluRecompute) *Phi = Array::empty(x.shape(), x.dtype());
  detail::dispatch(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.value().data<T>();
    const T* pb = b.value().data<T>();
    T* py = y.data<T>();
    T* pp = Phi->defined() ? Phi->data<T>() : nullptr;
    detail::parallel_for(N, bias_gelu_grain(C), [&](std::size_t lo, std::size_t hi, std::size_t) {
      T t[kBiasTile];
      for (std::size_t r = lo; r < hi; ++r)
        for (std::size_t c0 = 0; c0 < C; c0 += kBiasTile) {
          const std::size_t m = std::min(kBiasTile, C - c0);
          const T* xr = px + r * C + c0;
          normal_cdf_tile(xr, pb + c0, m, t);  // Phi
          T* yr = py + r * C + c0;
          if (pp) std::copy(t, t + m, pp + r * C + c0);
          for (std::size_t i = 0; i < m; ++i) yr[i] = (xr[i] + pb[c0 + i]) * t[i];
        }
    });
  });
  return record("bias_gelu", std::move(y), {x, b}, [N, C, Phi](const VjpContext& c) {
    Cotangents cot(2);
    detail::dispatch(c.output.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* px = c.inputs[0].data<T>();
      const T* pb = c.inputs[1].data<T>();
      const T* pg = c.grad_output.data<T>();
      const T* pp = Phi->defined() ? Phi->data<T>() : nullptr;
      Array dx = Array::empty(c.inputs[0].shape(), c.inputs[0].dtype());
      T* pdx = dx.data<T>();
      const bool want_b = c.needs(1);
      const std::size_t chunks = detail::parallel_chunks(N, bias_gelu_grain(C), bias_gelu_per_thread(C));
      std::vector<T> part(want_b ? chunks * C : 0, T(0));
      detail::parallel_for(N, bias_gelu_grain(C), [&](std::size_t lo, std::size_t hi, std::size_t ch) {
        T e[kBiasTile], t[kBiasTile];
        T* db = want_b ? part.data() + ch * C : nullptr;
        for (std::size_t r = lo; r < hi; ++r)
          for (std::size_t c0 = 0; c0 < C; c0 += kBiasTile) {
            const std::size_t m = std::min(kBiasTile, C - c0);
            const T* xr = px + r * C + c0;
            for (std::size_t i = 0; i < m; ++i) {
              const T u = xr[i] + pb[c0 + i];
              e[i] = T(-0.5) * u * u;
            }
            vmath::exp(e, e, m);
            const T* pr = pp ? pp + r * C + c0 : t;
            if (!pp) normal_cdf_tile(xr, pb + c0, m, t);  // Phi again, as the forward computed it
            const T* gr = pg + r * C + c0;
            T* dr = pdx + r * C + c0;
            for (std::size_t i = 0; i < m; ++i) {
              const T u = xr[i] + pb[c0 + i];
              dr[i] = gr[i] * (pr[i] + u * static_cast<T>(kInvSqrt2Pi) * e[i]);
            }
            if (db)
              for (std::size_t i = 0; i < m; ++i) db[c0 + i] += dr[i];
          }
      }, bias_gelu_per_thread(C));
      if (c.needs(0)) cot[0] = dx;
      if (want_b) {
        Array gb = Array::zeros({C}, c.output.dtype());
        T* pgb = gb.data<T>();
        for (std::size_t ch = 0; ch < chunks; ++ch)
          for (std::size_t j = 0; j < C; ++j) pgb[j] += part[ch * C + j];
        cot[1] = gb;
      }
    });
    return cot;
  }, second_order([](const DiffVjpContext& c) {
    const Tensor dz = gelu_backward(c.inputs[0], c.inputs[1], c.grad_output);
    DiffCotangents cot(2);
    if (c.needs(0)) cot[0] = dz;
    if (c.needs(1)) cot[1] = sum_to(dz, c.inputs[1].shape());
    return cot;
  }));
}

Tensor bias_gelu_composed(const Tensor& x, const Tensor& b) {
  check_bias_gelu(x, b);
  return gelu(x + b);
}

namespace {

// SiLU and SwiGLU. s = sigmoid(x) and q = 1 - s = sigmoid(-x) are both formed from
// e = exp(-|x|), which lies in [0, 1]: no exp overflows however negative x is, and q is not
// computed as 1 - s (which is 0 once s rounds to 1). Then
//   silu(x) = x s,   silu'(x) = s + x s (1 - s) = s (1 + x q).
// For finite x the guards below change nothing (s == 0 makes both products 0 anyway); at
// x = -inf they give the limits silu = 0, silu' = 0 instead of -inf * 0 = NaN, and at
// x = +inf silu' = 1 instead of 1 + inf * 0.
template <class T> void sigmoid_pair(const T* x, T* s, T* q, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) s[i] = -std::abs(x[i]);
  vmath::exp(s, s, m);
  for (std::size_t i = 0; i < m; ++i) {
    const T e = s[i], big = T(1) / (T(1) + e), small = e * big;
    s[i] = x[i] >= 0 ? big : small;
    q[i] = x[i] >= 0 ? small : big;
  }
}

template <class T> T silu_value(T x, T s) { return s == T(0) ? T(0) : x * s; }

template <class T> T silu_slope(T x, T s, T q) { return s == T(0) ? T(0) : s * (T(1) + (q == T(0) ? T(0) : x * q)); }

// f(start, m, s, q) for each tile [start, start + m) of x[0, n), on the pool, with s and q of
// that tile.
template <class T, class F> void sigmoid_tiles(const T* x, std::size_t n, F f) {
  detail::parallel_for(n, std::size_t{1} << 13, [&](std::size_t lo, std::size_t hi, std::size_t) {
    T s[kTile], q[kTile];
    for (std::size_t st = lo; st < hi; st += kTile) {
      const std::size_t m = std::min(kTile, hi - st);
      sigmoid_pair(x + st, s, q, m);
      f(st, m, s, q);
    }
  });
}

}  // namespace

namespace {

// SiLU's and SwiGLU's backward passes as recorded ops (their second-order rules), each one
// pass with a fused VJP. With s = sigmoid(a), q = 1 - s:
//   silu'(a) = s (1 + a q),   silu''(a) = s q (2 + a (q - s))
// "silu_backward" (inputs a, [b], g) = g b silu'(a) (b = 1 when absent); its VJP for the
// cotangent w: a_bar = w g b silu''(a), b_bar = w g silu'(a), g_bar = w b silu'(a).
// "silu_value_times" (inputs a, g) = g silu(a); its VJP: a_bar = w g silu'(a), g_bar = w silu(a).
// Their own rules are the same formulas with recorded ops (sigmoid), so every order exists.
template <class T> T silu_curvature(T x, T s, T q) {
  const T sq = s * q;
  return sq == T(0) ? T(0) : sq * (T(2) + x * (q - s));
}

struct SiluBackwardVjp {
  bool has_b = false;
  bool value = false;  // silu_value_times
  Cotangents operator()(const VjpContext& c) const {
    const std::size_t ig = has_b ? 2 : 1;
    const Array& A = c.inputs[0];
    Cotangents cot(ig + 1);
    detail::dispatch(A.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* pa = A.data<T>();
      const T* pb = has_b ? c.inputs[1].data<T>() : nullptr;
      const T* pg = c.inputs[ig].data<T>();
      const T* pw = c.grad_output.data<T>();
      Array da = c.needs(0) ? Array::empty(A.shape(), A.dtype()) : Array();
      Array db = has_b && c.needs(1) ? Array::empty(A.shape(), A.dtype()) : Array();
      Array dg = c.needs(ig) ? Array::empty(A.shape(), A.dtype()) : Array();
      T* pda = da.defined() ? da.data<T>() : nullptr;
      T* pdb = db.defined() ? db.data<T>() : nullptr;
      T* pdg = dg.defined() ? dg.data<T>() : nullptr;
      sigmoid_tiles(pa, A.size(), [&](std::size_t st, std::size_t m, const T* s, const T* q) {
        for (std::size_t i = 0; i < m; ++i) {
          const std::size_t k = st + i;
          const T x = pa[k], w = pw[k], g = pg[k], b = pb ? pb[k] : T(1);
          const T slope = silu_slope(x, s[i], q[i]);
          if (value) {
            if (pda) pda[k] = w * g * slope;
            if (pdg) pdg[k] = w * silu_value(x, s[i]);
          } else {
            if (pda) pda[k] = w * g * b * silu_curvature(x, s[i], q[i]);
            if (pdb) pdb[k] = w * g * slope;
            if (pdg) pdg[k] = w * b * slope;
          }
        }
      });
      cot[0] = da;
      if (has_b) cot[1] = db;
      cot[ig] = dg;
    });
    return cot;
  }
};

// sigmoid-based slope and curvature of silu as recorded Tensors (for the rules).
Tensor silu_slope_recorded(const Tensor& a, const Tensor& s) { return s * (1.0 + a * (1.0 - s)); }

// g b silu'(a) (value false; b undefined: 1) or g silu(a) (value true), recorded as one op.
Tensor silu_backward(const Tensor& a, const Tensor& b, const Tensor& g, bool value) {
  const bool has_b = b.defined();
  Array out = Array::empty(a.shape(), a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.value().data<T>();
    const T* pb = has_b ? b.value().data<T>() : nullptr;
    const T* pg = g.value().data<T>();
    T* po = out.data<T>();
    sigmoid_tiles(pa, a.size(), [&](std::size_t st, std::size_t m, const T* s, const T* q) {
      for (std::size_t i = 0; i < m; ++i) {
        const std::size_t k = st + i;
        po[k] = value ? pg[k] * silu_value(pa[k], s[i]) : pg[k] * (pb ? pb[k] : T(1)) * silu_slope(pa[k], s[i], q[i]);
      }
    });
  });
  const auto rule = second_order([](const DiffVjpContext& c) {
    const SiluBackwardVjp& v = c.first_order_as<SiluBackwardVjp>();
    const std::size_t ig = v.has_b ? 2 : 1;
    const Tensor& x = c.inputs[0];
    const Tensor& g = c.inputs[ig];
    const Tensor& w = c.grad_output;
    const Tensor s = sigmoid(x);
    const Tensor slope = silu_slope_recorded(x, s);
    DiffCotangents cot(c.inputs.size());
    if (v.value) {
      if (c.needs(0)) cot[0] = w * g * slope;
      if (c.needs(ig)) cot[ig] = w * (x * s);
      return cot;
    }
    const Tensor wb = v.has_b ? w * c.inputs[1] : w;
    if (c.needs(0)) cot[0] = wb * g * (s * (1.0 - s) * (2.0 + x * (1.0 - s * 2.0)));
    if (v.has_b && c.needs(1)) cot[1] = w * g * slope;
    if (c.needs(ig)) cot[ig] = wb * slope;
    return cot;
  });
  const std::string name = value ? "silu_value_times" : "silu_backward";
  if (has_b) return record(name, std::move(out), {a, b, g}, SiluBackwardVjp{true, value}, rule);
  return record(name, std::move(out), {a, g}, SiluBackwardVjp{false, value}, rule);
}

}  // namespace

Tensor silu(const Tensor& x) {
  check::defined("silu", "x", x);
  Array y = Array::empty(x.shape(), x.dtype());
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* px = x.value().data<T>();
    T* py = y.data<T>();
    sigmoid_tiles(px, x.size(), [&](std::size_t st, std::size_t m, const T* s, const T*) {
      for (std::size_t i = 0; i < m; ++i) py[st + i] = silu_value(px[st + i], s[i]);
    });
  });
  return record("silu", std::move(y), {x}, [](const VjpContext& c) {
    Array d = Array::empty(c.output.shape(), c.output.dtype());
    detail::dispatch(d.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* px = c.inputs[0].data<T>();
      const T* g = c.grad_output.data<T>();
      T* pd = d.data<T>();
      sigmoid_tiles(px, d.size(), [&](std::size_t st, std::size_t m, const T* s, const T* q) {
        for (std::size_t i = 0; i < m; ++i) pd[st + i] = g[st + i] * silu_slope(px[st + i], s[i], q[i]);
      });
    });
    return Cotangents{d};
  }, second_order([](const DiffVjpContext& c) {
    return DiffCotangents{silu_backward(c.inputs[0], Tensor(), c.grad_output, false)};
  }));
}

Tensor swiglu(const Tensor& a, const Tensor& b) {
  check::same_dtype("swiglu", "a", a, "b", b);
  check::same_shape("swiglu", "a", a.shape(), "b", b.shape());
  Array y = Array::empty(a.shape(), a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* pa = a.value().data<T>();
    const T* pb = b.value().data<T>();
    T* py = y.data<T>();
    sigmoid_tiles(pa, a.size(), [&](std::size_t st, std::size_t m, const T* s, const T*) {
      for (std::size_t i = 0; i < m; ++i) py[st + i] = silu_value(pa[st + i], s[i]) * pb[st + i];
    });
  });
  return record("swiglu", std::move(y), {a, b}, [](const VjpContext& c) {
    const bool want_a = c.needs(0), want_b = c.needs(1);
    Array da = want_a ? Array::empty(c.output.shape(), c.output.dtype()) : Array();
    Array db = want_b ? Array::empty(c.output.shape(), c.output.dtype()) : Array();
    detail::dispatch(c.output.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* pa = c.inputs[0].data<T>();
      const T* pb = c.inputs[1].data<T>();
      const T* g = c.grad_output.data<T>();
      T* pda = want_a ? da.data<T>() : nullptr;
      T* pdb = want_b ? db.data<T>() : nullptr;
      sigmoid_tiles(pa, c.output.size(), [&](std::size_t st, std::size_t m, const T* s, const T* q) {
        const T *a = pa + st, *bb = pb + st, *gg = g + st;
        if (pda) {  // separate loops without branches: each vectorises
          T* da_ = pda + st;
          for (std::size_t i = 0; i < m; ++i) da_[i] = gg[i] * bb[i] * silu_slope(a[i], s[i], q[i]);
        }
        if (pdb) {
          T* db_ = pdb + st;
          for (std::size_t i = 0; i < m; ++i) db_[i] = gg[i] * silu_value(a[i], s[i]);
        }
      });
    });
    return Cotangents{da, db};
  }, second_order([](const DiffVjpContext& c) {
    DiffCotangents cot(2);
    if (c.needs(0)) cot[0] = silu_backward(c.inputs[0], c.inputs[1], c.grad_output, false);
    if (c.needs(1)) cot[1] = silu_backward(c.inputs[0], Tensor(), c.grad_output, true);
    return cot;
  }));
}

Tensor swiglu_composed(const Tensor& a, const Tensor& b) {
  check::same_dtype("swiglu_composed", "a", a, "b", b);
  check::same_shape("swiglu_composed", "a", a.shape(), "b", b.shape());
  return silu(a) * b;
}

Tensor clamp(const Tensor& x, double lo, double hi) {
  check::defined("clamp", "x", x);
  if (!(lo <= hi))
    throw ValueError(op_message("clamp", "lo (" + std::to_string(lo) + ") must not exceed hi (" +
                                             std::to_string(hi) + ")"));
  Array y = detail::map1(x.value(), [lo, hi](auto v) {
    using T = decltype(v);
    return v < T(lo) ? T(lo) : (v > T(hi) ? T(hi) : v);
  });
  return record("clamp", std::move(y), {x}, [lo, hi](const VjpContext& c) {
    return Cotangents{detail::map2(c.grad_output, c.inputs[0], [lo, hi](auto g, auto v) {
      using T = decltype(v);
      return (v >= T(lo) && v <= T(hi)) ? g : T(0);
    })};
  }, second_order([lo, hi](const DiffVjpContext& c) {
    const Array& x = c.inputs[0].value();
    BoolArray in(x.shape(), std::vector<unsigned char>(x.size()));
    detail::dispatch(x.dtype(), [&](auto t) {
      using T = decltype(t);
      const T* px = x.data<T>();
      for (std::size_t i = 0; i < x.size(); ++i) in.data[i] = (px[i] >= T(lo) && px[i] <= T(hi)) ? 1 : 0;
    });
    return DiffCotangents{where(in, c.grad_output, scalar_like(c.grad_output, 0.0))};
  }));
}

}  // namespace xg::ops
