/// \file
/// Optimizers (SGD with momentum, Adam, AdamW with decoupled weight decay), gradient clipping
/// by global norm, and the warmup + cosine learning-rate schedule. Optimizers hold their
/// parameters by name (Module::named_parameters) so their state can be saved and restored
/// exactly (checkpoints, resume).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg::nn {

/// Parameters by name, as Module::named_parameters() returns them.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
/// Arrays by name (optimizer state, checkpoints).
using NamedArrays = std::vector<std::pair<std::string, Array>>;

/// Base of the optimizers: the parameters, the learning rate, the step count and the
/// per-parameter moment buffers.
class Optimizer {
 public:
  /// An optimizer over the named parameters `params`.
  explicit Optimizer(NamedTensors params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;  ///< Virtual: optimizers are used through base references.

  /// One update from the parameters' current .grad() (parameters without a gradient are
  /// skipped), then step_count() + 1. The learning rate must be finite and >= 0 (ValueError).
  void step();
  /// Drops every parameter's accumulated gradient.
  void zero_grad();

  double lr = 1e-3;  ///< Learning rate; may be changed between steps (schedules).
  /// Number of step() calls so far (or the step restored by load_state()).
  std::int64_t step_count() const { return step_; }

  /// State for checkpoints: every moment buffer by `<param name>.<buffer>`, plus the step.
  NamedArrays state() const;
  /// Restores `state` (as returned by state()) and the step count `step`; names and shapes
  /// must match.
  void load_state(const NamedArrays& state, std::int64_t step);
  /// The optimizer's name: "sgd", "adam" or "adamw".
  virtual std::string kind() const = 0;

 protected:
  /// Updates parameter `p` (number `i`) from its gradient `g`; called by step().
  virtual void update(std::size_t i, const Tensor& p, const Array& g) = 0;
  /// The updates of step(): the parameters `which` (those with a gradient), in order. The
  /// default calls update() for each; Adam updates every float32 parameter in one pass.
  virtual void update_all(const std::vector<std::size_t>& which);
  /// Buffer `b` of parameter `i` (created zero on first use; references stay valid).
  Array& buffer(std::size_t i, const std::string& b);

  NamedTensors params_;    ///< The parameters, by name.
  std::int64_t step_ = 0;  ///< Steps taken.

 private:
  std::vector<std::deque<std::pair<std::string, Array>>> buffers_;  // deque: stable references
};

/// Stochastic gradient descent with optional momentum and L2 weight decay (as torch.optim.SGD).
class SGD : public Optimizer {
 public:
  /// SGD over `params` with learning rate `lr`, `momentum` (0 = none) and `weight_decay`
  /// (adds weight_decay * p to the gradient).
  SGD(NamedTensors params, double lr, double momentum = 0.0, double weight_decay = 0.0);
  std::string kind() const override { return "sgd"; }  ///< "sgd".
  /// The momentum factor and the L2 weight decay. @{
  double momentum, weight_decay;
  /// @}

 protected:
  void update(std::size_t i, const Tensor& p, const Array& g) override;  ///< One SGD update.
};

/// Adam (weight_decay adds wd * p to the gradient, L2 style) and AdamW (decoupled: p -= lr * wd * p).
class Adam : public Optimizer {
 public:
  /// Adam over `params` with learning rate `lr`, moment decay rates `beta1` and `beta2`,
  /// denominator term `eps`, `weight_decay`, decoupled (AdamW) if `decoupled`.
  Adam(NamedTensors params, double lr, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
       double weight_decay = 0.0, bool decoupled = false);
  std::string kind() const override { return decoupled ? "adamw" : "adam"; }  ///< "adam" or "adamw".
  /// Decay rates of the first and second moments, the denominator term and the weight decay. @{
  double beta1, beta2, eps, weight_decay;
  /// @}
  bool decoupled;  ///< AdamW's decoupled weight decay instead of L2.

 protected:
  void update(std::size_t i, const Tensor& p, const Array& g) override;  ///< One Adam update.
  /// Every float32 parameter in one vectorised pass over the pool (core/detail/fused_kernels.hpp);
  /// the others one by one through update().
  void update_all(const std::vector<std::size_t>& which) override;
};

/// Adam with decoupled weight decay (as torch.optim.AdamW).
class AdamW : public Adam {
 public:
  /// AdamW over `params` with learning rate `lr`, `weight_decay` (decoupled), `beta1`, `beta2`
  /// and `eps` as for Adam.
  AdamW(NamedTensors params, double lr, double weight_decay = 0.01, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8)
      : Adam(std::move(params), lr, beta1, beta2, eps, weight_decay, true) {}
};

/// Scales every gradient of `params` by min(1, max_norm / total_norm); returns the total L2
/// norm before clipping (like torch.nn.utils.clip_grad_norm_).
double clip_grad_norm(const NamedTensors& params, double max_norm);

/// The learning rate at `step` (counted from 0): linear warmup to `lr_max` over `warmup`
/// steps (step s < warmup gets lr_max (s + 1) / warmup), then cosine decay to `lr_min` at
/// `total`, and lr_min after it.
double warmup_cosine(std::int64_t step, std::int64_t warmup, std::int64_t total, double lr_max, double lr_min = 0.0);

}  // namespace xg::nn
