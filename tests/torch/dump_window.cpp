// dump_window: the xgrad half of the sliding-window PyTorch cross-check
// (tests/torch/window_crosscheck.py).
//
// Each case runs nn::scaled_dot_product_attention in float64 under
// Visibility::sliding_window(q_pos, k_pos, W) intersected with key padding, and the backward
// pass with a random cotangent G (gradients of L = sum(G * output)). The JSON file (argv[1])
// holds, per case, the sizes, the absolute positions q_pos and k_pos, W, the key lengths,
// every input, G, xgrad's output and the Q, K, V gradients. The torch side builds the allowed
// set from the definition alone:
//   key j visible to query i iff q_pos[i] - W < k_pos[j] <= q_pos[i] and j < key_lengths[b].
// Layouts: square (T == S), suffix (the last T of S positions), cached (positions offset as
// a windowed KV cache holds them), GQA/MQA, W = 1 and W >= S.
// argv[2]: automatic (default), fused or composed.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tests/support/json_text.hpp"
#include "tests/support/sdpa_impl_arg.hpp"
#include <xgrad/xgrad.hpp>

namespace {

using namespace xgt::json_text;
using namespace xg;
using nn::Visibility;

nn::SdpaImpl g_impl = nn::SdpaImpl::automatic;

struct Spec {
  std::string layout;
  std::size_t B, H_q, H_kv, T, S, d_k, d_v;
  std::int64_t W;
  std::int64_t offset;  // positions of the keys start here (a cache that dropped keys)
  std::vector<std::int64_t> lengths;
};

std::string run_case(const Spec& c, Generator& g) {
  std::vector<std::int64_t> k_pos(c.S), q_pos(c.T);
  for (std::size_t j = 0; j < c.S; ++j) k_pos[j] = c.offset + static_cast<std::int64_t>(j);
  for (std::size_t i = 0; i < c.T; ++i) q_pos[i] = c.offset + static_cast<std::int64_t>(c.S - c.T + i);
  const Visibility vis =
      Visibility::sliding_window(q_pos, k_pos, c.W) & Visibility::key_lengths(c.lengths, static_cast<nn::Position>(c.S));
  Tensor Q(random_normal({c.B, c.H_q, c.T, c.d_k}, g, DType::float64), true);
  Tensor K(random_normal({c.B, c.H_kv, c.S, c.d_k}, g, DType::float64), true);
  Tensor V(random_normal({c.B, c.H_kv, c.S, c.d_v}, g, DType::float64), true);
  const Array G = random_normal({c.B, c.H_q, c.T, c.d_v}, g, DType::float64);
  nn::SdpaOptions o;
  o.impl = g_impl;
  const nn::SdpaResult res = nn::scaled_dot_product_attention(Q, K, V, vis, o);
  xgt::require_path(g_impl, res.path, "window case");
  const Tensor O = res.output;
  const auto gr = grad(O, {Q, K, V}, G);
  std::string s = "{\"layout\":" + jstr(c.layout) + ",\"B\":" + std::to_string(c.B) + ",\"H_q\":" +
                  std::to_string(c.H_q) + ",\"H_kv\":" + std::to_string(c.H_kv) + ",\"T\":" + std::to_string(c.T) +
                  ",\"S\":" + std::to_string(c.S) + ",\"W\":" + std::to_string(c.W) + ",\"q_pos\":" + jints64(q_pos) +
                  ",\"k_pos\":" + jints64(k_pos) + ",\"key_lengths\":" + jints64(c.lengths) +
                  ",\"scale\":" + jnum(1.0 / std::sqrt(static_cast<double>(c.d_k)));
  s += ",\"Q\":" + jarray(Q.value()) + ",\"K\":" + jarray(K.value()) + ",\"V\":" + jarray(V.value()) +
       ",\"cotangent\":" + jarray(G) + ",\"output\":" + jarray(O.value()) + ",\"dQ\":" + jarray(gr[0]) +
       ",\"dK\":" + jarray(gr[1]) + ",\"dV\":" + jarray(gr[2]) + "}";
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (!xgt::parse_dump_args(argc, argv, "dump_window", g_impl)) return 2;
  try {
    Generator g(20261201);
    std::vector<Spec> specs = {
        {"square", 2, 2, 2, 6, 6, 3, 2, 2, 0, {6, 5}},
        {"suffix", 1, 4, 2, 3, 8, 4, 3, 3, 0, {8}},
        {"cached", 2, 2, 1, 3, 5, 3, 3, 3, 8, {5, 4}},
        {"square W=1", 1, 2, 2, 4, 4, 2, 2, 1, 0, {4}},
        {"square W>=S", 2, 3, 1, 5, 5, 3, 2, 9, 0, {5, 3}},
    };
    // Random configurations: key lengths > S - W keep a visible key for every query.
    for (int k = 0; k < 12; ++k) {
      Spec c;
      c.H_kv = 1 + static_cast<std::size_t>(g.below(2));
      c.H_q = c.H_kv * (1 + static_cast<std::size_t>(g.below(3)));
      c.B = 1 + static_cast<std::size_t>(g.below(2));
      c.S = 1 + static_cast<std::size_t>(g.below(9));
      c.T = 1 + static_cast<std::size_t>(g.below(c.S));
      c.d_k = 1 + static_cast<std::size_t>(g.below(4));
      c.d_v = 1 + static_cast<std::size_t>(g.below(4));
      c.W = 1 + static_cast<std::int64_t>(g.below(c.S + 1));
      c.offset = g.below(2) ? static_cast<std::int64_t>(g.below(20)) : 0;
      c.layout = std::string(c.T == c.S ? "square" : "suffix") + (c.offset ? " cached" : "") + " random";
      const std::int64_t S = static_cast<std::int64_t>(c.S), lo = std::max<std::int64_t>(1, S - c.W + 1);
      for (std::size_t b = 0; b < c.B; ++b) c.lengths.push_back(lo + static_cast<std::int64_t>(g.below(static_cast<std::uint64_t>(S - lo + 1))));
      specs.push_back(c);
    }
    std::string out = "{\"definition\":" +
                      jstr("key j visible to query i iff q_pos[i] - W < k_pos[j] <= q_pos[i] and j < key_lengths[b]") +
                      ",\"cases\":[\n";
    for (std::size_t i = 0; i < specs.size(); ++i) out += run_case(specs[i], g) + (i + 1 < specs.size() ? ",\n" : "\n");
    out += "]}\n";
    std::FILE* f = std::fopen(argv[1], "w");
    if (!f) {
      std::fprintf(stderr, "dump_window: cannot open %s for writing\n", argv[1]);
      return 1;
    }
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) {
      std::fprintf(stderr, "dump_window: write to %s failed\n", argv[1]);
      return 1;
    }
    std::printf("dump_window: wrote %zu cases to %s\n", specs.size(), argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_window: %s\n", e.what());
    return 1;
  }
  return 0;
}
