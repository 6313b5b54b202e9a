// dump_llama_model: the xgrad half of the PyTorch cross-check of the Llama model
// (nn::GPT with arch llama; tests/torch/llama_model_crosscheck.py), float64.
//
// Writes ONE JSON file (argv[1]) of cases. Each is a small random Llama model: its
// configuration, every parameter by name (xgrad's in x out layout), tokens [B, T], a random
// cotangent G on the logits, xgrad's logits and the gradient of L = sum(G * logits) with respect
// to every parameter, and the same in float32 (the weights rounded to float32). Cases: GQA tied and untied (interleaved RoPE, as Meta and llama2.c), MQA
// with half-split RoPE and a partial rotation, MHA with a sliding window; argv[2] picks the
// attention path (fused, composed or automatic).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tests/support/json_text.hpp"
#include <xgrad/xgrad.hpp>

using namespace xg;
using namespace xgt::json_text;

namespace {

struct Case {
  std::size_t H_q, H_kv, layers, d_model, window;
  bool tied;
  ops::RopeLayout layout;
  double rope_fraction;
};

std::string dump_case(Generator& g, const Case& k, nn::SdpaImpl impl) {
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = 17;
  c.context = 16;
  c.d_model = k.d_model;
  c.H_q = k.H_q;
  c.H_kv = k.H_kv;
  c.layers = k.layers;
  c.multiple_of = 8;
  c.norm_eps = 1e-5;
  c.tie_embeddings = k.tied;
  c.window = k.window;
  c.rope.base = 500.0;
  c.rope.layout = k.layout;
  c.rope.fraction = k.rope_fraction;
  c.impl = impl;
  c.dtype = DType::float64;
  nn::GPT m(c, g);
  // Every parameter redrawn (norm gains around one) so that no term is negligible.
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    const bool gain = name.find("norm.weight") != std::string::npos;
    t.set_value(gain ? random_uniform(t.shape(), g, DType::float64, 0.5, 1.5)
                     : random_uniform(t.shape(), g, DType::float64, -0.4, 0.4));
  }
  const std::size_t B = 2, T = 7;
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = static_cast<std::int64_t>(g.below(c.V_vocab));
  const IndexArray tokens({B, T}, ids);
  const Tensor logits = m.logits(tokens);
  const Array G = random_uniform(logits.shape(), g, DType::float64, -1, 1);
  const auto params = m.named_parameters();
  std::vector<Tensor> wrt;
  for (const auto& kv : params) wrt.push_back(kv.second);
  const std::vector<Array> grads = grad(logits, wrt, G);

  // The same model in float32 (the float64 weights rounded), for the float32 bound.
  nn::TransformerConfig c32 = c;
  c32.dtype = DType::float32;
  Generator unused(0);
  nn::GPT m32(c32, unused);
  std::vector<std::pair<std::string, Array>> w32;
  for (const auto& kv : params) w32.emplace_back(kv.first, kv.second.value().astype(DType::float32));
  m32.set_weights(w32);
  const Tensor logits32 = m32.logits(tokens);
  std::vector<Tensor> wrt32;
  for (const auto& kv : m32.named_parameters()) wrt32.push_back(kv.second);
  const std::vector<Array> grads32 = grad(logits32, wrt32, G.astype(DType::float32));

  const nn::TransformerConfig& r = m.config();
  std::string s = "{\"config\":{\"V_vocab\":" + std::to_string(r.V_vocab) + ",\"d_model\":" + std::to_string(r.d_model) +
                  ",\"H_q\":" + std::to_string(r.H_q) + ",\"H_kv\":" + std::to_string(r.H_kv) +
                  ",\"layers\":" + std::to_string(r.layers) + ",\"d_ff\":" + std::to_string(r.d_ff) +
                  ",\"window\":" + std::to_string(r.window) + ",\"norm_eps\":" + jnum(r.norm_eps) +
                  ",\"tied\":" + (r.tie_embeddings ? "true" : "false") + ",\"rope_base\":" + jnum(r.rope.base) +
                  ",\"rope_fraction\":" + jnum(r.rope.fraction) + ",\"rope_layout\":" +
                  jstr(ops::rope_layout_name(r.rope.layout)) + "},\"tokens\":" + jints(tokens) + ",\"G\":" + jarray(G) +
                  ",\"logits\":" + jarray(logits.value()) + ",\"params\":{";
  for (std::size_t i = 0; i < params.size(); ++i)
    s += (i ? ",\"" : "\"") + params[i].first + "\":" + jarray(params[i].second.value());
  s += "},\"grads\":{";
  for (std::size_t i = 0; i < params.size(); ++i) s += (i ? ",\"" : "\"") + params[i].first + "\":" + jarray(grads[i]);
  s += "},\"logits_f32\":" + jarray(logits32.value()) + ",\"grads_f32\":{";
  for (std::size_t i = 0; i < params.size(); ++i) s += (i ? ",\"" : "\"") + params[i].first + "\":" + jarray(grads32[i]);
  return s + "}}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: dump_llama_model OUT.json [automatic|fused|composed]\n");
    return 2;
  }
  try {
    const std::string which = argc == 3 ? argv[2] : "automatic";
    nn::SdpaImpl impl = nn::SdpaImpl::automatic;
    if (which == "fused") impl = nn::SdpaImpl::fused;
    else if (which == "composed") impl = nn::SdpaImpl::composed;
    else if (which != "automatic") throw ValueError("dump_llama_model: unknown attention path '" + which + "'");
    Generator g(20261220);
    std::vector<std::string> cases;
    cases.push_back(dump_case(g, {4, 2, 2, 16, 0, true, ops::RopeLayout::interleaved, 1.0}, impl));   // GQA, tied
    cases.push_back(dump_case(g, {4, 2, 2, 16, 0, false, ops::RopeLayout::interleaved, 1.0}, impl));  // GQA, untied
    cases.push_back(dump_case(g, {3, 1, 1, 24, 0, false, ops::RopeLayout::half_split, 0.5}, impl));   // MQA, half-split
    cases.push_back(dump_case(g, {2, 2, 2, 12, 3, true, ops::RopeLayout::interleaved, 1.0}, impl));   // MHA, window 3
    std::FILE* f = std::fopen(argv[1], "w");
    if (!f) throw FormatError(std::string("dump_llama_model: cannot write ") + argv[1]);
    std::string out = "{\"cases\":[";
    for (std::size_t i = 0; i < cases.size(); ++i) out += (i ? "," : "") + cases[i];
    out += "]}\n";
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) throw FormatError(std::string("dump_llama_model: writing ") + argv[1] + " failed");
    std::printf("dump_llama_model: %zu cases -> %s\n", cases.size(), argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_llama_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
