#include <xgrad/nn/module.hpp>

#include <xgrad/core/error.hpp>

namespace xg::nn {

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out = params_;
  for (const auto& [prefix, child] : children_)
    for (auto& [name, t] : child->named_parameters()) out.emplace_back(prefix + "." + name, t);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

Tensor Module::parameter(const std::string& name) const {
  std::string known;
  for (auto& [n, t] : named_parameters()) {
    if (n == name) return t;
    known += (known.empty() ? "" : ", ") + n;
  }
  throw ValueError(op_message("module", "no parameter named '" + name + "'; known: " + known));
}

std::size_t Module::parameter_count() const {
  std::size_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.size();
  return n;
}

void Module::zero_grad() {
  for (auto& [name, t] : named_parameters()) t.zero_grad();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Tensor Module::register_parameter(const std::string& name, Array init) {
  for (auto& [n, t] : params_)
    if (n == name) throw ValueError(op_message("module", "parameter '" + name + "' registered twice"));
  Tensor t(std::move(init), true);
  t.set_name(name);
  params_.emplace_back(name, t);
  return t;
}

void Module::register_module(const std::string& name, Module& child) { children_.emplace_back(name, &child); }

}  // namespace xg::nn
