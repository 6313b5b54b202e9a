// GPT-2 blocks without biases (nn::TransformerConfig::bias false, nanoGPT's bias=False;
// `xgrad train --no-bias`): which parameters go (counted by the formula worked out here, not
// read from the code), the same function as the biased model at the start (its biases start at
// zero), the biases doing something once they are not zero, KV-cache decoding against the full
// forward, and the combinations refused.
#include <cmath>
#include <map>
#include <set>
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/checks/kv_cache_check.hpp>
#include <xgrad/train/checkpoint.hpp>

using namespace xg;
using namespace xgt;

namespace {

nn::TransformerConfig gpt(bool bias) {
  nn::TransformerConfig c;
  c.V_vocab = 13;
  c.context = 16;
  c.d_model = 16;
  c.H_q = 4;
  c.layers = 2;
  c.dtype = DType::float64;
  c.bias = bias;
  return c;
}

IndexArray tokens(Generator& g, std::size_t B, std::size_t T, std::size_t V) {
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = static_cast<std::int64_t>(g.below(V));
  return IndexArray({B, T}, ids);
}

std::set<std::string> names(const nn::Module& m) {
  std::set<std::string> s;
  for (const auto& [name, p] : m.named_parameters()) s.insert(name);
  return s;
}

}  // namespace

TEST_CASE("gpt bias: without biases the blocks lose exactly their biases and the count follows", "[gpt_bias]") {
  Generator g1(4), g2(4);
  nn::GPT with(gpt(true), g1), without(gpt(false), g2);
  // d 16, V 13, context 16, 2 layers, d_ff 64: per layer the gains of two LayerNorms (2 d),
  // W_QKV (d x 3d), W_O (d x d), fc1 (d x 4d), fc2 (4d x d); ln_f's gain.
  const std::size_t d = 16, V = 13, T = 16, f = 64;
  const std::size_t per_layer = 2 * d + d * 3 * d + d * d + d * f + f * d;
  CHECK(without.parameter_count() == V * d + T * d + 2 * per_layer + d);
  CHECK(train::parameter_count(train::ModelKind::gpt, gpt(false).resolved()) == without.parameter_count());
  CHECK(train::parameter_count(train::ModelKind::gpt, gpt(true).resolved()) == with.parameter_count());
  // The biases: per layer ln1.beta, b_QKV (3d), b_O, ln2.beta, fc1.b (d_ff), fc2.b; ln_f.beta.
  CHECK(with.parameter_count() - without.parameter_count() == 2 * (d + 3 * d + d + d + f + d) + d);
  std::set<std::string> gone;
  const std::set<std::string> kept = names(without);
  for (const std::string& n : names(with))
    if (!kept.count(n)) gone.insert(n);
  for (const std::string& n : kept) CHECK(names(with).count(n) == 1);
  const std::set<std::string> want = {"blocks.0.ln1.beta", "blocks.0.attn.b_QKV", "blocks.0.attn.b_O", "blocks.0.ln2.beta",
                                      "blocks.0.ffn.fc1.b", "blocks.0.ffn.fc2.b", "blocks.1.ln1.beta", "blocks.1.attn.b_QKV",
                                      "blocks.1.attn.b_O", "blocks.1.ln2.beta", "blocks.1.ffn.fc1.b", "blocks.1.ffn.fc2.b",
                                      "ln_f.beta"};
  CHECK(gone == want);
  CHECK_FALSE(without.blocks[0]->attn.config().bias);
}

TEST_CASE("gpt bias: at the start the model without biases is the biased one with its biases zero",
          "[gpt_bias]") {
  Generator g1(6), g2(6), data(7);
  nn::GPT with(gpt(true), g1), without(gpt(false), g2);
  // The same draws in the same order: every weight equal.
  std::map<std::string, Tensor> w;
  for (const auto& [name, p] : with.named_parameters()) w.emplace(name, p);
  for (const auto& [name, p] : without.named_parameters()) {
    INFO(name);
    CHECK(max_abs_diff(p.value(), w.at(name).value()) == 0.0);
  }
  const IndexArray t = tokens(data, 2, 9, 13);
  const double zero_bias = max_abs_diff(with.logits(t).value(), without.logits(t).value());
  INFO("max |difference| = " << sci(zero_bias));
  CHECK(zero_bias <= 1e-12);
  // Biases that are not zero change the function: they are used.
  for (auto& [name, p] : with.named_parameters())
    if (name.find(".b") != std::string::npos || name.find("beta") != std::string::npos) {
      Tensor b = p;
      b.set_value(random_uniform(b.shape(), data, b.dtype(), -0.5, 0.5));
    }
  CHECK(max_abs_diff(with.logits(t).value(), without.logits(t).value()) > 1e-3);
}

TEST_CASE("gpt bias: KV-cache decoding equals the full forward without biases", "[gpt_bias]") {
  Generator gen(8);
  auto m = std::make_shared<nn::GPT>(gpt(false), gen);
  for (auto& [name, p] : m->named_parameters()) {
    Tensor t = p;
    t.set_value(random_uniform(t.shape(), gen, t.dtype(), -0.3, 0.3));
  }
  const KVCacheReport r = check_kv_cache(
      kv_cache_decoder([m](const IndexArray& t) { return m->logits(t); }, [m] { return m->make_caches(2, 10); },
                       [m](std::vector<nn::KVCache>& caches, const IndexArray& t) { return m->logits_cached(t, caches); }),
      tokens(gen, 2, 10, 13));
  INFO(r.summary());
  CHECK(r.passed);
  CHECK(r.comparisons.size() >= 5);
}

TEST_CASE("gpt bias: false is for GPT-2 blocks of a GPT only", "[gpt_bias]") {
  Generator gen(9);
  nn::TransformerConfig l = gpt(false);
  l.arch = nn::Architecture::llama;
  l.pos = nn::PositionScheme::rope;
  CHECK_THROWS_WITH(l.resolved(), Catch::Contains("bias = false is for arch gpt"));
  CHECK_THROWS_AS(nn::GPT(l, gen), ValueError);
  CHECK_THROWS_WITH(nn::EncoderDecoder(gpt(false), gen), Catch::Contains("bias = false is for GPT models only"));
}
