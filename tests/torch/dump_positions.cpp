// dump_positions: the xgrad half of the PyTorch cross-check of RoPE and ALiBi
// (tests/torch/positions_crosscheck.py), float64.
//
// Writes ONE JSON file (argv[1]) of cases, each with its inputs, a random output cotangent G,
// xgrad's output and the gradients of L = sum(G * output):
//   rope  ops::rope on x [B, H, T, d] at given absolute positions: base, fraction and layout
//         ("interleaved" pairs (2k, 2k+1), "half-split" pairs (k, k + r/2)).
//   mha   nn::MultiHeadAttention (weights in xgrad's x-by-out layout: y = x W + b) with RoPE
//         and/or ALiBi, causal or bidirectional, MHA or GQA; gradients for X and every
//         parameter.
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

std::string rope_json(const ops::RopeConfig& c) {
  return "{\"base\":" + jnum(c.base) + ",\"fraction\":" + jnum(c.fraction) + ",\"layout\":" +
         jstr(ops::rope_layout_name(c.layout)) + "}";
}

std::string rope_case(Generator& g, const Shape& shape, const std::vector<std::int64_t>& pos, const ops::RopeConfig& c) {
  const Tensor x(uniform(shape, g), true);
  const Array G = uniform(shape, g);
  const Tensor y = ops::rope(x, pos, c);
  const Array dx = grad(y, {x}, G)[0];
  return "{\"kind\":\"rope\",\"rope\":" + rope_json(c) + ",\"positions\":" + jints64(pos) + ",\"x\":" + jarray(x.value()) +
         ",\"G\":" + jarray(G) + ",\"y\":" + jarray(y.value()) + ",\"dx\":" + jarray(dx) + "}";
}

std::string mha_case(Generator& g, nn::SdpaImpl impl, std::size_t B, std::size_t T, std::size_t d, std::size_t H_q,
                     std::size_t H_kv, const ops::RopeConfig* rope, bool alibi, bool causal) {
  nn::AttentionConfig c;
  c.d_model = d;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.dtype = DType::float64;
  c.impl = impl;
  if (rope) c.rope = *rope;
  c.alibi = alibi;
  nn::MultiHeadAttention m(c, g);
  for (auto& np : m.named_parameters()) {
    Tensor t = np.second;
    t.set_value(uniform(t.shape(), g, 0.7));
  }
  const Tensor X(uniform({B, T, d}, g), true);
  const Array G = uniform({B, T, d}, g);
  nn::AttentionCall call;
  call.visibility = causal ? nn::Visibility::causal(std::int64_t(T), std::int64_t(T)) : nn::Visibility::all();
  const nn::AttentionOutput out = m.forward(X, call);
  xgt::require_path(impl, out.path, "mha case");
  const Tensor Y = out.Y;
  std::vector<Tensor> wrt{X};
  for (auto& np : m.named_parameters()) wrt.push_back(np.second);
  const std::vector<Array> grads = grad(Y, wrt, G);
  std::string s = "{\"kind\":\"mha\",\"H_q\":" + std::to_string(H_q) + ",\"H_kv\":" + std::to_string(H_kv) +
                  ",\"rope\":" + (rope ? rope_json(*rope) : "null") + ",\"alibi\":" + (alibi ? "true" : "false") +
                  ",\"causal\":" + (causal ? "true" : "false") + ",\"X\":" + jarray(X.value()) + ",\"G\":" + jarray(G) +
                  ",\"Y\":" + jarray(Y.value()) + ",\"dX\":" + jarray(grads[0]);
  std::size_t k = 1;
  for (auto& np : m.named_parameters()) {
    s += ",\"" + np.first + "\":" + jarray(np.second.value()) + ",\"d" + np.first + "\":" + jarray(grads[k++]);
  }
  return s + "}";
}

}  // namespace

int main(int argc, char** argv) {
  nn::SdpaImpl impl = nn::SdpaImpl::automatic;
  if (!xgt::parse_dump_args(argc, argv, "dump_positions", impl)) return 2;
  const std::string mode = argc == 3 ? argv[2] : "automatic";
  try {
    Generator g(20261201);
    std::vector<std::string> cases;
    auto cfg = [](ops::RopeLayout l, double fraction, double base) {
      ops::RopeConfig c;
      c.layout = l;
      c.fraction = fraction;
      c.base = base;
      return c;
    };
    const ops::RopeConfig inter = cfg(ops::RopeLayout::interleaved, 1.0, 10000.0);
    const ops::RopeConfig half = cfg(ops::RopeLayout::half_split, 1.0, 10000.0);
    const ops::RopeConfig half_partial = cfg(ops::RopeLayout::half_split, 0.5, 500.0);
    const ops::RopeConfig inter_partial = cfg(ops::RopeLayout::interleaved, 0.75, 10.0);
    cases.push_back(rope_case(g, {2, 3, 5, 8}, {0, 1, 2, 3, 4}, inter));
    cases.push_back(rope_case(g, {2, 3, 5, 8}, {7, 0, 300, 2, 9999}, half));
    cases.push_back(rope_case(g, {1, 2, 4, 8}, {3, 4, 5, 6}, half_partial));
    cases.push_back(rope_case(g, {1, 2, 4, 6}, {0, 2, 4, 6}, inter_partial));  // r = floor(4.5) = 4
    cases.push_back(mha_case(g, impl, 2, 6, 24, 6, 3, &inter, false, true));
    cases.push_back(mha_case(g, impl, 2, 6, 24, 6, 2, &half_partial, false, true));
    cases.push_back(mha_case(g, impl, 2, 6, 24, 6, 3, nullptr, true, true));     // 6 heads: non-power-of-two slopes
    cases.push_back(mha_case(g, impl, 1, 5, 16, 4, 1, nullptr, true, false));    // bidirectional ALiBi, MQA
    cases.push_back(mha_case(g, impl, 2, 5, 24, 4, 2, &half, true, true));       // both
    cases.push_back(mha_case(g, impl, 1, 5, 24, 4, 4, &inter_partial, false, false));
    std::FILE* f = std::fopen(argv[1], "w");
    if (!f) throw FormatError(std::string("dump_positions: cannot write ") + argv[1]);
    std::string out = "{\"impl\":" + jstr(mode) + ",\"cases\":[";
    for (std::size_t i = 0; i < cases.size(); ++i) out += (i ? "," : "") + cases[i];
    out += "]}\n";
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) throw FormatError(std::string("dump_positions: writing ") + argv[1] + " failed");
    std::printf("dump_positions: %zu cases (%s) -> %s\n", cases.size(), mode.c_str(), argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_positions: %s\n", e.what());
    return 1;
  }
  return 0;
}
