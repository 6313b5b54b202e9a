// A registered attention core inside GPT and Llama blocks (nn::register_attention,
// nn/layer_registry.hpp): the registered function is what runs (a self-attention layer's output
// against the same layer computed by hand from its weights), a registered wrapper of the
// built-in core gives the built-in model, KV-cache decoding goes through it and matches the
// full forward, LoRA adapters and gradchecks in float64 work with it, checkpoints name it, and
// the bad-input errors.
#include <cmath>
#include <string>
#include <vector>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/nn/lora.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/llama2c.hpp>

using namespace xg;
using namespace xgt;

namespace {

int sdpa_calls = 0, sigmoid_calls = 0;

// Sigmoid attention: O = sigmoid(Q K^T * scale + M) V, M the visibility's additive bias (a
// hidden key has M = -inf, so its weight is exactly 0). Distinctive: no built-in core computes it.
Tensor sigmoid_attention(const Tensor& Q, const Tensor& K, const Tensor& V, const nn::Visibility& vis,
                         const nn::SdpaOptions& o) {
  ++sigmoid_calls;
  const double scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(Q.shape()[3])));
  const Tensor U = ops::matmul(Q, ops::transpose(K)) * scale + Tensor(vis.bias(Q.dtype()));
  return ops::matmul(ops::sigmoid(U), V);
}

void ensure_registered() {
  if (!nn::is_registered(nn::LayerKind::attention, "test_sdpa"))
    nn::register_attention("test_sdpa", [](const Tensor& Q, const Tensor& K, const Tensor& V,
                                           const nn::Visibility& vis, const nn::SdpaOptions& o) {
      ++sdpa_calls;
      return nn::attention(Q, K, V, vis, o);
    });
  if (!nn::is_registered(nn::LayerKind::attention, "test_sigmoid"))
    nn::register_attention("test_sigmoid", sigmoid_attention);
  if (!nn::is_registered(nn::LayerKind::attention, "test_wrong_shape"))
    nn::register_attention("test_wrong_shape", [](const Tensor& Q, const Tensor&, const Tensor&, const nn::Visibility&,
                                                  const nn::SdpaOptions&) { return ops::transpose(Q, 1, 2); });
  if (!nn::is_registered(nn::LayerKind::attention, "test_wrong_dtype"))
    nn::register_attention("test_wrong_dtype", [](const Tensor& Q, const Tensor&, const Tensor&, const nn::Visibility&,
                                                  const nn::SdpaOptions&) {
      return Tensor(Q.value().astype(Q.dtype() == DType::float64 ? DType::float32 : DType::float64));
    });
}

nn::TransformerConfig gpt2(std::size_t layers = 2) { return tiny_model(nn::Architecture::gpt, layers); }
nn::TransformerConfig llama(std::size_t layers = 2) { return tiny_model(nn::Architecture::llama, layers); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

TEST_CASE("registered attention: the registered core is what a self-attention layer runs", "[layer_registry]") {
  ensure_registered();
  Generator gen(3);
  nn::AttentionConfig a;
  a.d_model = 8;
  a.H_q = 2;
  a.dtype = DType::float64;
  a.core = "test_sigmoid";
  nn::MultiHeadAttention mha(a, gen);
  randomise_parameters(mha, gen);
  const std::size_t T = 4, H = 2, dh = 4, d = 8;
  const Array X = random_uniform({1, T, d}, gen, DType::float64, -1, 1);
  nn::AttentionCall call;
  call.visibility = nn::Visibility::causal(T, T);
  const int before = sigmoid_calls;
  const Array Y = mha.forward(Tensor(X), call).Y.value();
  CHECK(sigmoid_calls == before + 1);
  // By hand: P = X W_QKV + b_QKV; per head O_i = sum_{j <= i} sigmoid(q_i . k_j / 2) v_j;
  // Y = merge(O) W_O + b_O.
  const Array W = mha.W_QKV.value(), b = mha.b_QKV.value(), WO = mha.W_O.value(), bO = mha.b_O.value();
  std::vector<double> P(T * 3 * d, 0.0);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t c = 0; c < 3 * d; ++c) {
      double s = b.flat(c);
      for (std::size_t k = 0; k < d; ++k) s += X.flat(t * d + k) * W.flat(k * 3 * d + c);
      P[t * 3 * d + c] = s;
    }
  std::vector<double> C(T * d, 0.0);  // merged heads
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t j = 0; j <= i; ++j) {
        double u = 0;
        for (std::size_t k = 0; k < dh; ++k) u += P[i * 3 * d + h * dh + k] * P[j * 3 * d + d + h * dh + k];
        const double w = sigmoid(u / std::sqrt(static_cast<double>(dh)));
        for (std::size_t k = 0; k < dh; ++k) C[i * d + h * dh + k] += w * P[j * 3 * d + 2 * d + h * dh + k];
      }
  Array want = Array::zeros({1, T, d}, DType::float64);
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t c = 0; c < d; ++c) {
      double s = bO.flat(c);
      for (std::size_t k = 0; k < d; ++k) s += C[t * d + k] * WO.flat(k * d + c);
      want.set_flat(t * d + c, s);
    }
  XGT_CHECK_WITHIN(Y, want, 1e-12);
}

TEST_CASE("registered attention: a registered wrapper of the built-in core gives the built-in model",
          "[layer_registry]") {
  ensure_registered();
  for (const bool is_llama : {false, true}) {
    INFO((is_llama ? "llama" : "gpt"));
    nn::TransformerConfig c = is_llama ? llama() : gpt2();
    Generator g1(5), g2(5), gt(6);
    nn::GPT built_in(c, g1);
    c.attention = "test_sdpa";
    nn::GPT registered(c, g2);  // the same draws: the registered core has no parameters
    REQUIRE(registered.named_parameters().size() == built_in.named_parameters().size());
    const IndexArray t = random_tokens(gt, 2, 6, 11);
    const int before = sdpa_calls;
    const Array got = registered.logits(t).value();
    CHECK(sdpa_calls == before + 2);  // once per block
    // The built-in blocks take the fused path, the wrapper nn::attention's automatic choice on
    // split heads: the same arithmetic up to rounding (float64).
    XGT_CHECK_WITHIN(got, built_in.logits(t).value(), 1e-12);
  }
}

TEST_CASE("registered attention: KV-cache decoding goes through the core and matches the full forward",
          "[layer_registry][kv_cache]") {
  ensure_registered();
  nn::TransformerConfig c = llama();
  c.attention = "test_sigmoid";
  Generator gen(7), gt(8);
  nn::GPT m(c, gen);
  randomise_parameters(m, gen);
  m.eval();
  const IndexArray t = random_tokens(gt, 2, 7, 11);
  const Array full = m.logits(t).value();  // [2, 7, 11]
  auto caches = m.make_caches(2, 7);
  const int before = sigmoid_calls;
  // A prefix of 3 positions, then one position at a time.
  std::vector<Array> parts;
  const std::vector<std::pair<std::size_t, std::size_t>> pieces = {{0, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}};
  for (const auto& [lo, hi] : pieces) {
    std::vector<std::int64_t> ids;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = lo; i < hi; ++i) ids.push_back(t.data[b * 7 + i]);
    parts.push_back(m.logits_cached(IndexArray({2, hi - lo}, ids), caches).value());
  }
  CHECK(sigmoid_calls == before + static_cast<int>(pieces.size() * c.layers));
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    const auto [lo, hi] = pieces[p];
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = lo; i < hi; ++i)
        for (std::size_t v = 0; v < 11; ++v) {
          const double got = parts[p].flat((b * (hi - lo) + (i - lo)) * 11 + v);
          const double want = full.flat((b * 7 + i) * 11 + v);
          INFO("sample " << b << " position " << i << " id " << v << ": " << sci(got) << " against " << sci(want));
          REQUIRE(std::abs(got - want) <= 1e-12);
        }
  }
}

TEST_CASE("registered attention: gradcheck in float64 of a block and LoRA on its projections",
          "[layer_registry][gradcheck]") {
  ensure_registered();
  for (const bool is_llama : {false, true}) {
    INFO((is_llama ? "llama" : "gpt"));
    nn::TransformerConfig c = is_llama ? llama(1) : gpt2(1);
    c.attention = "test_sigmoid";
    Generator gen(9);
    nn::GPT m(c, gen);
    randomise_parameters(m, gen);
    nn::LoRAConfig lc;
    lc.rank = 2;
    REQUIRE(nn::add_lora(m, "attn", lc, gen) == 4);  // q, k, v, o: the projections are the built-in ones
    randomise_parameters(m, gen);                               // B of each adapter non-zero
    nn::DecoderLayer& b = *m.blocks[0];
    const Tensor x(random_uniform({1, 3, 8}, gen, DType::float64, -1, 1), true);
    std::vector<std::pair<std::string, Tensor>> leaves = {{"x", x}};
    for (const auto& np : b.named_parameters())
      if (np.second.requires_grad()) leaves.push_back(np);
    const int before = sigmoid_calls;
    const GradcheckReport r = gradcheck_leaves(
        [&] {
          nn::AttentionCall call;
          call.visibility = nn::Visibility::causal(3, 3);
          return b(x, call);
        },
        leaves);
    INFO(r.summary());
    CHECK(r.passed);
    CHECK(r.comparisons > 0);
    CHECK(sigmoid_calls > before);
  }
}

TEST_CASE("registered attention: checkpoints name the core and load only where it is registered",
          "[layer_registry][checkpoint]") {
  ensure_registered();
  const auto dir = temp_dir("registered_attention_ckpt");
  Generator gen(10), gt(11);
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "llama2c";
  info.config = llama();
  info.config.attention = "test_sigmoid";
  for (std::size_t i = 0; i < 11; ++i) info.vocab.tokens.push_back("<" + std::to_string(i) + ">");
  nn::GPT m(info.config, gen);
  randomise_parameters(m, gen);
  m.eval();
  const io::safetensors::Metadata meta = train::model_metadata(info);
  CHECK(meta.at("layer_attention") == "test_sigmoid");
  const std::string path = (dir / "m.safetensors").string();
  nn::safetensors::save_module(path, m, meta);
  const IndexArray t = random_tokens(gt, 1, 5, 11);
  {
    train::LoadedModel lm = train::load_model(path);
    CHECK(lm.info.config.attention == "test_sigmoid");
    XGT_CHECK_SAME(lm.gpt->logits(t).value(), m.logits(t).value());  // the same model, the same ops
  }
  // Without the key: the built-in core (checkpoints of models without one keep their bytes).
  info.config.attention.clear();
  CHECK(!train::model_metadata(info).count("layer_attention"));
  // A program that has not registered the core: a FormatError naming it.
  REQUIRE(nn::unregister_layer(nn::LayerKind::attention, "test_sigmoid"));
  const std::string e = error_of<FormatError>([&] { train::load_model(path); });
  nn::register_attention("test_sigmoid", sigmoid_attention);
  CHECK(e.find("attention is the registered layer 'test_sigmoid'") != std::string::npos);
  CHECK(train::load_model(path).gpt != nullptr);  // registered again: it loads
  // run.c computes softmax attention: export refuses.
  const std::string x = error_of<ValueError>([&] { train::llama2c::check_exportable(m.config(), "m"); });
  CHECK(x.find("attention is the registered layer 'test_sigmoid'") != std::string::npos);
}

TEST_CASE("registered attention: bad cores and uses are refused by name", "[layer_registry]") {
  ensure_registered();
  Generator gen(12), gt(13);
  nn::TransformerConfig c = llama();
  c.attention = "no_such_core";
  std::string e = error_of<ValueError>([&] { nn::GPT m(c, gen); });
  CHECK(e.find("attention 'no_such_core' is not registered") != std::string::npos);
  CHECK(e.find("test_sigmoid") != std::string::npos);  // the registered ones are listed
  e = error_of<ValueError>([] { nn::register_attention("test_sigmoid", sigmoid_attention); });
  CHECK(e.find("already registered") != std::string::npos);
  e = error_of<ValueError>([] { nn::register_attention("bad name", sigmoid_attention); });
  CHECK(e.find("'bad name'") != std::string::npos);
  e = error_of<ValueError>([] { nn::register_attention("test_empty_core", nn::AttentionFn{}); });
  CHECK(e.find("empty") != std::string::npos);
  c = gpt2();
  c.attention = "test_sigmoid";
  e = error_of<ValueError>([&] { nn::EncoderDecoder m(c, gen); });
  CHECK(e.find("GPT models only") != std::string::npos);
  // Attention maps need the weights, which a registered core does not give.
  nn::GPT m(c, gen);
  std::vector<nn::AttentionOutput> maps;
  e = error_of<ValueError>([&] { m.logits(random_tokens(gt, 1, 4, 11), nullptr, &maps); });
  CHECK(e.find("registered attention 'test_sigmoid' gives no weights") != std::string::npos);
  // A core that returns the wrong shape or dtype: an error naming it, not a wrong model.
  c.attention = "test_wrong_shape";
  nn::GPT bad_shape(c, gen);
  e = error_of<ShapeError>([&] { bad_shape.logits(random_tokens(gt, 1, 4, 11)); });
  CHECK(e.find("registered attention 'test_wrong_shape' returned (1, 4, 2, 4)") != std::string::npos);
  c.attention = "test_wrong_dtype";
  nn::GPT bad_dtype(c, gen);
  e = error_of<DTypeError>([&] { bad_dtype.logits(random_tokens(gt, 1, 4, 11)); });
  CHECK(e.find("registered attention 'test_wrong_dtype' returned float32") != std::string::npos);
}
