// Optimizers (SGD with momentum, Adam, AdamW with decoupled weight decay), gradient clipping
// by global norm, and the warmup + cosine learning-rate schedule. Optimizers hold their
// parameters by name (Module::named_parameters) so their state can be saved and restored
// exactly (checkpoints, resume).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using NamedArrays = std::vector<std::pair<std::string, Array>>;

class Optimizer {
 public:
  explicit Optimizer(NamedTensors params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;

  // One update from the parameters' current .grad() (parameters without a gradient are
  // skipped), then step_count() + 1.
  void step();
  void zero_grad();

  double lr = 1e-3;
  std::int64_t step_count() const { return step_; }

  // State for checkpoints: every moment buffer by "<param name>.<buffer>", plus the step.
  NamedArrays state() const;
  void load_state(const NamedArrays& state, std::int64_t step);  // names and shapes must match
  virtual std::string kind() const = 0;

 protected:
  virtual void update(std::size_t i, const Tensor& p, const Array& g) = 0;
  // Buffer b of parameter i (created zero on first use; references stay valid).
  Array& buffer(std::size_t i, const std::string& b);

  NamedTensors params_;
  std::int64_t step_ = 0;

 private:
  std::vector<std::deque<std::pair<std::string, Array>>> buffers_;  // deque: stable references
};

class SGD : public Optimizer {
 public:
  SGD(NamedTensors params, double lr, double momentum = 0.0, double weight_decay = 0.0);
  std::string kind() const override { return "sgd"; }
  double momentum, weight_decay;

 protected:
  void update(std::size_t i, const Tensor& p, const Array& g) override;
};

// Adam (weight_decay adds wd * p to the gradient, L2 style) and AdamW (decoupled: p -= lr * wd * p).
class Adam : public Optimizer {
 public:
  Adam(NamedTensors params, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
       double weight_decay = 0.0, bool decoupled = false);
  std::string kind() const override { return decoupled ? "adamw" : "adam"; }
  double beta1, beta2, eps, weight_decay;
  bool decoupled;

 protected:
  void update(std::size_t i, const Tensor& p, const Array& g) override;
};

class AdamW : public Adam {
 public:
  AdamW(NamedTensors params, double lr, double weight_decay = 0.01, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8)
      : Adam(std::move(params), lr, beta1, beta2, eps, weight_decay, true) {}
};

// Scales every gradient by min(1, max_norm / total_norm); returns the total L2 norm before
// clipping (like torch.nn.utils.clip_grad_norm_).
double clip_grad_norm(const NamedTensors& params, double max_norm);

// Linear warmup from 0 to lr_max over `warmup` steps, then cosine decay to lr_min at `total`.
double warmup_cosine(std::int64_t step, std::int64_t warmup, std::int64_t total, double lr_max, double lr_min = 0.0);

}  // namespace xg::nn
