// Registered layers inside GPT and Llama (nn/layer_registry.hpp): the registered activation,
// MLP and norm are what runs (block outputs against the same block computed by hand from its
// weights with primitive ops), a registered copy of the built-in layer gives the built-in
// model's logits, gradchecks in float64 of blocks built with them, checkpoints that name them
// (loading where they are not registered is an error naming the layer), and the bad-input errors.
#include <cmath>
#include <map>
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/nn/lora.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/llama2c.hpp>

using namespace xg;
using namespace xgt;

namespace {

// x^2 + x: distinctive (no built-in activation is it) and smooth for gradchecks.
Tensor square_plus(const Tensor& x) { return x * x + x; }

// A feed-forward sub-layer of its own: y = tanh(x W) * s, with W [d, d] and s [d].
class TanhMLP : public nn::MLPLayer {
 public:
  TanhMLP(const nn::TransformerConfig& c, Generator& gen)
      : W(random_normal({c.d_model, c.d_model}, gen, c.dtype, 0.0, 0.3), true),
        s(random_uniform({c.d_model}, gen, c.dtype, 0.5, 1.5), true) {
    W = register_parameter("W", W.value());
    s = register_parameter("s", s.value());
  }
  Tensor operator()(const Tensor& x, Generator*) const override { return ops::tanh(ops::matmul(x, W)) * s; }
  Tensor W, s;
};

// LayerNorm behind the registry (the built-in layer, registered under another name).
class MyLayerNorm : public nn::NormLayer {
 public:
  MyLayerNorm(std::size_t d, DType dt) : ln(d, dt) { register_module("", ln); }
  Tensor operator()(const Tensor& x) const override {
    ++calls;
    return ln(x);
  }
  nn::LayerNorm ln;
  static inline int calls = 0;
};

// A norm without parameters that is not a built-in one: x / (mean |x| + 1).
class MeanAbsNorm : public nn::NormLayer {
 public:
  Tensor operator()(const Tensor& x) const override {
    const Tensor m = ops::mean(ops::abs(x), {static_cast<int>(x.shape().size()) - 1}, true);
    return x / (m + 1.0);
  }
};

void ensure_registered() {
  if (!nn::is_registered(nn::LayerKind::activation, "test_square_plus"))
    nn::register_activation("test_square_plus", square_plus);
  if (!nn::is_registered(nn::LayerKind::activation, "test_silu"))
    nn::register_activation("test_silu", [](const Tensor& x) { return ops::silu(x); });
  if (!nn::is_registered(nn::LayerKind::activation, "test_gelu"))
    nn::register_activation("test_gelu", [](const Tensor& x) { return ops::gelu(x); });
  if (!nn::is_registered(nn::LayerKind::mlp, "test_tanh_mlp"))
    nn::register_mlp("test_tanh_mlp", [](const nn::TransformerConfig& c, Generator& g) {
      return std::make_unique<TanhMLP>(c, g);
    });
  if (!nn::is_registered(nn::LayerKind::norm, "test_layer_norm"))
    nn::register_norm("test_layer_norm", [](const nn::TransformerConfig& c, std::size_t d) {
      return std::make_unique<MyLayerNorm>(d, c.dtype);
    });
  if (!nn::is_registered(nn::LayerKind::norm, "test_mean_abs"))
    nn::register_norm("test_mean_abs", [](const nn::TransformerConfig&, std::size_t) {
      return std::make_unique<MeanAbsNorm>();
    });
}

nn::TransformerConfig gpt2(std::size_t layers = 2) { return tiny_model(nn::Architecture::gpt, layers); }
nn::TransformerConfig llama(std::size_t layers = 2) { return tiny_model(nn::Architecture::llama, layers); }

// The block's output with dropout off, computed from its parts: h = x + attn(n1(x)); h + f(n2(h)).
Tensor block_by_hand(nn::DecoderLayer& b, const Tensor& x, const std::function<Tensor(const Tensor&)>& n1,
                     const std::function<Tensor(const Tensor&)>& n2, const std::function<Tensor(const Tensor&)>& f) {
  nn::AttentionCall call;
  call.visibility = nn::Visibility::causal(x.shape()[1], x.shape()[1]);
  const Tensor h = x + b.attn.forward(n1(x), call).Y;
  return h + f(n2(h));
}

Tensor run_block(nn::DecoderLayer& b, const Tensor& x) {
  nn::AttentionCall call;
  call.visibility = nn::Visibility::causal(x.shape()[1], x.shape()[1]);
  return b(x, call);
}

}  // namespace

TEST_CASE("layer registry: a registered activation runs inside the GPT-2 feed-forward", "[layer_registry]") {
  ensure_registered();
  Generator gen(1);
  nn::TransformerConfig c = gpt2();
  c.activation = "test_square_plus";
  nn::GPT m(c, gen);
  randomise_parameters(m, gen);
  auto* b = dynamic_cast<nn::DecoderBlock*>(m.blocks[0].get());
  REQUIRE(b != nullptr);  // an activation alone keeps the built-in block (LoRA and exporters see it)
  const Tensor x(random_uniform({2, 5, 8}, gen, DType::float64, -1, 1));
  // fc2(a(fc1 x)) with a(u) = u^2 + u, written out with matmul and elementwise ops.
  const auto ffn = [&](const Tensor& u) {
    const Tensor z = ops::matmul(u, b->ffn.fc1.W) + b->ffn.fc1.b;
    return ops::matmul(z * z + z, b->ffn.fc2.W) + b->ffn.fc2.b;
  };
  const auto ln1 = [&](const Tensor& u) { return b->ln1(u); };
  const auto ln2 = [&](const Tensor& u) { return b->ln2(u); };
  // The same ops in the same order on the same shapes: the same bits.
  XGT_CHECK_SAME(run_block(*b, x).value(), block_by_hand(*b, x, ln1, ln2, ffn).value());
  // And it is not GELU: the built-in block differs.
  const auto gelu_ffn = [&](const Tensor& u) { return b->ffn.fc2(ops::gelu(b->ffn.fc1(u))); };
  CHECK(max_abs_diff(run_block(*b, x).value(), block_by_hand(*b, x, ln1, ln2, gelu_ffn).value()) > 1e-3);
}

TEST_CASE("layer registry: a registered activation replaces SiLU in the Llama SwiGLU", "[layer_registry]") {
  ensure_registered();
  Generator gen(2);
  nn::TransformerConfig c = llama();
  c.activation = "test_square_plus";
  nn::GPT m(c, gen);
  randomise_parameters(m, gen);
  auto* b = dynamic_cast<nn::LlamaBlock*>(m.blocks[1].get());
  REQUIRE(b != nullptr);
  const Tensor x(random_uniform({2, 4, 8}, gen, DType::float64, -1, 1));
  const auto ffn = [&](const Tensor& u) {
    const Tensor g = ops::matmul(u, b->ffn.gate.W);
    return ops::matmul((g * g + g) * ops::matmul(u, b->ffn.up.W), b->ffn.down.W);
  };
  XGT_CHECK_SAME(run_block(*b, x).value(),
                 block_by_hand(*b, x, [&](const Tensor& u) { return b->attn_norm(u); },
                               [&](const Tensor& u) { return b->ffn_norm(u); }, ffn)
                     .value());
}

TEST_CASE("layer registry: a registered copy of the built-in activation gives the built-in model", "[layer_registry]") {
  ensure_registered();
  for (const bool is_llama : {false, true}) {
    INFO((is_llama ? "llama" : "gpt"));
    nn::TransformerConfig base = is_llama ? llama() : gpt2(), copy = base;
    copy.activation = is_llama ? "test_silu" : "test_gelu";
    Generator g1(3), g2(3), gt(4);
    nn::GPT a(base, g1), b(copy, g2);  // the activation draws nothing: the same weights
    const IndexArray t = random_tokens(gt, 2, 6, 11);
    // silu(a) * b against the fused swiglu, gelu(x W + b) against bias_gelu: the same function,
    // rounded apart by a few units in the last place of float64.
    XGT_CHECK_WITHIN(b.logits(t).value(), a.logits(t).value(), 1e-12);
  }
}

TEST_CASE("layer registry: a registered MLP is the feed-forward sub-layer of GPT and Llama blocks", "[layer_registry]") {
  ensure_registered();
  for (const bool is_llama : {false, true}) {
    INFO((is_llama ? "llama" : "gpt"));
    Generator gen(5);
    nn::TransformerConfig c = is_llama ? llama() : gpt2();
    c.mlp = "test_tanh_mlp";
    nn::GPT m(c, gen);
    randomise_parameters(m, gen);
    auto* b = dynamic_cast<nn::RegisteredBlock*>(m.blocks[0].get());
    REQUIRE(b != nullptr);
    // Its parameters are the block's ffn.*, the built-in ones are gone.
    std::map<std::string, Shape> names;
    for (const auto& [n, p] : m.named_parameters()) names[n] = p.shape();
    CHECK(names.count("blocks.0.ffn.W"));
    CHECK(names.count("blocks.1.ffn.s"));
    CHECK(!names.count("blocks.0.ffn.fc1.W"));
    CHECK(!names.count("blocks.0.ffn.gate.W"));
    CHECK(names.count(is_llama ? "blocks.0.attn_norm.weight" : "blocks.0.ln1.gamma"));
    const Tensor x(random_uniform({2, 5, 8}, gen, DType::float64, -1, 1));
    const Tensor W = m.parameter("blocks.0.ffn.W"), s = m.parameter("blocks.0.ffn.s");
    const auto ffn = [&](const Tensor& u) { return ops::tanh(ops::matmul(u, W)) * s; };
    const auto n1 = [&](const Tensor& u) { return (*b->norm1)(u); };
    const auto n2 = [&](const Tensor& u) { return (*b->norm2)(u); };
    XGT_CHECK_SAME(run_block(*b, x).value(), block_by_hand(*b, x, n1, n2, ffn).value());
  }
}

TEST_CASE("layer registry: a registered norm replaces every norm and a copy of LayerNorm is the built-in model",
          "[layer_registry]") {
  ensure_registered();
  nn::TransformerConfig base = gpt2(3), copy = base;
  copy.norm = "test_layer_norm";
  Generator g1(6), g2(6), gt(7);
  nn::GPT a(base, g1), b(copy, g2);
  // The same names in the same order and the same draws.
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    CHECK(pa[i].first == pb[i].first);
    XGT_CHECK_SAME(pa[i].second.value(), pb[i].second.value());
  }
  const IndexArray t = random_tokens(gt, 2, 6, 11);
  MyLayerNorm::calls = 0;
  const Array lb = b.logits(t).value();
  CHECK(MyLayerNorm::calls == 2 * 3 + 1);  // both norms of 3 blocks and the final one
  XGT_CHECK_SAME(lb, a.logits(t).value());  // LayerNorm on the same inputs either way
  // A norm of another function changes the model.
  nn::TransformerConfig other = base;
  other.norm = "test_mean_abs";
  Generator g3(6);
  nn::GPT c(other, g3);
  CHECK(c.parameter_count() == a.parameter_count() - (2 * 3 + 1) * 2 * 8);  // no gains, no biases
  CHECK(max_abs_diff(c.logits(t).value(), lb) > 1e-3);
}

TEST_CASE("layer registry: gradcheck in float64 of blocks built with registered layers", "[layer_registry][gradcheck]") {
  ensure_registered();
  struct Case {
    const char* name;
    bool llama;
    std::string activation, mlp, norm;
  };
  for (const Case& k : {Case{"gpt activation", false, "test_square_plus", "", ""},
                        Case{"llama activation + norm", true, "test_square_plus", "", "test_mean_abs"},
                        Case{"gpt mlp + norm", false, "", "test_tanh_mlp", "test_mean_abs"},
                        Case{"llama mlp", true, "", "test_tanh_mlp", ""}}) {
    INFO(k.name);
    Generator gen(8);
    nn::TransformerConfig c = k.llama ? llama(1) : gpt2(1);
    c.activation = k.activation;
    c.mlp = k.mlp;
    c.norm = k.norm;
    nn::GPT m(c, gen);
    randomise_parameters(m, gen);
    nn::DecoderLayer& b = *m.blocks[0];
    const Tensor x(random_uniform({1, 3, 8}, gen, DType::float64, -1, 1), true);
    std::vector<std::pair<std::string, Tensor>> leaves = {{"x", x}};
    for (const auto& np : b.named_parameters()) leaves.push_back(np);
    const GradcheckReport r = gradcheck_leaves([&] { return run_block(b, x); }, leaves);
    INFO(r.summary());
    CHECK(r.passed);
  }
}

TEST_CASE("layer registry: bad names and layers are refused by name", "[layer_registry]") {
  ensure_registered();
  Generator gen(9);
  nn::TransformerConfig c = gpt2();
  c.mlp = "no_such_mlp";
  std::string e = error_of<ValueError>([&] { nn::GPT m(c, gen); });
  CHECK(e.find("mlp 'no_such_mlp' is not registered") != std::string::npos);
  CHECK(e.find("test_tanh_mlp") != std::string::npos);  // the registered ones are listed
  c.mlp = "test_tanh_mlp";
  c.activation = "test_square_plus";
  e = error_of<ValueError>([&] { nn::GPT m(c, gen); });
  CHECK(e.find("activation 'test_square_plus' and mlp 'test_tanh_mlp'") != std::string::npos);
  c = gpt2();
  c.norm = "test_layer_norm";
  e = error_of<ValueError>([&] { nn::EncoderDecoder m(c, gen); });
  CHECK(e.find("GPT models only") != std::string::npos);
  e = error_of<ValueError>([] { nn::register_activation("test_square_plus", square_plus); });
  CHECK(e.find("already registered") != std::string::npos);
  e = error_of<ValueError>([] { nn::register_activation("has space", square_plus); });
  CHECK(e.find("'has space'") != std::string::npos);
  e = error_of<ValueError>([] { nn::register_mlp("test_empty", nn::MLPFactory{}); });
  CHECK(e.find("empty") != std::string::npos);
  // An activation that changes the shape: a ShapeError, not a wrong model.
  if (!nn::is_registered(nn::LayerKind::activation, "test_bad_shape"))
    nn::register_activation("test_bad_shape", [](const Tensor& x) { return ops::sum(x, {static_cast<int>(x.shape().size()) - 1}, true); });
  c = gpt2();
  c.activation = "test_bad_shape";
  nn::GPT m(c, gen);
  e = error_of<ShapeError>([&] { m.logits(random_tokens(gen, 1, 3, 11)); });
  CHECK(e.find("keeps the shape") != std::string::npos);
}

TEST_CASE("layer registry: checkpoints name the registered layers and load only where they are registered",
          "[layer_registry][checkpoint]") {
  ensure_registered();
  const auto dir = temp_dir("layer_registry_ckpt");
  Generator gen(10), gt(11);
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "llama2c";
  info.config = llama();
  info.config.norm = "test_mean_abs";
  info.config.mlp = "test_tanh_mlp";
  for (std::size_t i = 0; i < 11; ++i) info.vocab.tokens.push_back("<" + std::to_string(i) + ">");
  nn::GPT m(info.config, gen);
  randomise_parameters(m, gen);
  const io::safetensors::Metadata meta = train::model_metadata(info);
  CHECK(meta.at("layer_mlp") == "test_tanh_mlp");
  CHECK(meta.at("layer_norm") == "test_mean_abs");
  CHECK(!meta.count("layer_activation"));
  const std::string path = (dir / "m.safetensors").string();
  nn::safetensors::save_module(path, m, meta);
  const IndexArray t = random_tokens(gt, 1, 5, 11);
  m.eval();
  {
    train::LoadedModel lm = train::load_model(path);
    CHECK(lm.info.config.mlp == "test_tanh_mlp");
    XGT_CHECK_SAME(lm.gpt->logits(t).value(), m.logits(t).value());  // the same model, the same ops
  }
  // A program that has not registered the mlp: a FormatError naming it.
  REQUIRE(nn::unregister_layer(nn::LayerKind::mlp, "test_tanh_mlp"));
  const std::string e = error_of<FormatError>([&] { train::load_model(path); });
  nn::register_mlp("test_tanh_mlp", [](const nn::TransformerConfig& c, Generator& g) {
    return std::make_unique<TanhMLP>(c, g);
  });
  CHECK(e.find("mlp is the registered layer 'test_tanh_mlp'") != std::string::npos);
  CHECK(e.find("not registered") != std::string::npos);
  CHECK(train::load_model(path).gpt != nullptr);  // registered again: it loads
}

TEST_CASE("layer registry: llama2c export refuses a model with a registered layer", "[layer_registry]") {
  ensure_registered();
  nn::TransformerConfig c = llama();
  CHECK_NOTHROW(train::llama2c::check_exportable(c.resolved(), "m"));
  c.activation = "test_silu";  // the same function as SiLU, yet not what run.c is known to compute
  const std::string e = error_of<ValueError>([&] { train::llama2c::check_exportable(c.resolved(), "m"); });
  CHECK(e.find("activation is the registered layer 'test_silu'") != std::string::npos);
}

TEST_CASE("layer registry: LoRA on the projections of blocks with a registered norm or mlp", "[layer_registry][lora]") {
  ensure_registered();
  for (const bool with_mlp : {false, true}) {
    INFO((with_mlp ? "registered mlp" : "registered norm"));
    Generator gen(14), gt(15);
    nn::TransformerConfig c = llama();
    if (with_mlp)
      c.mlp = "test_tanh_mlp";
    else
      c.norm = "test_mean_abs";
    nn::GPT m(c, gen);
    randomise_parameters(m, gen);
    m.eval();
    const IndexArray t = random_tokens(gt, 2, 5, 11);
    const Array before = m.logits(t).value();
    nn::LoRAConfig lc;
    lc.rank = 2;
    REQUIRE(nn::add_lora(m, "attn", lc, gen) == 8);  // q, k, v, o of both blocks
    CHECK(nn::count_adapters(m) == 8);
    randomise_parameters(m, gen);  // the adapters' B away from zero: they change the model
    const Array adapted = m.logits(t).value();
    CHECK(max_abs_diff(adapted, before) > 1e-3);
    std::size_t adapters = 8;
    if (with_mlp) {  // the feed-forward sub-layer is the registry's: its projections are not LoRA targets
      const std::string e = error_of<ValueError>([&] { nn::add_lora(m, "mlp", lc, gen); });
      CHECK(e.find("has no projection 'gate' (its feed-forward sub-layer is the registered mlp 'test_tanh_mlp')") !=
            std::string::npos);
    } else {  // a registered norm keeps the built-in SwiGLU: gate, up and down take adapters
      REQUIRE(nn::add_lora(m, "mlp", lc, gen) == 6);
      adapters += 6;
      CHECK(m.named_parameters().size() > 0);
      bool found = false;
      for (const auto& np : m.named_parameters()) found = found || np.first == "blocks.1.ffn.down.lora_B";
      CHECK(found);
    }
    randomise_parameters(m, gen);
    const Array adapted2 = m.logits(t).value();
    // Merging folds the adapters in: the same function, up to rounding (float64).
    REQUIRE(nn::merge_lora(m) == adapters);
    CHECK(nn::count_adapters(m) == 0);
    XGT_CHECK_WITHIN(m.logits(t).value(), adapted2, 1e-12);
  }
}
