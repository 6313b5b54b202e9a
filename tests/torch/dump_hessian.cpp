// dump_hessian: the xgrad half of the PyTorch cross-check of full Hessians
// (tests/torch/hessian_crosscheck.py), float64, computed by xg::hessian (core/higher_order.hpp).
//
// Writes ONE JSON file (argv[1]) of cases, each with its inputs, the point, the scalar loss
// and xgrad's Hessian (shape point.shape + point.shape):
//   mlp_params  a 2-layer MLP, logits = tanh(X W1 + b1) W2 + b2 (weights x-by-out), mean softmax
//               cross-entropy over N rows with integer targets; the Hessian with respect to
//               all parameters flattened into one vector theta = [W1 (row-major), b1, W2, b2].
//   mlp_input   the same loss, the Hessian with respect to the input X [N, d_in].
//   attn_x      one causal nn::MultiHeadAttention layer, GQA (H_q 4, H_kv 2, d_head 4 from
//               d_model 8), RoPE with the default RopeConfig (interleaved, base 10000),
//               loss sum(Y * G) for a fixed random G; Hessian with respect to X [1, T, 8].
//   attn_wqkv   the same layer with half-split RoPE (base 100); Hessian with respect to the
//               packed W_QKV [8, (4 + 2 * 2) * 4] (its columns [Q heads | K heads | V heads]).
// argv[2] picks the attention implementation: automatic (default), fused or composed.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tests/support/json_text.hpp"
#include "tests/support/sdpa_impl_arg.hpp"
#include <xgrad/xgrad.hpp>

using namespace xg;
using namespace xgt::json_text;

namespace {

Array uniform(const Shape& s, Generator& g, double a = 1.0) { return random_uniform(s, g, DType::float64, -a, a); }

std::string hessian_case(const std::string& kind, const std::string& extra, const Array& point, const ScalarFn& f) {
  Tape tape;
  const double loss = f(Tensor(point)).item();
  const Array H = hessian(f, point);
  return "{\"kind\":" + jstr(kind) + extra + ",\"point\":" + jarray(point) + ",\"loss\":" + jnum(loss) +
         ",\"H\":" + jarray(H) + "}";
}

std::string mlp_cases(Generator& g) {
  const std::size_t N = 3, d_in = 3, h = 4, C = 3;
  const Array X = uniform({N, d_in}, g), W1 = uniform({d_in, h}, g), b1 = uniform({h}, g, 0.5),
              W2 = uniform({h, C}, g), b2 = uniform({C}, g, 0.5);
  const IndexArray targets({N}, {2, 0, 1});
  const auto mlp = [targets](const Tensor& x, const Tensor& w1, const Tensor& c1, const Tensor& w2, const Tensor& c2) {
    return ops::cross_entropy(ops::matmul(ops::tanh(ops::matmul(x, w1) + c1), w2) + c2, targets);
  };
  // theta = [W1, b1, W2, b2], each flattened row-major.
  std::vector<double> theta;
  for (const Array* a : {&W1, &b1, &W2, &b2})
    for (std::size_t i = 0; i < a->size(); ++i) theta.push_back(a->flat(i));
  const Array theta_a = Array::from_vector({theta.size()}, theta, DType::float64);
  const ScalarFn of_params = [&](const Tensor& t) {
    const long o1 = long(d_in * h), o2 = o1 + long(h), o3 = o2 + long(h * C), o4 = o3 + long(C);
    const Tensor w1 = ops::reshape(ops::slice(t, 0, 0, o1), {long(d_in), long(h)});
    const Tensor c1 = ops::slice(t, 0, o1, o2);
    const Tensor w2 = ops::reshape(ops::slice(t, 0, o2, o3), {long(h), long(C)});
    const Tensor c2 = ops::slice(t, 0, o3, o4);
    return mlp(Tensor(X), w1, c1, w2, c2);
  };
  const ScalarFn of_input = [&](const Tensor& x) {
    return mlp(x, Tensor(W1), Tensor(b1), Tensor(W2), Tensor(b2));
  };
  const std::string inputs = ",\"X\":" + jarray(X) + ",\"W1\":" + jarray(W1) + ",\"b1\":" + jarray(b1) +
                             ",\"W2\":" + jarray(W2) + ",\"b2\":" + jarray(b2) + ",\"targets\":" + jints(targets);
  return hessian_case("mlp_params", inputs, theta_a, of_params) + "," +
         hessian_case("mlp_input", inputs, X, of_input);
}

std::string rope_json(const ops::RopeConfig& c) {
  return "{\"base\":" + jnum(c.base) + ",\"fraction\":" + jnum(c.fraction) + ",\"layout\":" +
         jstr(ops::rope_layout_name(c.layout)) + "}";
}

// One causal GQA layer with RoPE; the Hessian of sum(Y * G) with respect to X, or to W_QKV.
std::string attention_case(Generator& g, nn::SdpaImpl impl, const ops::RopeConfig& rope, bool wrt_weight) {
  const std::size_t B = 1, T = 4, d = 8, H_q = 4, H_kv = 2, d_h = 4;
  nn::AttentionConfig c;
  c.d_model = d;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.d_head = d_h;
  c.dtype = DType::float64;
  c.impl = impl;
  c.rope = rope;
  nn::MultiHeadAttention m(c, g);
  for (auto& np : m.named_parameters()) np.second.set_value(uniform(np.second.shape(), g, 0.7));
  const Array X = uniform({B, T, d}, g), G = uniform({B, T, d}, g);
  nn::AttentionCall call;
  call.visibility = nn::Visibility::causal(std::int64_t(T), std::int64_t(T));
  const Tensor Gt(G);
  const auto loss = [&](const Tensor& x) {
    const nn::AttentionOutput out = m.forward(x, call);
    xgt::require_path(impl, out.path, "attention case");
    return ops::sum(out.Y * Gt);
  };
  std::string extra = ",\"B\":" + std::to_string(B) + ",\"T\":" + std::to_string(T) + ",\"d_model\":" +
                      std::to_string(d) + ",\"H_q\":" + std::to_string(H_q) + ",\"H_kv\":" + std::to_string(H_kv) +
                      ",\"d_head\":" + std::to_string(d_h) + ",\"rope\":" + rope_json(rope) + ",\"X\":" + jarray(X) +
                      ",\"G\":" + jarray(G);
  for (const auto& np : m.named_parameters()) extra += ",\"" + np.first + "\":" + jarray(np.second.value());
  if (!wrt_weight) return hessian_case("attn_x", extra, X, loss);
  // The layer's forward reads its public parameter handles, so the hessian's leaf stands in
  // for W_QKV while f runs (and the layer's own tensor is put back after).
  const Tensor own = m.W_QKV;
  const ScalarFn of_weight = [&](const Tensor& w) {
    m.W_QKV = w;
    const Tensor y = loss(Tensor(X));
    m.W_QKV = own;
    return y;
  };
  std::string s;
  try {
    s = hessian_case("attn_wqkv", extra, own.value(), of_weight);
  } catch (...) {
    m.W_QKV = own;
    throw;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  nn::SdpaImpl impl = nn::SdpaImpl::automatic;
  if (!xgt::parse_dump_args(argc, argv, "dump_hessian", impl)) return 2;
  const std::string mode = argc == 3 ? argv[2] : "automatic";
  try {
    Generator g(20261203);
    std::vector<std::string> cases;
    cases.push_back(mlp_cases(g));
    ops::RopeConfig half;
    half.layout = ops::RopeLayout::half_split;
    half.base = 100.0;
    cases.push_back(attention_case(g, impl, ops::RopeConfig{}, /*wrt_weight=*/false));
    cases.push_back(attention_case(g, impl, half, /*wrt_weight=*/true));
    std::FILE* f = std::fopen(argv[1], "w");
    if (!f) throw FormatError(std::string("dump_hessian: cannot write ") + argv[1]);
    std::string out = "{\"impl\":" + jstr(mode) + ",\"cases\":[";
    for (std::size_t i = 0; i < cases.size(); ++i) out += (i ? "," : "") + cases[i];
    out += "]}\n";
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) throw FormatError(std::string("dump_hessian: writing ") + argv[1] + " failed");
    std::printf("dump_hessian: 4 Hessians (%s) -> %s\n", mode.c_str(), argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_hessian: %s\n", e.what());
    return 1;
  }
  return 0;
}
