// Sampling one token (nn/generate.hpp, pick_token): greedy, temperature, top-k and top-p
// (nucleus) against probabilities computed here from the softmax's definition. Generation
// past the context (cropping, and a window's KV cache) against fresh forward passes, and
// stopping a sample from outside (stop_when).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include <xgrad/core/tape.hpp>

#include <xgrad/core/error.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/nn/generate.hpp>

using namespace xg;

namespace {

// How often each token is picked in `n` draws.
std::vector<double> frequencies(const std::vector<double>& logits, nn::SampleOptions so, int n) {
  Generator g(5);
  so.generator = &g;
  std::vector<double> count(logits.size(), 0.0);  // whole numbers: exact
  for (int i = 0; i < n; ++i) count[static_cast<std::size_t>(nn::pick_token(logits, so))] += 1.0;
  for (double& c : count) c /= n;
  return count;
}

// A small float64 GPT.
nn::TransformerConfig small_config(std::size_t context, std::size_t layers) {
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = context;
  c.d_model = 16;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = layers;
  c.dtype = DType::float64;
  return c;
}

// The last-position logits [B, V] of a fresh forward over the last min(len, C) tokens of each
// of the sequences prompt + tokens[..s] (positions 0.. of that window).
Array fresh_logits(nn::GPT& m, const std::vector<std::vector<std::int64_t>>& prompts, const nn::Generation& g,
                   std::size_t s) {
  NoGradGuard ng;
  const std::size_t C = m.config().context, B = prompts.size();
  std::vector<std::int64_t> flat;
  std::size_t T = 0;
  for (std::size_t b = 0; b < B; ++b) {
    std::vector<std::int64_t> seq = prompts[b];
    seq.insert(seq.end(), g.tokens[b].begin(), g.tokens[b].begin() + static_cast<std::ptrdiff_t>(s));
    T = std::min(seq.size(), C);
    flat.insert(flat.end(), seq.end() - static_cast<std::ptrdiff_t>(T), seq.end());
  }
  const Array all = m.logits(IndexArray({B, T}, flat)).value();
  const std::size_t V = all.shape()[2];
  std::vector<double> last;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t v = 0; v < V; ++v) last.push_back(all.flat((b * T + T - 1) * V + v));
  return Array::from_vector({B, V}, last, DType::float64);
}

double largest_gap(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a.flat(i) - b.flat(i)));
  return d;
}

}  // namespace

TEST_CASE("generate: past the context every step is a fresh forward over the last context tokens (cropping)",
          "[generate]") {
  const std::size_t C = 6, P = 4, max_new = 13;
  Generator init(3);
  nn::GPT model(small_config(C, 2), init);
  const std::vector<std::vector<std::int64_t>> prompts = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  for (bool cache : {true, false}) {
    for (double temperature : {0.0, 1.0}) {
      Generator gen(9);
      nn::SampleOptions so;
      so.use_kv_cache = cache;
      so.temperature = temperature;
      so.generator = &gen;
      const nn::Generation g = nn::generate(model, prompts, max_new, so);
      REQUIRE(g.tokens[0].size() == max_new);
      REQUIRE(g.tokens[1].size() == max_new);
      REQUIRE(g.logits.size() == max_new);
      std::size_t past = 0;
      for (std::size_t s = 0; s < max_new; ++s) {
        past += P + s > C;  // the model saw a cropped window at this step
        const double d = largest_gap(g.logits[s], fresh_logits(model, prompts, g, s));
        INFO("kv cache " << cache << ", temperature " << temperature << ", step " << s << ": max |diff| "
                         << std::scientific << d);
        CHECK(d <= 1e-12);
      }
      CHECK(past == max_new - (C - P) - 1);  // every step from the one whose input is C + 1 tokens long
    }
  }
  // The crop is needed: a forward over the whole sequence is refused past the context.
  CHECK_THROWS_WITH(model.logits(IndexArray({1, C + 1}, std::vector<std::int64_t>(C + 1, 1))),
                    Catch::Contains("exceed the context length"));
}

TEST_CASE("generate: a sliding window over RoPE decodes past the context with its windowed KV cache",
          "[generate]") {
  // Window 3, 2 layers: the last position depends on its last 2 * (3 - 1) + 1 = 5 tokens, fewer than
  // the context of 8, so the windowed cache's logits past the context equal a fresh forward over the
  // last 8 tokens (RoPE is relative), and the cropping path (no cache) gives the same.
  const std::size_t C = 8, max_new = 20;
  nn::TransformerConfig c = small_config(C, 2);
  c.window = 3;
  c.pos = nn::PositionScheme::rope;
  Generator init(4);
  nn::GPT model(c, init);
  const std::vector<std::vector<std::int64_t>> prompts = {{3, 1, 4}};
  Generator gen(2);
  nn::SampleOptions so;
  so.temperature = 1.0;
  so.generator = &gen;
  const nn::Generation g = nn::generate(model, prompts, max_new, so);
  REQUIRE(g.tokens[0].size() == max_new);
  for (std::size_t s = 0; s < max_new; ++s) {
    const double d = largest_gap(g.logits[s], fresh_logits(model, prompts, g, s));
    INFO("step " << s << ": max |diff| " << std::scientific << d);
    CHECK(d <= 1e-12);
  }
  // The cache went on past the context: positions up to 3 + 19 = 22 were decoded with it.
  auto caches = model.make_caches(1, 30);
  NoGradGuard ng;
  (void)model.logits_cached(IndexArray({1, C}, std::vector<std::int64_t>(C, 1)), caches);
  CHECK_NOTHROW(model.logits_cached(IndexArray({1, 1}, {2}), caches));
  CHECK(caches[0].next_position() == C + 1);
  // Learned positions cannot go past the context, window or not.
  c.pos = nn::PositionScheme::learned;
  nn::GPT learned(c, init);
  auto lc = learned.make_caches(1, 30);
  (void)learned.logits_cached(IndexArray({1, C}, std::vector<std::int64_t>(C, 1)), lc);
  CHECK_THROWS_WITH(learned.logits_cached(IndexArray({1, 1}, {2}), lc), Catch::Contains("exceed the context length"));
}

TEST_CASE("generate: stop_when ends one sample and lets the others run", "[generate]") {
  Generator init(5);
  nn::GPT model(small_config(16, 1), init);
  nn::SampleOptions so;
  std::vector<std::size_t> calls(2, 0);
  so.stop_when = [&](std::size_t b, const std::vector<std::int64_t>& generated) {
    ++calls[b];
    CHECK(generated.size() == calls[b]);  // called once per new token, with the tokens so far
    return b == 0 && generated.size() == 3;
  };
  const nn::Generation g = nn::generate(model, {{1, 2}, {3, 4}}, 7, so);
  CHECK(g.tokens[0].size() == 3);
  CHECK(g.tokens[1].size() == 7);
  CHECK(calls[0] == 3);
  CHECK(calls[1] == 7);
  // Every sample stopped: generation ends there.
  so.stop_when = [](std::size_t, const std::vector<std::int64_t>& generated) { return generated.size() == 2; };
  const nn::Generation h = nn::generate(model, {{1, 2}, {3, 4}}, 7, so);
  CHECK(h.logits.size() == 2);
}

TEST_CASE("generate: keep_logits false keeps no logits and samples the same tokens", "[generate]") {
  Generator init(6);
  nn::GPT model(small_config(16, 1), init);
  Generator g1(7), g2(7);
  nn::SampleOptions so;
  so.temperature = 1.0;
  so.generator = &g1;
  const nn::Generation kept = nn::generate(model, {{1, 2}, {3, 4}}, 9, so);
  so.generator = &g2;
  so.keep_logits = false;
  const nn::Generation bare = nn::generate(model, {{1, 2}, {3, 4}}, 9, so);
  CHECK(kept.logits.size() == 9);
  CHECK(bare.logits.empty());
  CHECK(bare.tokens == kept.tokens);
  CHECK(bare.tokens[0].size() == 9);
}

TEST_CASE("generate: greedy float32 picks are pick_token's on each step's logits", "[generate]") {
  // nn/generate.cpp picks greedy float32 tokens without copying the row into doubles: the same
  // token as pick_token on that row, with and without a vocabulary limit, ties to the first.
  Generator init(8);
  nn::TransformerConfig c = small_config(16, 2);
  c.dtype = DType::float32;
  nn::GPT model(c, init);
  for (std::size_t limit : {std::size_t{0}, std::size_t{6}}) {
    nn::SampleOptions so;
    so.vocab_limit = limit;
    const nn::Generation g = nn::generate(model, {{1, 2}, {3, 4}}, 6, so);
    REQUIRE(g.logits.size() == 6);
    for (std::size_t s = 0; s < 6; ++s)
      for (std::size_t b = 0; b < 2; ++b) {
        const float* row = g.logits[s].data<float>() + b * c.V_vocab;
        std::vector<double> r(row, row + (limit ? limit : c.V_vocab));
        CHECK(g.tokens[b][s] == nn::pick_token(r, nn::SampleOptions{}));
      }
  }
  // A non-finite logit: pick_token's error.
  NoGradGuard ng;
  model.ln_f.gamma.set_value(Array::full(model.ln_f.gamma.shape(), std::numeric_limits<double>::quiet_NaN(),
                                         DType::float32));
  CHECK_THROWS_WITH(nn::generate(model, {{1}}, 2), Catch::Contains("the model's output is not finite"));
}

TEST_CASE("generate: a prompt longer than the context is refused", "[generate]") {
  Generator init(6);
  nn::GPT model(small_config(4, 1), init);
  CHECK_THROWS_WITH(nn::generate(model, {{1, 2, 3, 4, 5}}, 2),
                    Catch::Contains("the prompt has 5 tokens, more than the model's context length 4"));
}

TEST_CASE("generate: top-p keeps the smallest set of likely tokens whose mass reaches p", "[generate]") {
  // Probabilities at temperature 1: softmax(log 0.5, log 0.3, log 0.15, log 0.05).
  const std::vector<double> logits = {std::log(0.5), std::log(0.3), std::log(0.15), std::log(0.05)};
  nn::SampleOptions so;
  so.temperature = 1.0;
  const int n = 40000;
  SECTION("p 0.7: tokens 0 and 1 (0.5 < 0.7 <= 0.8), renormalised to 5/8 and 3/8") {
    so.top_p = 0.7;
    const std::vector<double> f = frequencies(logits, so, n);
    CHECK(f[2] == 0.0);
    CHECK(f[3] == 0.0);
    CHECK(std::abs(f[0] - 0.625) < 0.015);  // binomial sd 0.0024
    CHECK(std::abs(f[1] - 0.375) < 0.015);
  }
  SECTION("p 0.5: token 0 alone reaches it") {
    so.top_p = 0.5;
    const std::vector<double> f = frequencies(logits, so, 2000);
    CHECK(f[0] == 1.0);
  }
  SECTION("p 1: every token, as without the filter (the same draws)") {
    so.top_p = 1.0;
    const std::vector<double> f = frequencies(logits, so, n);
    nn::SampleOptions plain;
    plain.temperature = 1.0;
    CHECK(f == frequencies(logits, plain, n));
    CHECK(std::abs(f[3] - 0.05) < 0.01);
  }
  SECTION("with top-k 1, top-p has one token left") {
    so.top_k = 1;
    so.top_p = 0.99;
    CHECK(frequencies(logits, so, 500)[0] == 1.0);
  }
}

TEST_CASE("generate: a top-p of 0 or below or above 1 or NaN is refused", "[generate]") {
  Generator g(1);
  nn::SampleOptions so;
  so.temperature = 1.0;
  so.generator = &g;
  for (double p : {0.0, -0.5, 1.5, std::numeric_limits<double>::quiet_NaN()}) {
    so.top_p = p;
    CHECK_THROWS_WITH(nn::pick_token({0.0, 1.0}, so), Catch::Contains("top_p must be in (0, 1]"));
  }
}
