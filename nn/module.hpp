// Module: owns named parameters and child modules, with hierarchical names
// ("blocks.0.attn.W_QKV"), train/eval mode and zero_grad. Modules take their random
// generator explicitly. A module is neither copyable nor movable: children register by
// address.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its children, in registration order, named by path.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // The parameter with this path; ValueError listing the known names if there is none.
  Tensor parameter(const std::string& name) const;
  std::size_t parameter_count() const;  // number of scalars

  // Replaces every parameter's value with the array of the same name (copied). Strict: every
  // parameter must be given exactly once, with its shape and dtype, and nothing else: a
  // missing or unknown name is a ValueError listing the names, a wrong shape a ShapeError, a
  // wrong dtype a DTypeError naming both dtypes. Nothing is changed when it throws.
  void set_weights(const std::vector<std::pair<std::string, Array>>& weights);

  void zero_grad();
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

 protected:
  // Registers a leaf that requires grad; returns the handle the module keeps.
  Tensor register_parameter(const std::string& name, Array init);
  void register_module(const std::string& name, Module& child);

 private:
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

}  // namespace xg::nn
