// Sampling one token (nn/generate.hpp, pick_token): greedy, temperature, top-k and top-p
// (nucleus) against probabilities computed here from the softmax's definition.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

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

}  // namespace

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
