// nn/layers.cpp and the blocks of nn/transformer.cpp where they add a residual inside a linear
// layer's op (ops::linear): FeedForward::with_residual and DecoderBlock's feed-forward branch give
// the bits of the plain sums, in value and in every gradient.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("linear with a residual equals residual plus matmul plus bias bit for bit", "[ops][matmul][linear]") {
  Generator g(229);
  for (DType dt : {DType::float32, DType::float64}) {
    INFO(dtype_name(dt));
    const Tensor x(rnd({3, 17, 11}, g).astype(dt), true), W(rnd({11, 19}, g).astype(dt), true),
        b(rnd({19}, g).astype(dt), true), r(rnd({3, 17, 19}, g).astype(dt), true);
    const Tensor y = ops::linear(x, W, b, r), yc = ops::add(r, ops::add(ops::matmul(x, W), b));
    CHECK(same_bits(y.value(), yc.value()));
    const Array G = rnd({3, 17, 19}, g).astype(dt);
    BackwardOptions keep;
    keep.retain_graph = true;  // y and yc share the tape
    const auto gr = grad(y, {x, W, b, r}, G, keep), gc = grad(yc, {x, W, b, r}, G);
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("gradient " << i);
      CHECK(same_bits(gr[i], gc[i]));
    }
  }
  // A residual of another shape is add's error.
  const Tensor x(rnd({4, 3}, g)), W(rnd({3, 2}, g)), b(rnd({2}, g));
  CHECK_THROWS_AS(ops::linear(x, W, b, Tensor(rnd({4, 3}, g))), ShapeError);
}

TEST_CASE("FeedForward with_residual equals the residual plus the layer bit for bit", "[nn][layers]") {
  for (DType dt : {DType::float32, DType::float64}) {
    INFO(dtype_name(dt));
    Generator g(233);
    nn::FeedForward ff(8, 32, g, 0.0, dt);
    const Tensor x(rnd({2, 5, 8}, g).astype(dt), true), r(rnd({2, 5, 8}, g).astype(dt), true);
    const Tensor y = ff.with_residual(x, r), yc = r + ff(x);
    CHECK(same_bits(y.value(), yc.value()));
    std::vector<Tensor> wrt{x, r};
    for (const auto& [name, p] : ff.named_parameters()) wrt.push_back(p);
    const Array G = rnd({2, 5, 8}, g).astype(dt);
    BackwardOptions keep;
    keep.retain_graph = true;
    const auto gr = grad(y, wrt, G, keep), gc = grad(yc, wrt, G);
    for (std::size_t i = 0; i < wrt.size(); ++i) {
      INFO("gradient " << i);
      CHECK(same_bits(gr[i], gc[i]));
    }
  }
}

TEST_CASE("DecoderBlock adds its feed-forward residual in fc2's op with the bits of the plain sum", "[nn][layers][gpt]") {
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 9;
  c.d_model = 16;
  c.H_q = 4;
  c.layers = 2;
  c = c.resolved();
  Generator g(239);
  nn::DecoderBlock block(c, g);
  const Tensor x(rnd({2, 9, 16}, g).astype(c.dtype), true);
  nn::AttentionCall call;
  call.visibility = nn::Visibility::causal(9, 9);
  const Tensor y = block(x, call);
  // The block's equations with the public parts, each sum a plain add.
  const Tensor h = x + block.attn.forward(block.ln1(x), call).Y;
  const Tensor yc = h + block.ffn(block.ln2(h));
  CHECK(same_bits(y.value(), yc.value()));
  std::vector<Tensor> wrt{x};
  for (const auto& [name, p] : block.named_parameters()) wrt.push_back(p);
  const Array G = rnd({2, 9, 16}, g).astype(c.dtype);
  BackwardOptions keep;
  keep.retain_graph = true;
  const auto gr = grad(y, wrt, G, keep), gc = grad(yc, wrt, G);
  for (std::size_t i = 0; i < wrt.size(); ++i) {
    INFO("gradient " << i);
    CHECK(same_bits(gr[i], gc[i]));
  }
}
