#include <xgrad/nn/safetensors.hpp>

namespace xg::nn::safetensors {

namespace {
std::string where(const std::string& path) { return "[safetensors] " + path + ": "; }
}  // namespace

void save_module(const std::string& path, const Module& m, const Metadata& metadata) {
  NamedArrays arrays;
  for (const auto& [name, t] : m.named_parameters()) arrays.emplace_back(name, t.value());
  io::safetensors::save(path, arrays, metadata);
}

Metadata load_module(const std::string& path, Module& m) {
  io::safetensors::File f = io::safetensors::load(path);
  const auto params = m.named_parameters();
  for (const auto& [name, a] : f.tensors) {
    bool known = false;
    for (const auto& [pn, p] : params) known = known || pn == name;
    if (!known) throw FormatError(where(path) + "tensor '" + name + "' is not a parameter of this model");
  }
  for (const auto& [name, p] : params) {
    const Array* found = nullptr;
    for (const auto& [n, a] : f.tensors)
      if (n == name) found = &a;
    if (!found) throw FormatError(where(path) + "parameter '" + name + "' is missing");
    if (found->shape() != p.shape() || found->dtype() != p.dtype())
      throw FormatError(where(path) + "parameter '" + name + "' has shape " + shape_str(found->shape()) + " " +
                        dtype_name(found->dtype()) + ", the model expects " + shape_str(p.shape()) + " " +
                        dtype_name(p.dtype()));
  }
  for (const auto& [name, a] : f.tensors) {
    const std::size_t bad = a.first_nonfinite();
    if (bad != a.size())
      throw FormatError(where(path) + "parameter '" + name + "' element " + std::to_string(bad) + " is " +
                        std::to_string(a.flat(bad)) + ": parameters must be finite");
  }
  for (auto& [name, p] : m.named_parameters())
    for (const auto& [n, a] : f.tensors)
      if (n == name) p.set_value(a);
  return f.metadata;
}

}  // namespace xg::nn::safetensors
