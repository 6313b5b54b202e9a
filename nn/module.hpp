/// \file
/// Module: owns named parameters and child modules, with hierarchical names
/// ("blocks.0.attn.W_QKV"), train/eval mode and zero_grad. Modules take their random
/// generator explicitly. A module is neither copyable nor movable: children register by
/// address.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/tensor.hpp>

/// Neural-network building blocks on the engine: modules, layers, attention, transformer
/// models, optimizers and safetensors files.
namespace xg::nn {

/// Base of every layer and model: named parameters, child modules and train/eval mode.
class Module {
 public:
  Module() = default;           ///< No parameters, no children, training mode.
  virtual ~Module() = default;  ///< Virtual: modules are used through base references.
  Module(const Module&) = delete;             ///< Not copyable (children register by address).
  Module& operator=(const Module&) = delete;  ///< Not copyable.

  /// Every parameter of this module and its children, in registration order, named by path.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  /// Every parameter, in the order of named_parameters().
  std::vector<Tensor> parameters() const;
  /// The parameter with the path `name`; ValueError listing the known names if there is none.
  Tensor parameter(const std::string& name) const;
  /// Number of scalars over all parameters.
  std::size_t parameter_count() const;

  /// Replaces every parameter's value with the array of the same name in `weights` (copied).
  /// Strict: every parameter must be given exactly once, with its shape and dtype, and nothing
  /// else: a missing or unknown name is a ValueError listing the names, a wrong shape a
  /// ShapeError, a wrong dtype a DTypeError naming both dtypes. Nothing changes when it throws.
  void set_weights(const std::vector<std::pair<std::string, Array>>& weights);

  /// Drops every parameter's accumulated gradient.
  void zero_grad();
  /// Sets training mode (`on`) or evaluation mode, for this module and all its children.
  void train(bool on = true);
  /// Evaluation mode: train(false).
  void eval() { train(false); }
  /// Whether the module is in training mode (dropout active).
  bool training() const { return training_; }

 protected:
  /// Registers a leaf that requires grad, named `name` and holding `init`; returns the handle
  /// the module keeps. A name registered twice is a ValueError.
  Tensor register_parameter(const std::string& name, Array init);
  /// Registers `child` under `name`: its parameters appear as `name.path`. The child
  /// must outlive this module's use (it is usually a member).
  void register_module(const std::string& name, Module& child);

 private:
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

}  // namespace xg::nn
