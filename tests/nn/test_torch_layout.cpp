// nn/torch_layout.hpp: PyTorch layouts of the attention layers, separate q/k/v/o projections
// (MHA, GQA, MQA; self and cross attention) and nn.MultiheadAttention (self, and cross with
// kdim/vdim). Round trips give bit-identical layers; element positions are checked against
// the packed xgrad blocks directly; every bad state is refused before anything is written.
// tests/torch (crosscheck.py, categories gqa_layer and cross_mha) runs the exported weights
// in torch itself.
#include <catch2/catch.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xg::nn;
using xgt::rnd;

namespace {

AttentionConfig self_config(std::size_t d, std::size_t H_q, std::size_t H_kv, bool bias = true) {
  AttentionConfig c;
  c.d_model = d;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.bias = bias;
  c.dtype = DType::float64;
  return c;
}

CrossAttentionConfig cross_config(std::size_t d_q, std::size_t d_m, std::size_t H_q, std::size_t H_kv,
                                  std::size_t d_out = 0, std::size_t d_head = 0) {
  CrossAttentionConfig c;
  c.d_q = d_q;
  c.d_m = d_m;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.d_out = d_out;
  c.d_head = d_head;
  c.dtype = DType::float64;
  return c;
}

void randomise(Module& m, Generator& g) {
  for (auto& named : m.named_parameters()) {
    Tensor t = named.second;
    t.set_value(rnd(t.shape(), g));
  }
}

bool same_parameters(const Module& a, const Module& b) {
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (std::size_t i = 0; i < pa.size(); ++i)
    if (pa[i].first != pb[i].first || max_abs_diff(pa[i].second.value(), pb[i].second.value()) != 0.0) return false;
  return true;
}

}  // namespace

TEST_CASE("torch_layout: GQA and MQA self-attention export to separate q/k/v/o and import back", "[nn][layout]") {
  Generator g(11);
  for (std::size_t H_kv : {1, 2, 4}) {
    INFO("H_q 4, H_kv " << H_kv);
    MultiHeadAttention a(self_config(8, 4, H_kv), g), b(self_config(8, 4, H_kv), g);
    randomise(a, g);
    const auto w = torch_layout::export_attention(a);
    const std::size_t d_h = 2, q = 4 * d_h, kv = H_kv * d_h;
    CHECK(w.q_weight.shape() == Shape{q, 8});
    CHECK(w.k_weight.shape() == Shape{kv, 8});
    CHECK(w.v_weight.shape() == Shape{kv, 8});
    CHECK(w.o_weight.shape() == Shape{8, q});
    // Element positions against the packed block: row o of v is column q + kv + o of W_QKV.
    const Array& W = a.W_QKV.value();
    CHECK(w.q_weight.at({q - 1, 3}) == W.at({3, q - 1}));
    CHECK(w.k_weight.at({kv - 1, 5}) == W.at({5, q + kv - 1}));
    CHECK(w.v_weight.at({0, 7}) == W.at({7, q + kv}));
    CHECK(w.v_bias.flat(kv - 1) == a.b_QKV.value().flat(q + 2 * kv - 1));
    CHECK(w.o_weight.at({2, q - 1}) == a.W_O.value().at({q - 1, 2}));
    torch_layout::import_attention(b, w);
    CHECK(same_parameters(a, b));
    const Tensor X(rnd({2, 3, 8}, g));
    // The same weights in the same layout, the same input: the same calls, the same bits.
    XGT_CHECK_SAME(a(X, Visibility::causal(3, 3)).value(), b(X, Visibility::causal(3, 3)).value());
  }
  // Without biases: the biases stay undefined in both directions.
  MultiHeadAttention nb(self_config(6, 3, 1, false), g), nb2(self_config(6, 3, 1, false), g);
  const auto w = torch_layout::export_attention(nb);
  CHECK(!w.q_bias.defined());
  CHECK(!w.o_bias.defined());
  torch_layout::import_attention(nb2, w);
  CHECK(same_parameters(nb, nb2));
}

TEST_CASE("torch_layout: cross-attention export and import (d_q != d_m / d_out / GQA / explicit d_head)",
          "[nn][layout]") {
  Generator g(12);
  const CrossAttentionConfig cfg = cross_config(6, 5, 4, 2, 7, 3);  // d_head 3: H_q d_h = 12 != d_q
  CrossAttention a(cfg, g), b(cfg, g);
  randomise(a, g);
  const auto w = torch_layout::export_attention(a);
  CHECK(w.q_weight.shape() == Shape{12, 6});
  CHECK(w.k_weight.shape() == Shape{6, 5});
  CHECK(w.v_weight.shape() == Shape{6, 5});
  CHECK(w.o_weight.shape() == Shape{7, 12});
  CHECK(w.k_weight.at({5, 4}) == a.W_KV.value().at({4, 5}));
  CHECK(w.v_weight.at({1, 0}) == a.W_KV.value().at({0, 6 + 1}));
  CHECK(w.k_bias.flat(2) == a.b_KV.value().flat(2));
  CHECK(w.v_bias.flat(2) == a.b_KV.value().flat(6 + 2));
  torch_layout::import_attention(b, w);
  CHECK(same_parameters(a, b));
  const Tensor Xq(rnd({2, 3, 6}, g)), Xm(rnd({2, 4, 5}, g));
  AttentionCall call;
  call.visibility = Visibility::key_lengths({4, 2}, 4);
  XGT_CHECK_SAME(a.forward(Xq, Xm, call).Y.value(), b.forward(Xq, Xm, call).Y.value());  // same weights, same calls
}

TEST_CASE("torch_layout: nn.MultiheadAttention state for cross attention both packed and with kdim/vdim",
          "[nn][layout]") {
  Generator g(13);
  // kdim == embed_dim: torch packs q, k, v into in_proj_weight.
  CrossAttention a(cross_config(6, 6, 2, 2), g), b(cross_config(6, 6, 2, 2), g);
  randomise(a, g);
  auto w = torch_layout::export_mha(a);
  CHECK(w.in_proj_weight.shape() == Shape{18, 6});
  CHECK(!w.q_proj_weight.defined());
  CHECK(w.in_proj_weight.at({6 + 2, 1}) == a.W_KV.value().at({1, 2}));  // k rows follow q rows
  CHECK(w.in_proj_bias.flat(12 + 5) == a.b_KV.value().flat(6 + 5));     // v bias last
  torch_layout::import_mha(b, w);
  CHECK(same_parameters(a, b));
  // kdim = vdim = 5 != embed_dim: separate q_proj_weight [E, E], k/v_proj_weight [E, kdim].
  CrossAttention c(cross_config(6, 5, 3, 3), g), d(cross_config(6, 5, 3, 3), g);
  randomise(c, g);
  const auto s = torch_layout::export_mha(c);
  CHECK(!s.in_proj_weight.defined());
  CHECK(s.q_proj_weight.shape() == Shape{6, 6});
  CHECK(s.k_proj_weight.shape() == Shape{6, 5});
  CHECK(s.v_proj_weight.shape() == Shape{6, 5});
  CHECK(s.in_proj_bias.shape() == Shape{18});
  CHECK(s.v_proj_weight.at({0, 4}) == c.W_KV.value().at({4, 6}));
  torch_layout::import_mha(d, s);
  CHECK(same_parameters(c, d));
}

TEST_CASE("torch_layout: bad states are refused before anything is written", "[nn][layout][errors]") {
  Generator g(14);
  MultiHeadAttention gqa(self_config(8, 4, 2), g);
  CHECK_THROWS_WITH(torch_layout::export_mha(gqa), Catch::Contains("H_kv == H_q"));
  const auto w = torch_layout::export_attention(gqa);
  MultiHeadAttention other(self_config(8, 4, 2), g);
  const Array before = other.W_QKV.value().clone();
  auto bad = w;
  bad.k_weight = Array::zeros({6, 8}, DType::float64);
  CHECK_THROWS_AS(torch_layout::import_attention(other, bad), ShapeError);
  CHECK_THROWS_WITH(torch_layout::import_attention(other, bad), Catch::Contains("k_weight has shape (6, 8), the layer needs (4, 8)"));
  bad = w;
  bad.o_bias = Array();
  CHECK_THROWS_WITH(torch_layout::import_attention(other, bad), Catch::Contains("o_bias is missing but the layer has biases"));
  bad = w;
  bad.v_bias = Array::zeros({5}, DType::float64);
  CHECK_THROWS_AS(torch_layout::import_attention(other, bad), ShapeError);
  XGT_CHECK_SAME(other.W_QKV.value(), before);  // untouched by the failed imports
  MultiHeadAttention mha(self_config(8, 4, 4), g);
  CHECK_THROWS_AS(torch_layout::import_attention(mha, w), ShapeError);  // a GQA state into an MHA layer

  CrossAttention ca(cross_config(6, 5, 3, 3, 4), g);
  CHECK_THROWS_WITH(torch_layout::export_mha(ca), Catch::Contains("d_out 4 must equal d_q 6"));
  CrossAttention cb(cross_config(6, 5, 3, 3), g), cc(cross_config(6, 5, 3, 3), g);
  auto m = torch_layout::export_mha(cb);
  const Array cc_before = cc.W_KV.value().clone();
  auto both = m;
  both.in_proj_weight = Array::zeros({18, 6}, DType::float64);
  CHECK_THROWS_WITH(torch_layout::import_mha(cc, both), Catch::Contains("either in_proj_weight"));
  auto neither = m;
  neither.q_proj_weight = neither.k_proj_weight = neither.v_proj_weight = Array();
  CHECK_THROWS_WITH(torch_layout::import_mha(cc, neither), Catch::Contains("either in_proj_weight"));
  auto wrong_kdim = m;
  wrong_kdim.k_proj_weight = Array::zeros({6, 6}, DType::float64);
  CHECK_THROWS_AS(torch_layout::import_mha(cc, wrong_kdim), ShapeError);
  XGT_CHECK_SAME(cc.W_KV.value(), cc_before);  // untouched by the failed imports
  CHECK_THROWS_AS(torch_layout::attention_to_torch(Array::zeros({4, 7}, DType::float64), Array(),
                                                   Array::zeros({4, 4}, DType::float64), Array(), 2, 1),
                  ShapeError);  // 7 is not (2 + 2 * 1) d_h
}
