/// \file
/// Module: owns named parameters and child modules, with hierarchical names
/// ("blocks.0.attn.W_QKV"), train/eval mode, zero_grad and frozen (not trainable) parameters.
/// Modules take their random generator explicitly. A module is neither copyable nor movable:
/// children register by address.
#pragma once

#include <functional>
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

  /// The trainable parameters (those that require grad), in the order of named_parameters():
  /// what an optimizer is given, so that frozen parameters get no optimizer state.
  std::vector<std::pair<std::string, Tensor>> named_trainable_parameters() const;
  /// The trainable parameters, in the order of named_trainable_parameters().
  std::vector<Tensor> trainable_parameters() const;
  /// Number of scalars over the trainable parameters.
  std::size_t trainable_parameter_count() const;
  /// Sets requires_grad to `on` for every parameter whose path `select` accepts and returns
  /// how many it accepted (0 is not an error here). A frozen parameter (requires_grad false)
  /// gets no gradient: the ops that use it skip its cotangent, so backward neither computes
  /// nor accumulates one. Freezing also drops the gradient it had.
  std::size_t set_requires_grad(const std::function<bool(const std::string&)>& select, bool on);
  /// Freezes the parameters whose path the regular expression `pattern` (ECMAScript) matches
  /// anywhere (std::regex_search: "attn" matches "blocks.0.attn.W_QKV"; anchor with ^ and $);
  /// returns how many. A pattern that does not compile or matches no parameter is a ValueError
  /// naming it. Whether freezing every parameter is an error is the caller's to decide:
  /// compare the count with named_parameters().size().
  std::size_t freeze(const std::string& pattern);
  /// Makes the parameters matched by `pattern` trainable again, as freeze() selects them;
  /// returns how many (ValueError as for freeze()).
  std::size_t unfreeze(const std::string& pattern);

  /// Replaces every parameter's value with the array of the same name in `weights` (copied).
  /// Strict: every parameter must be given exactly once, with its shape and dtype, and nothing
  /// else: a missing or unknown name is a ValueError listing the names, a wrong shape a
  /// ShapeError, a wrong dtype a DTypeError naming both dtypes. Nothing changes when it throws.
  void set_weights(const std::vector<std::pair<std::string, Array>>& weights);

  /// Moves every parameter's values into one block of memory per dtype, each parameter a view of
  /// its own 64-byte-aligned part, and returns the block's bytes (all dtypes). Values, shapes,
  /// names, gradients and requires_grad stay as they were; a parameter shared by two paths
  /// moves once. For decoding: a step reads every weight once, and one block of many MiB lies
  /// on huge pages where the layers' separate matrices of under 2 MiB would not
  /// (xg::set_huge_pages; docs/performance.md, "Huge pages"). An optimizer step replaces the
  /// values it updates by arrays of their own, so training undoes the packing as it goes; so
  /// does set_weights(). While it copies, the model's size is held twice; then the blocks the
  /// parameters left go back to the system (xg::release_cached_memory(), which also returns
  /// every other cached block).
  std::size_t pack_parameters();

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
  /// must outlive this module's use (it is usually a member). An empty `name` adds the
  /// child's parameters under their own paths, as if they were this module's (an adapter's
  /// `lora_A` on a Linear appears as `<layer>.lora_A`); a path that would then appear twice
  /// is a ValueError.
  void register_module(const std::string& name, Module& child);
  /// Removes a child registered by register_module() (adapters that are merged or
  /// detached); ValueError if `child` is not a child of this module.
  void unregister_module(const Module& child);

 private:
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

}  // namespace xg::nn
