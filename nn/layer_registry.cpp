// The registry of named sub-layers that GPT and Llama blocks build (nn/layer_registry.hpp).
#include <xgrad/nn/layer_registry.hpp>

#include <map>
#include <mutex>

#include <xgrad/core/error.hpp>
#include <xgrad/nn/transformer.hpp>

namespace xg::nn {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, ActivationFn> activations;
  std::map<std::string, MLPFactory> mlps;
  std::map<std::string, NormFactory> norms;
  std::map<std::string, AttentionFn> attentions;
};

Registry& registry() {
  static Registry r;
  return r;
}

template <class Map>
std::vector<std::string> names_of(const Map& m) {
  std::vector<std::string> v;
  for (const auto& kv : m) v.push_back(kv.first);
  return v;
}

std::string listed(const std::vector<std::string>& v) {
  if (v.empty()) return "none is registered";
  std::string s = "registered: ";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

void check_name(LayerKind k, const std::string& name) {
  const std::string op = "register_" + layer_kind_name(k);
  bool ok = !name.empty() && name.size() <= 64;
  for (const char ch : name)
    ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' ||
                ch == '.' || ch == '-');
  if (!ok)
    throw ValueError(op_message(op, "the name '" + name + "' must be 1..64 characters of letters, digits, _ . -"));
}

template <class Map, class F>
void add(LayerKind k, Map& m, const std::string& name, F f) {
  check_name(k, name);
  const std::string op = "register_" + layer_kind_name(k);
  if (!f) throw ValueError(op_message(op, "'" + name + "': the function is empty"));
  if (m.count(name)) throw ValueError(op_message(op, layer_kind_name(k) + " '" + name + "' is already registered"));
  m.emplace(name, std::move(f));
}

[[noreturn]] void unknown(LayerKind k, const std::string& name, const std::vector<std::string>& known) {
  throw ValueError(op_message("transformer", layer_kind_name(k) + " '" + name + "' is not registered in this program (" +
                                                 listed(known) + "; nn::register_" + layer_kind_name(k) +
                                                 ", docs/custom-layers.md)"));
}

}  // namespace

std::string layer_kind_name(LayerKind k) {
  switch (k) {
    case LayerKind::activation: return "activation";
    case LayerKind::mlp: return "mlp";
    case LayerKind::norm: return "norm";
    case LayerKind::attention: return "attention";
  }
  return "activation";
}

void register_activation(const std::string& name, ActivationFn f) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  add(LayerKind::activation, r.activations, name, std::move(f));
}

void register_mlp(const std::string& name, MLPFactory f) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  add(LayerKind::mlp, r.mlps, name, std::move(f));
}

void register_norm(const std::string& name, NormFactory f) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  add(LayerKind::norm, r.norms, name, std::move(f));
}

void register_attention(const std::string& name, AttentionFn f) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  add(LayerKind::attention, r.attentions, name, std::move(f));
}

bool unregister_layer(LayerKind k, const std::string& name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  switch (k) {
    case LayerKind::activation: return r.activations.erase(name) > 0;
    case LayerKind::mlp: return r.mlps.erase(name) > 0;
    case LayerKind::norm: return r.norms.erase(name) > 0;
    case LayerKind::attention: return r.attentions.erase(name) > 0;
  }
  return false;
}

bool is_registered(LayerKind k, const std::string& name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  switch (k) {
    case LayerKind::activation: return r.activations.count(name) > 0;
    case LayerKind::mlp: return r.mlps.count(name) > 0;
    case LayerKind::norm: return r.norms.count(name) > 0;
    case LayerKind::attention: return r.attentions.count(name) > 0;
  }
  return false;
}

std::vector<std::string> registered_layers(LayerKind k) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  switch (k) {
    case LayerKind::activation: return names_of(r.activations);
    case LayerKind::mlp: return names_of(r.mlps);
    case LayerKind::norm: return names_of(r.norms);
    case LayerKind::attention: return names_of(r.attentions);
  }
  return {};
}

ActivationFn make_activation(const std::string& name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.activations.find(name);
  if (it == r.activations.end()) unknown(LayerKind::activation, name, names_of(r.activations));
  return it->second;
}

AttentionFn make_attention(const std::string& name) {
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.attentions.find(name);
  if (it == r.attentions.end()) unknown(LayerKind::attention, name, names_of(r.attentions));
  return it->second;
}

std::unique_ptr<MLPLayer> make_mlp(const std::string& name, const TransformerConfig& resolved, Generator& init) {
  MLPFactory f;
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.mlps.find(name);
    if (it == r.mlps.end()) unknown(LayerKind::mlp, name, names_of(r.mlps));
    f = it->second;
  }
  std::unique_ptr<MLPLayer> m = f(resolved, init);  // outside the lock: a factory may use the registry
  if (!m) throw ValueError(op_message("transformer", "mlp '" + name + "': the factory returned no layer"));
  return m;
}

std::unique_ptr<NormLayer> make_norm(const std::string& name, const TransformerConfig& resolved, std::size_t width) {
  NormFactory f;
  {
    Registry& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.norms.find(name);
    if (it == r.norms.end()) unknown(LayerKind::norm, name, names_of(r.norms));
    f = it->second;
  }
  std::unique_ptr<NormLayer> n = f(resolved, width);
  if (!n) throw ValueError(op_message("transformer", "norm '" + name + "': the factory returned no layer"));
  return n;
}

void check_registered_layers(const TransformerConfig& c) {
  if (!c.mlp.empty() && !c.activation.empty())
    throw ValueError(op_message("transformer", "activation '" + c.activation + "' and mlp '" + c.mlp +
                                                   "': the activation replaces the built-in MLP's; a registered mlp "
                                                   "has its own (set one of them)"));
  const std::pair<LayerKind, const std::string*> named[] = {
      {LayerKind::activation, &c.activation},
      {LayerKind::mlp, &c.mlp},
      {LayerKind::norm, &c.norm},
      {LayerKind::attention, &c.attention}};
  for (const auto& [k, name] : named)
    if (!name->empty() && !is_registered(k, *name)) unknown(k, *name, registered_layers(k));
}

}  // namespace xg::nn
