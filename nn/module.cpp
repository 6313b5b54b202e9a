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

void Module::set_weights(const std::vector<std::pair<std::string, Array>>& weights) {
  const std::string op = "set_weights";
  const auto params = named_parameters();
  std::string known;
  for (const auto& [n, t] : params) known += (known.empty() ? "" : ", ") + n;
  std::vector<const Array*> found(params.size(), nullptr);
  for (const auto& [name, a] : weights) {
    std::size_t k = 0;
    while (k < params.size() && params[k].first != name) ++k;
    if (k == params.size())
      throw ValueError(op_message(op, "'" + name + "' is not a parameter of this module; its parameters: " + known));
    if (found[k]) throw ValueError(op_message(op, "'" + name + "' is given twice"));
    const Tensor& p = params[k].second;
    if (!a.defined()) throw ValueError(op_message(op, "'" + name + "' is an undefined Array"));
    if (a.dtype() != p.dtype())
      throw DTypeError(op_message(op, "'" + name + "' is " + dtype_name(a.dtype()) + ", the parameter is " +
                                          dtype_name(p.dtype())));
    if (a.shape() != p.shape())
      throw ShapeError(op_message(op, "'" + name + "' has shape " + shape_str(a.shape()) + ", the parameter has " +
                                          shape_str(p.shape())));
    found[k] = &a;
  }
  for (std::size_t k = 0; k < params.size(); ++k)
    if (!found[k]) throw ValueError(op_message(op, "parameter '" + params[k].first + "' is not given"));
  for (std::size_t k = 0; k < params.size(); ++k) {
    Tensor p = params[k].second;
    p.set_value(found[k]->clone());
  }
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
