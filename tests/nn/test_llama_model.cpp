// The Llama block and model (nn/transformer.hpp, arch llama; docs/llama.md): the hidden-size
// rule, parameter names and counts against the formula worked out here (not read from the
// code), validation, the tied classifier's gradient as the sum of both uses, KV-cache decoding
// against the full forward (with and without a window), K/V-head pooling, and the checkpoint
// writer's refusal. Values against PyTorch: tests/torch/llama_model_crosscheck.py.
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/checks/kv_cache_check.hpp>
#include <xgrad/nn/kv_head_pooling.hpp>
#include <xgrad/train/checkpoint.hpp>

using namespace xg;
using namespace xgt;

namespace {

nn::TransformerConfig llama(std::size_t d = 16, std::size_t H_q = 4, std::size_t H_kv = 2, std::size_t layers = 2) {
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = 13;
  c.context = 16;
  c.d_model = d;
  c.H_q = H_q;
  c.H_kv = H_kv;
  c.layers = layers;
  c.multiple_of = 8;
  c.dtype = DType::float64;
  return c;
}

// Every parameter re-drawn from uniform [-a, a] (norm gains around 1), so that no term is tiny.
void randomise(nn::Module& m, Generator& g, double a = 0.3) {
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    const bool gain = name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    t.set_value(gain ? random_uniform(t.shape(), g, t.dtype(), 0.5, 1.5) : random_uniform(t.shape(), g, t.dtype(), -a, a));
  }
}

IndexArray tokens(Generator& g, std::size_t B, std::size_t T, std::size_t V) {
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = static_cast<std::int64_t>(g.below(V));
  return IndexArray({B, T}, ids);
}

std::map<std::string, Shape> shapes(const nn::Module& m) {
  std::map<std::string, Shape> s;
  for (const auto& [name, p] : m.named_parameters()) s[name] = p.shape();
  return s;
}

void require_throws_naming(const std::function<void()>& f, const std::string& word) {
  try {
    f();
    FAIL("no ValueError naming " << word);
  } catch (const ValueError& e) {
    CHECK_THAT(e.what(), Catch::Contains(word));
  }
}

}  // namespace

TEST_CASE("llama: the feed-forward width follows llama2.c's rule unless d_ff is given", "[llama]") {
  // int(2 * 4d / 3) rounded up to a multiple of multiple_of, worked by hand:
  CHECK(nn::llama_hidden_size(288, 32) == 768);      // 2 * 1152 / 3 = 768 (stories15M)
  CHECK(nn::llama_hidden_size(512, 32) == 1376);     // 1365 -> 43 * 32 (stories42M)
  CHECK(nn::llama_hidden_size(768, 32) == 2048);     // 2048 (stories110M)
  CHECK(nn::llama_hidden_size(4096, 256) == 11008);  // 10922 -> 43 * 256 (Llama 2 7B)
  CHECK(nn::llama_hidden_size(16, 8) == 48);         // 42 -> 48
  CHECK(nn::llama_hidden_size(64, 256) == 256);      // 170 -> 256 (the default multiple_of)
  require_throws_naming([] { (void)nn::llama_hidden_size(16, 0); }, "multiple_of");

  nn::TransformerConfig c = llama();
  CHECK(c.resolved().d_ff == 48);
  c.d_ff = 20;
  CHECK(c.resolved().d_ff == 20);  // given explicitly: kept
  nn::TransformerConfig g;         // gpt keeps 4 d
  g.V_vocab = 5;
  g.context = 4;
  g.d_model = 16;
  g.multiple_of = 8;
  CHECK(g.resolved().d_ff == 64);
}

TEST_CASE("llama: stories15M's shape has the parameter count of the Llama formula and the documented names",
          "[llama]") {
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = 32000;
  c.context = 256;
  c.d_model = 288;
  c.layers = 6;
  c.H_q = 6;
  c.multiple_of = 32;
  c.dtype = DType::float32;
  // By hand: embedding V d = 9,216,000; per layer wq wk wv wo 4 d^2 = 331,776, w1 w2 w3
  // 3 d 768 = 663,552, two RMSNorm gains 576, so 995,904 x 6 = 5,975,424; final norm 288.
  const std::size_t expected = 32000 * 288 + 6 * (4 * 288 * 288 + 3 * 288 * 768 + 2 * 288) + 288;
  REQUIRE(expected == 15191712);
  Generator gen(1);
  nn::GPT m(c, gen);
  CHECK(m.parameter_count() == expected);
  CHECK(m.config().d_ff == 768);

  const auto s = shapes(m);
  CHECK(s.size() == 1 + 6 * 7 + 1);  // tok, 7 per layer, norm
  CHECK(s.at("tok.weight") == Shape{32000, 288});
  CHECK(s.at("blocks.5.attn_norm.weight") == Shape{288});
  CHECK(s.at("blocks.5.attn.W_QKV") == Shape{288, 3 * 288});
  CHECK(s.at("blocks.5.attn.W_O") == Shape{288, 288});
  CHECK(s.at("blocks.5.ffn_norm.weight") == Shape{288});
  CHECK(s.at("blocks.5.ffn.gate.W") == Shape{288, 768});
  CHECK(s.at("blocks.5.ffn.up.W") == Shape{288, 768});
  CHECK(s.at("blocks.5.ffn.down.W") == Shape{768, 288});
  CHECK(s.at("norm.weight") == Shape{288});
  CHECK(s.count("classifier.weight") == 0);
}

TEST_CASE("llama: GQA and an untied classifier add what the formula says and no biases exist", "[llama]") {
  nn::TransformerConfig c = llama(16, 4, 2, 2);  // d_h 4, K/V width 2 * 4 = 8, d_ff 48
  c.tie_embeddings = false;
  Generator gen(2);
  nn::GPT m(c, gen);
  const std::size_t d = 16, kv = 8, f = 48, V = 13;
  const std::size_t per_layer = d * (d + 2 * kv) + d * d + 3 * d * f + 2 * d;
  CHECK(m.parameter_count() == 2 * V * d + 2 * per_layer + d);
  for (const auto& [name, p] : m.named_parameters()) {
    INFO(name);
    CHECK(name.find(".b") == std::string::npos);  // no b, b_QKV, b_O
    CHECK(name.find("pos") == std::string::npos);
    CHECK(name.find("ln") == std::string::npos);
  }
  CHECK(shapes(m).at("classifier.weight") == Shape{V, d});
  CHECK(&m.classifier_weight() == &m.classifier->weight);
  CHECK_FALSE(m.blocks[0]->attn.config().bias);
  REQUIRE(m.blocks[0]->attn.config().rope.has_value());
  CHECK(m.blocks[0]->attn.config().rope->layout == ops::RopeLayout::interleaved);
  CHECK(m.logits(tokens(gen, 2, 5, V)).shape() == Shape{2, 5, V});
}

TEST_CASE("llama: bad combinations are ValueErrors naming the field", "[llama]") {
  Generator gen(3);
  nn::TransformerConfig c = llama();
  c.pos = nn::PositionScheme::learned;
  require_throws_naming([&] { (void)c.resolved(); }, "pos");
  c.pos = nn::PositionScheme::alibi;
  require_throws_naming([&] { nn::GPT m(c, gen); }, "pos");
  c = llama();
  c.multiple_of = 0;
  require_throws_naming([&] { (void)c.resolved(); }, "multiple_of");
  c = llama();
  c.norm_eps = 0;
  require_throws_naming([&] { (void)c.resolved(); }, "norm_eps");
  c.norm_eps = std::nan("");
  require_throws_naming([&] { (void)c.resolved(); }, "norm_eps");
  nn::TransformerConfig g;  // gpt
  g.V_vocab = 5;
  g.context = 4;
  g.tie_embeddings = false;
  require_throws_naming([&] { (void)g.resolved(); }, "tie_embeddings");
  require_throws_naming([&] { nn::EncoderDecoder m(llama(), gen); }, "arch");
  g.tie_embeddings = true;
  require_throws_naming([&] { nn::LlamaBlock b(g.resolved(), gen); }, "arch");
  require_throws_naming([&] { nn::DecoderBlock b(llama().resolved(), gen); }, "arch");
  CHECK(nn::architecture_from_name("llama") == nn::Architecture::llama);
  CHECK(nn::architecture_name(nn::Architecture::gpt) == "gpt");
  require_throws_naming([] { (void)nn::architecture_from_name("mistral"); }, "mistral");
}

TEST_CASE("llama: the tied classifier's gradient is the sum of the embedding's and the classifier's", "[llama]") {
  Generator gen(4);
  nn::TransformerConfig ct = llama(), cu = llama();
  cu.tie_embeddings = false;
  nn::GPT tied(ct, gen), untied(cu, gen);
  randomise(tied, gen);
  // The untied model: every shared name copied, and its classifier equal to the embedding.
  std::vector<std::pair<std::string, Array>> w;
  for (const auto& [name, p] : tied.named_parameters()) w.emplace_back(name, p.value().clone());
  w.emplace_back("classifier.weight", tied.tok.weight.value().clone());
  untied.set_weights(w);

  const IndexArray in = tokens(gen, 2, 6, 13), target = tokens(gen, 2, 6, 13);
  const Tensor lt = tied.loss(in, target);
  const double loss_tied = lt.value().flat(0);
  const Array g_tied = grad(lt, {tied.tok.weight})[0];
  const Tensor lu = untied.loss(in, target);
  CHECK(std::fabs(loss_tied - lu.value().flat(0)) < 1e-14);
  const std::vector<Array> g_untied = grad(lu, {untied.tok.weight, untied.classifier->weight});
  // Both uses contribute (neither gradient is zero), and the tied one is their sum.
  CHECK(max_abs_diff(g_untied[0], Array::zeros(g_untied[0].shape(), DType::float64)) > 1e-3);
  CHECK(max_abs_diff(g_untied[1], Array::zeros(g_untied[1].shape(), DType::float64)) > 1e-3);
  Array sum = g_untied[0].clone();
  for (std::size_t i = 0; i < sum.size(); ++i) sum.set_flat(i, g_untied[0].flat(i) + g_untied[1].flat(i));
  CHECK(max_abs_diff(g_tied, sum) < 1e-13);
}

TEST_CASE("llama: KV-cache decoding equals the full forward with and without a window", "[llama]") {
  Generator gen(5);
  for (const std::size_t window : {std::size_t(0), std::size_t(3)})
    for (const ops::RopeLayout layout : {ops::RopeLayout::interleaved, ops::RopeLayout::half_split}) {
      INFO("window " << window << ", layout " << ops::rope_layout_name(layout));
      nn::TransformerConfig c = llama(16, 4, 2, 2);
      c.window = window;
      c.rope.layout = layout;
      c.tie_embeddings = window == 0;
      auto m = std::make_shared<nn::GPT>(c, gen);
      randomise(*m, gen);
      const KVCacheReport r = check_kv_cache(
          kv_cache_decoder([m](const IndexArray& t) { return m->logits(t); }, [m] { return m->make_caches(2, 10); },
                           [m](std::vector<nn::KVCache>& caches, const IndexArray& t) { return m->logits_cached(t, caches); }),
          tokens(gen, 2, 10, 13));
      INFO(r.summary());
      CHECK(r.passed);
      CHECK(r.comparisons.size() >= 5);
    }
}

TEST_CASE("llama: pooling K/V heads keeps the bias-free Llama model and its names", "[llama][convert]") {
  Generator gen(6);
  nn::TransformerConfig c = llama(16, 4, 4, 2);  // MHA
  c.tie_embeddings = false;
  nn::GPT m(c, gen);
  randomise(m, gen);
  const IndexArray in = tokens(gen, 1, 6, 13);
  const auto same = nn::with_kv_heads(m, 4);
  XGT_CHECK_SAME(same->logits(in).value(), m.logits(in).value());  // a copy: the same weights and calls
  const auto gqa = nn::with_kv_heads(m, 2);
  CHECK(gqa->config().arch == nn::Architecture::llama);
  CHECK(gqa->config().H_kv == 2);
  CHECK_FALSE(gqa->blocks[1]->attn.config().bias);
  std::set<std::string> a, b;
  for (const auto& kv : m.named_parameters()) a.insert(kv.first);
  for (const auto& kv : gqa->named_parameters()) b.insert(kv.first);
  CHECK(a == b);
  const Array& old = m.blocks[1]->attn.W_QKV.value();
  const Array& now = gqa->blocks[1]->attn.W_QKV.value();
  REQUIRE(now.shape() == Shape{16, 16 + 2 * 8});
  for (std::size_t i = 0; i < 16; ++i)
    for (std::size_t j = 0; j < 4; ++j) {
      CHECK(now.at({i, 16 + j}) == (old.at({i, 16 + j}) + old.at({i, 20 + j})) / 2);  // K head 0
      CHECK(now.at({i, 24 + j}) == (old.at({i, 32 + j}) + old.at({i, 36 + j})) / 2);  // V head 0
    }
  XGT_CHECK_SAME(gqa->classifier->weight.value(), m.classifier->weight.value());  // copied
  CHECK(gqa->logits(in).shape() == Shape{1, 6, 13});
}

TEST_CASE("llama: dropout in training needs a generator and is off in eval", "[llama]") {
  Generator gen(7);
  nn::TransformerConfig c = llama();
  c.dropout = 0.2;
  nn::GPT m(c, gen);
  const IndexArray in = tokens(gen, 2, 5, 13);
  CHECK_THROWS_AS(m.logits(in), ValueError);
  Generator d1(9), d2(9);
  XGT_CHECK_SAME(m.logits(in, &d1).value(), m.logits(in, &d2).value());  // same seed, same calls
  m.eval();
  const Array e = m.logits(in).value();
  Generator d3(9);
  m.train();
  CHECK(max_abs_diff(m.logits(in, &d3).value(), e) > 1e-6);  // dropout changed something
}

TEST_CASE("llama: checkpoint metadata names the architecture and reads back the same model", "[llama]") {
  for (const bool tied : {true, false}) {
    train::ModelInfo info;
    info.kind = train::ModelKind::gpt;
    info.task = "charlm";
    info.config = llama();
    info.config.tie_embeddings = tied;
    info.config.multiple_of = 32;
    info.config.norm_eps = 1e-6;
    for (std::size_t i = 0; i < info.config.V_vocab; ++i) info.vocab.tokens.push_back(std::string(1, char('a' + i % 26)));
    const auto meta = train::model_metadata(info);
    CHECK(meta.at("arch") == "llama");
    const train::ModelInfo back = train::model_info(meta, "m.safetensors");
    CHECK(back.config.arch == nn::Architecture::llama);
    CHECK(back.config.tie_embeddings == tied);
    CHECK(back.config.multiple_of == 32);
    CHECK(back.config.norm_eps == 1e-6);
    Generator gen(3);
    nn::GPT m(back.config, gen);
    CHECK(train::parameter_count(train::ModelKind::gpt, back.config) == m.parameter_count());
  }
  train::ModelInfo gpt2;
  gpt2.kind = train::ModelKind::gpt;
  gpt2.task = "charlm";
  gpt2.config = llama();
  gpt2.config.arch = nn::Architecture::gpt;
  gpt2.config.pos = nn::PositionScheme::learned;
  for (std::size_t i = 0; i < gpt2.config.V_vocab; ++i) gpt2.vocab.tokens.push_back("t");
  CHECK(train::model_metadata(gpt2).count("arch") == 0);  // GPT-2 checkpoints keep their keys
}

TEST_CASE("llama: packed documents with restarted positions give each document's logits as if alone", "[llama]") {
  Generator gen(8);
  nn::TransformerConfig c = llama(16, 4, 2, 2);
  c.tie_embeddings = false;
  nn::GPT m(c, gen);
  randomise(m, gen, 0.5);
  // Documents of 3, 5 and 2 tokens packed into T = 10, positions restarting at each.
  const std::vector<std::size_t> lens = {3, 5, 2};
  const IndexArray in = tokens(gen, 1, 10, 13);
  nn::GPTCall call;
  std::vector<std::int64_t> doc;
  for (std::size_t d = 0; d < lens.size(); ++d)
    for (std::size_t i = 0; i < lens[d]; ++i) {
      call.positions.push_back(static_cast<nn::Position>(i));
      doc.push_back(static_cast<std::int64_t>(d));
    }
  call.visibility = nn::Visibility::documents(IndexArray({1, 10}, doc));
  const Array packed = m.logits(in, call).value();
  std::size_t at = 0;
  for (std::size_t d = 0; d < lens.size(); ++d) {
    const std::size_t n = lens[d];
    const IndexArray alone({1, n}, std::vector<std::int64_t>(in.data.begin() + at, in.data.begin() + at + n));
    const Array a = m.logits(alone).value();
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t v = 0; v < 13; ++v) worst = std::max(worst, std::fabs(packed.at({0, at + i, v}) - a.at({0, i, v})));
    INFO("document " << d);
    CHECK(worst < 1e-12);
    at += n;
  }
  // The document rule matters: with the restarted positions alone (every token sees every
  // earlier one) the logits differ. (Positions 0 .. 9 with the rule would not: RoPE scores
  // depend only on position differences, which are the same inside each document.)
  nn::GPTCall positions_only;
  positions_only.positions = call.positions;
  CHECK(max_abs_diff(m.logits(in, positions_only).value(), packed) > 1e-6);
}
