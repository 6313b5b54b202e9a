// Layers built from given weights (Linear, Embedding, LayerNorm, FeedForward, the attention
// layers), strict set_weights, and dtype mixing named at the layer. The default dtype:
// tests/core/test_dtype_defaults.cpp; printing: tests/core/test_printing.cpp.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xg::nn;
using namespace xgt;

TEST_CASE("layers from weights: Linear Embedding LayerNorm and FeedForward compute with the given weights",
          "[nn][layers]") {
  const Array W = Array::of({{1.0, 2.0, 0.0}, {0.0, -1.0, 3.0}}), b = Array::of({0.5, 0.0, -0.5});
  Linear lin(W, b);
  const Array y = lin(Tensor(Array::of({{1.0, 1.0}}))).value();  // [1, 1] W + b = [1, 1, 3] + b
  CHECK(y.to_vector() == std::vector<double>{1.5, 1.0, 2.5});
  CHECK(lin.W.is_leaf());
  CHECK(lin.W.requires_grad());
  CHECK(Linear(W).named_parameters().size() == 1);  // no bias
  // Copied: changing the layer leaves the caller's array alone.
  lin.W.set_value(Array::zeros({2, 3}, DType::float64));
  CHECK(W.at({0, 1}) == 2.0);

  Embedding emb(Array::of({{1.0, 2.0}, {3.0, 4.0}, {5.0, 6.0}}));
  CHECK(emb(IndexArray({2}, {2, 0})).value().to_vector() == std::vector<double>{5.0, 6.0, 1.0, 2.0});

  LayerNorm ln(Array::of({2.0, 2.0}), Array::of({1.0, 1.0}));
  // Row (0, 2): mean 1, variance 1 -> normalised (-1, 1) up to eps, then 2 x + 1.
  const Array z = ln(Tensor(Array::of({{0.0, 2.0}}))).value();
  CHECK(z.at({0, 0}) == Approx(-1.0).epsilon(1e-5));
  CHECK(z.at({0, 1}) == Approx(3.0).epsilon(1e-5));

  const Array W1 = Array::of({{1.0, 0.0, 0.0}, {0.0, 1.0, 0.0}}), W2 = Array::of({{1.0, 0.0}, {0.0, 1.0}, {0.0, 0.0}});
  FeedForward ff(W1, Array(), W2, Array());
  const Array x = Array::of({{2.0, -1.0}});
  Tensor gx = ops::gelu(Tensor(x));
  XGT_CHECK_SAME(ff(Tensor(x)).value(), gx.value());  // identity projections around GELU
}

TEST_CASE("layers from weights: wrong ranks or shapes and mixed dtypes are refused by name", "[nn][layers][errors]") {
  const Array W = Array::zeros({2, 3}, DType::float64);
  CHECK_THROWS_WITH(Linear(Array::zeros({6}, DType::float64)), Catch::Contains("[linear] W must have 2 dimensions"));
  CHECK_THROWS_WITH(Linear(W, Array::zeros({2}, DType::float64)),
                    Catch::Contains("b has shape (2)") && Catch::Contains("needs b of shape (3)"));
  CHECK_THROWS_AS(Linear(W, Array::zeros({3}, DType::float32)), DTypeError);
  CHECK_THROWS_WITH(Linear(W, Array::zeros({3}, DType::float32)),
                    Catch::Contains("b is float32, W is float64"));
  CHECK_THROWS_AS(Linear(Array()), ValueError);
  CHECK_THROWS_AS(LayerNorm(Array::zeros({3}, DType::float64), Array::zeros({4}, DType::float64)), ShapeError);
  CHECK_THROWS_AS(FeedForward(W, Array(), Array::zeros({3, 2}, DType::float32), Array()), DTypeError);
  CHECK_THROWS_AS(FeedForward(W, Array(), Array::zeros({2, 3}, DType::float64), Array()), ShapeError);
}

TEST_CASE("layers from weights: attention layers from named weights equal the layer they were taken from", "[nn][layers][attention]") {
  Generator g(3);
  AttentionConfig c;
  c.d_model = 8;
  c.H_q = 4;
  c.H_kv = 2;
  c.dtype = DType::float64;
  MultiHeadAttention a(c, g);
  std::vector<std::pair<std::string, Array>> w;
  for (const auto& [name, t] : a.named_parameters()) w.emplace_back(name, t.value());
  MultiHeadAttention b(c, w);
  const Tensor X(random_normal({2, 5, 8}, g, DType::float64));
  XGT_CHECK_SAME(a(X, Visibility::causal(5, 5)).value(), b(X, Visibility::causal(5, 5)).value());  // same weights

  CrossAttentionConfig cc;
  cc.d_q = 8;
  cc.d_m = 6;
  cc.H_q = 2;
  cc.H_kv = 1;
  cc.dtype = DType::float64;
  CrossAttention ca(cc, g);
  std::vector<std::pair<std::string, Array>> cw;
  for (const auto& [name, t] : ca.named_parameters()) cw.emplace_back(name, t.value());
  CrossAttention cb(cc, cw);
  const Tensor M(random_normal({2, 3, 6}, g, DType::float64));
  AttentionCall call;
  XGT_CHECK_SAME(ca.forward(X, M, call).Y.value(), cb.forward(X, M, call).Y.value());  // same weights

  // Strict: missing, unknown, repeated, wrong shape, wrong dtype.
  auto missing = w;
  missing.pop_back();
  CHECK_THROWS_WITH(MultiHeadAttention(c, missing), Catch::Contains("[set_weights] parameter 'b_O' is not given"));
  auto unknown = w;
  unknown.emplace_back("W_Q", w[0].second);
  CHECK_THROWS_WITH(MultiHeadAttention(c, unknown),
                    Catch::Contains("'W_Q' is not a parameter of this module") && Catch::Contains("W_QKV"));
  auto twice = w;
  twice.push_back(w[0]);
  CHECK_THROWS_WITH(MultiHeadAttention(c, twice), Catch::Contains("'W_QKV' is given twice"));
  auto shape = w;
  shape[0].second = Array::zeros({8, 8}, DType::float64);
  CHECK_THROWS_WITH(MultiHeadAttention(c, shape),
                    Catch::Contains("'W_QKV' has shape (8, 8), the parameter has (8, 16)"));
  auto dtype = w;
  dtype[0].second = w[0].second.astype(DType::float32);
  CHECK_THROWS_AS(MultiHeadAttention(c, dtype), DTypeError);
  CHECK_THROWS_WITH(MultiHeadAttention(c, dtype), Catch::Contains("'W_QKV' is float32, the parameter is float64"));
}

TEST_CASE("layer dtypes: a float64 input to a float32 layer is a DTypeError naming the layer and both dtypes",
          "[nn][layers][errors]") {
  Generator g(1);
  const Tensor x64(random_normal({2, 3, 4}, g, DType::float64));
  Linear lin(4, 4, g, true, DType::float32);
  CHECK_THROWS_AS(lin(x64), DTypeError);
  CHECK_THROWS_WITH(lin(x64), Catch::Contains("[linear] input x is float64, the layer's W is float32"));
  LayerNorm ln(4, DType::float32);
  CHECK_THROWS_WITH(ln(x64), Catch::Contains("[layer_norm] input x is float64, the layer's gamma is float32"));
  AttentionConfig c;
  c.d_model = 4;
  c.H_q = 2;
  c.dtype = DType::float32;
  MultiHeadAttention mha(c, g);
  CHECK_THROWS_WITH(mha(x64, Visibility::all()), Catch::Contains("[attention] X is float64, the layer is float32"));
  CrossAttentionConfig cc;
  cc.d_q = 4;
  cc.d_m = 4;
  cc.dtype = DType::float32;
  CrossAttention ca(cc, g);
  const Tensor x32(random_normal({2, 3, 4}, g, DType::float32));
  CHECK_THROWS_WITH(ca.forward(x32, x64, AttentionCall{}), Catch::Contains("[cross_attention] X_m is float64"));
  // Ops name themselves and both dtypes too.
  CHECK_THROWS_WITH(x32 + Tensor(random_normal({2, 3, 4}, g, DType::float64)),
                    Catch::Contains("[add]") && Catch::Contains("float32") && Catch::Contains("float64"));
  Tensor leaf(Array::zeros({2}, DType::float32), true);
  CHECK_THROWS_AS(leaf.set_value(Array::zeros({2}, DType::float64)), DTypeError);
}
