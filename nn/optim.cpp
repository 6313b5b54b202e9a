// Update rules (g = gradient, t = step after increment):
//   SGD:   g += wd p;  v = mu v + g (if mu > 0);  p -= lr v
//   Adam:  g += wd p (Adam only);  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//          p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps);  AdamW first p -= lr wd p
// Values are replaced (Tensor::set_value), never written in place.
#include <xgrad/nn/optim.hpp>

#include <cmath>

#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/storage.hpp>

namespace xg::nn {

void Optimizer::step() {
  if (!(std::isfinite(lr) && lr >= 0.0))
    throw ValueError(op_message("optimizer", kind() + " learning rate must be finite and >= 0, got " + std::to_string(lr)));
  if (buffers_.size() != params_.size()) buffers_.resize(params_.size());
  ++step_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    if (!p.has_grad()) continue;
    update(i, p, p.grad());
  }
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
