// Update rules (g = gradient, t = step after increment):
//   SGD:   g += wd p;  v = mu v + g (if mu > 0);  p -= lr v
//   Adam:  g += wd p (Adam only);  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//          p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps);  AdamW first p -= lr wd p
// Values are replaced (Tensor::set_value), never written in place.
#include <xgrad/nn/optim.hpp>

#include <algorithm>
#include <cmath>

#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/fused_kernels.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/parallel.hpp>

namespace xg::nn {

void Optimizer::step() {
  if (!(std::isfinite(lr) && lr >= 0.0))
    throw ValueError(op_message("optimizer", kind() + " learning rate must be finite and >= 0, got " + std::to_string(lr)));
  if (buffers_.size() != params_.size()) buffers_.resize(params_.size());
  ++step_;
  std::vector<std::size_t> which;
  which.reserve(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].second.has_grad()) which.push_back(i);
  update_all(which);
}

void Optimizer::update_all(const std::vector<std::size_t>& which) {
  for (std::size_t i : which) update(i, params_[i].second, params_[i].second.grad());
}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.zero_grad();
}

Array& Optimizer::buffer(std::size_t i, const std::string& b) {
  if (buffers_.size() != params_.size()) buffers_.resize(params_.size());
  for (auto& [name, a] : buffers_[i])
    if (name == b) return a;
  const Tensor& p = params_[i].second;
  buffers_[i].emplace_back(b, Array::zeros(p.shape(), p.dtype()));
  return buffers_[i].back().second;
}

NamedArrays Optimizer::state() const {
  NamedArrays out;
  for (std::size_t i = 0; i < buffers_.size(); ++i)
    for (const auto& [b, a] : buffers_[i]) out.emplace_back(params_[i].first + "." + b, a);
  return out;
}

void Optimizer::load_state(const NamedArrays& state, std::int64_t step) {
  buffers_.assign(params_.size(), {});
  for (const auto& [key, a] : state) {
    bool found = false;
    for (std::size_t i = 0; i < params_.size() && !found; ++i) {
      const std::string& name = params_[i].first;
      if (key.size() > name.size() + 1 && key.compare(0, name.size(), name) == 0 && key[name.size()] == '.' &&
          key.find('.', name.size() + 1) == std::string::npos) {
        const Tensor& p = params_[i].second;
        if (a.shape() != p.shape() || a.dtype() != p.dtype())
          throw ShapeError(op_message("optimizer", "state '" + key + "' has shape " + shape_str(a.shape()) +
                                                       ", parameter '" + name + "' has shape " + shape_str(p.shape())));
        buffers_[i].emplace_back(key.substr(name.size() + 1), a.clone());
        found = true;
      }
    }
    if (!found) throw ValueError(op_message("optimizer", "state '" + key + "' matches no parameter"));
  }
  step_ = step;
}

SGD::SGD(NamedTensors params, double lr_, double momentum_, double wd)
    : Optimizer(std::move(params)), momentum(momentum_), weight_decay(wd) {
  lr = lr_;
}

void SGD::update(std::size_t i, const Tensor& p, const Array& g) {
  Array next = p.value().clone();
  Array* v = momentum > 0 ? &buffer(i, "momentum") : nullptr;
  detail::dispatch(p.dtype(), [&](auto t) {
    using T = decltype(t);
    T* x = next.data<T>();
    const T* gg = g.data<T>();
    T* vv = v ? v->data<T>() : nullptr;
    for (std::size_t k = 0, n = next.size(); k < n; ++k) {
      T d = gg[k] + T(weight_decay) * x[k];
      if (vv) d = vv[k] = T(momentum) * vv[k] + d;
      x[k] -= T(lr) * d;
    }
  });
  Tensor(p).set_value(std::move(next));
}

Adam::Adam(NamedTensors params, double lr_, double b1, double b2, double eps_, double wd, bool dec)
    : Optimizer(std::move(params)), beta1(b1), beta2(b2), eps(eps_), weight_decay(wd), decoupled(dec) {
  lr = lr_;
}

void Adam::update(std::size_t i, const Tensor& p, const Array& g) {
  Array next = p.value().clone();
  Array& m = buffer(i, "exp_avg");
  Array& v = buffer(i, "exp_avg_sq");
  const double c1 = 1.0 - std::pow(beta1, static_cast<double>(step_));
  const double c2 = 1.0 - std::pow(beta2, static_cast<double>(step_));
  detail::dispatch(p.dtype(), [&](auto t) {
    using T = decltype(t);
    T* x = next.data<T>();
    const T* gg = g.data<T>();
    T* mm = m.data<T>();
    T* vv = v.data<T>();
    for (std::size_t k = 0, n = next.size(); k < n; ++k) {
      T d = gg[k];
      if (decoupled)
        x[k] -= T(lr * weight_decay) * x[k];
      else
        d += T(weight_decay) * x[k];
      mm[k] = T(beta1) * mm[k] + T(1 - beta1) * d;
      vv[k] = T(beta2) * vv[k] + T(1 - beta2) * d * d;
      x[k] -= T(lr) * (mm[k] / T(c1)) / (std::sqrt(vv[k] / T(c2)) + T(eps));
    }
  });
  Tensor(p).set_value(std::move(next));
}

void Adam::update_all(const std::vector<std::size_t>& which) {
  // float32 parameters: one pass over all of them, split over the pool by element count (a
  // partition that depends only on the sizes and the thread count), each element updated by
  // the same formula as update(); new value arrays replace the old ones as there.
  struct Segment {
    const float* p;
    const float* g;
    float* m;
    float* v;
    float* out;
    std::size_t n, begin;  // elements, offset in the concatenation
  };
  std::vector<Segment> segs;
  std::vector<std::pair<std::size_t, Array>> next;
  std::size_t total = 0;
  for (std::size_t i : which) {
    const Tensor& p = params_[i].second;
    if (p.dtype() != DType::float32) {
      update(i, p, p.grad());
      continue;
    }
    Array& m = buffer(i, "exp_avg");
    Array& v = buffer(i, "exp_avg_sq");
    next.emplace_back(i, Array::empty(p.shape(), p.dtype()));
    segs.push_back({p.value().data<float>(), p.grad().data<float>(), m.data<float>(), v.data<float>(),
                    next.back().second.data<float>(), p.size(), total});
    total += p.size();
  }
  if (segs.empty()) return;
  const double c1 = 1.0 - std::pow(beta1, static_cast<double>(step_));
  const double c2 = 1.0 - std::pow(beta2, static_cast<double>(step_));
  fused::AdamScalars s{};
  s.lr = static_cast<float>(lr);
  s.lr_wd = static_cast<float>(lr * weight_decay);
  s.wd = static_cast<float>(weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.c1 = static_cast<float>(c1);
  s.c2 = static_cast<float>(c2);
  s.eps = static_cast<float>(eps);
  s.decoupled = decoupled;
  detail::parallel_for(total, std::size_t{1} << 15, [&](std::size_t lo, std::size_t hi, std::size_t) {
    // the first segment that ends after lo, then every segment overlapping [lo, hi)
    auto it = std::upper_bound(segs.begin(), segs.end(), lo,
                               [](std::size_t x, const Segment& sg) { return x < sg.begin + sg.n; });
    for (; it != segs.end() && it->begin < hi; ++it) {
      const std::size_t a = std::max(lo, it->begin) - it->begin, b = std::min(hi, it->begin + it->n) - it->begin;
      fused::adam_update(it->p + a, it->g + a, it->m + a, it->v + a, it->out + a, b - a, s);
    }
  });
  for (auto& [i, a] : next) Tensor(params_[i].second).set_value(std::move(a));
}

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  if (!(std::isfinite(max_norm) && max_norm > 0.0))  // negative would reverse the gradient
    throw ValueError(op_message("clip_grad_norm", "max_norm must be finite and > 0, got " + std::to_string(max_norm)));
  double sq = 0;
  for (const auto& [name, p] : params) {
    if (!p.has_grad()) continue;
    for (double v : p.grad().to_vector()) sq += v * v;
  }
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm))
    throw ValueError(op_message("clip_grad_norm", "the gradient norm is not finite (" + std::to_string(norm) + ")"));
  if (norm > max_norm && norm > 0) {
    const double s = max_norm / norm;
    for (const auto& [name, p] : params) {
      if (!p.has_grad()) continue;
      Array g = p.grad().clone();
      for (std::size_t k = 0; k < g.size(); ++k) g.set_flat(k, g.flat(k) * s);
      Tensor(p).set_grad(std::move(g));
    }
  }
  return norm;
}

double warmup_cosine(std::int64_t step, std::int64_t warmup, std::int64_t total, double lr_max, double lr_min) {
  if (warmup > 0 && step < warmup) return lr_max * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (step >= total) return lr_min;
  const double progress = static_cast<double>(step - warmup) / static_cast<double>(std::max<std::int64_t>(1, total - warmup));
  return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace xg::nn
