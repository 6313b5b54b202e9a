#include <xgrad/nn/module.hpp>

#include <cstring>
#include <regex>
#include <unordered_set>

#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>

namespace xg::nn {

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out = params_;
  for (const auto& [prefix, child] : children_)
    for (auto& [name, t] : child->named_parameters()) out.emplace_back(prefix.empty() ? name : prefix + "." + name, t);
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

std::vector<std::pair<std::string, Tensor>> Module::named_trainable_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [name, t] : named_parameters())
    if (t.requires_grad()) out.emplace_back(name, t);
  return out;
}

std::vector<Tensor> Module::trainable_parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_trainable_parameters()) out.push_back(t);
  return out;
}

std::size_t Module::trainable_parameter_count() const {
  std::size_t n = 0;
  for (auto& [name, t] : named_trainable_parameters()) n += t.size();
  return n;
}

std::size_t Module::set_requires_grad(const std::function<bool(const std::string&)>& select, bool on) {
  if (!select) throw ValueError(op_message("set_requires_grad", "the selection function is empty"));
  std::size_t n = 0;
  for (auto& [name, t] : named_parameters()) {
    if (!select(name)) continue;
    Tensor p = t;
    p.requires_grad_(on);
    if (!on) p.zero_grad();
    ++n;
  }
  return n;
}

namespace {

std::size_t set_by_pattern(Module& m, const std::string& op, const std::string& pattern, bool on) {
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ValueError(op_message(op, "pattern '" + pattern + "' is not a valid regular expression: " + e.what()));
  }
  const std::size_t n = m.set_requires_grad([&](const std::string& name) { return std::regex_search(name, re); }, on);
  if (n == 0) {
    std::string known;
    for (auto& [name, t] : m.named_parameters()) known += (known.empty() ? "" : ", ") + name;
    throw ValueError(op_message(op, "pattern '" + pattern + "' matches no parameter; the parameters: " + known));
  }
  return n;
}

}  // namespace

std::size_t Module::freeze(const std::string& pattern) { return set_by_pattern(*this, "freeze", pattern, false); }

std::size_t Module::unfreeze(const std::string& pattern) { return set_by_pattern(*this, "unfreeze", pattern, true); }

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

std::size_t Module::pack_parameters() {
  constexpr std::size_t kAlignBytes = 64;  // as the allocator's blocks: xsimd splits arrays at aligned addresses
  std::vector<Tensor> unique;  // in the order of named_parameters(), each shared parameter once
  std::unordered_set<const void*> seen;
  for (const auto& [name, t] : named_parameters())
    if (seen.insert(t.impl().get()).second) unique.push_back(t);
  // Every block first, so that a failed allocation changes nothing.
  const DType dtypes[] = {DType::float32, DType::float64};
  Array blocks[2];
  std::vector<std::size_t> offsets(unique.size());
  std::size_t total_bytes = 0;
  for (int d = 0; d < 2; ++d) {
    const std::size_t width = dtypes[d] == DType::float32 ? sizeof(float) : sizeof(double);
    const std::size_t align = kAlignBytes / width;  // elements
    std::size_t total = 0;
    for (std::size_t k = 0; k < unique.size(); ++k) {
      if (unique[k].dtype() != dtypes[d]) continue;
      offsets[k] = total;
      total += (unique[k].size() + align - 1) / align * align;
    }
    if (total == 0) continue;
    blocks[d] = Array::empty({total}, dtypes[d]);
    total_bytes += total * width;
  }
  for (std::size_t k = 0; k < unique.size(); ++k) {
    const int d = unique[k].dtype() == DType::float32 ? 0 : 1;
    const std::size_t width = d == 0 ? sizeof(float) : sizeof(double);
    const Array& old = unique[k].value();
    if (old.size() == 0) continue;
    std::memcpy(static_cast<unsigned char*>(blocks[d].storage().ptr) + offsets[k] * width, old.storage().ptr,
                old.size() * width);
    unique[k].set_value(detail::Storage::view_at(blocks[d], offsets[k], old.shape()));
  }
  // The blocks the parameters left would stay in the allocator's cache, as large as the model.
  unique.clear();
  release_cached_memory();
  return total_bytes;
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

void Module::register_module(const std::string& name, Module& child) {
  if (name.empty()) {
    const auto mine = named_parameters();
    for (auto& [n, t] : child.named_parameters())
      for (auto& [m, u] : mine)
        if (n == m)
          throw ValueError(op_message("module", "a child registered without a name brings parameter '" + n +
                                                    "', which this module has already"));
  }
  children_.emplace_back(name, &child);
}

void Module::unregister_module(const Module& child) {
  for (auto it = children_.begin(); it != children_.end(); ++it)
    if (it->second == &child) {
      children_.erase(it);
      return;
    }
  throw ValueError(op_message("module", "unregister_module: the module is not a child of this one"));
}

}  // namespace xg::nn
