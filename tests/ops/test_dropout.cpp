// dropout (ops/dropout.hpp): the mask reused by the VJP, and the counter-based hash the attention paths share.
#include <cmath>
#include <limits>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/ops/dropout.hpp>

using namespace xg;
using namespace xgt;

TEST_CASE("dropout: backward reuses the forward mask / identity when p = 0 or evaluating (SPEC 2)",
          "[ops][dropout]") {
  Generator g(149);
  Tensor x(rnd({50, 40}, g, 0.5, 1.5), true);
  Tensor y = ops::dropout(x, 0.3, g, true);
  const Array seed = rnd({50, 40}, g);
  y.backward(seed);
  // x_bar = seed * m / q, and y = x * m / q: so x_bar * x == y * seed elementwise.
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double m_over_q = y.value().flat(i) / x.value().flat(i);
    CHECK(x.grad().flat(i) == Approx(seed.flat(i) * m_over_q).margin(1e-15));
    if (m_over_q == 0.0) ++dropped;
    else CHECK(m_over_q == Approx(1.0 / 0.7));
  }
  // 2000 Bernoulli(0.3) drops: mean 600, sd ~20.5; 5 sd bound.
  CHECK(std::fabs(static_cast<double>(dropped) - 600.0) < 5 * std::sqrt(2000 * 0.3 * 0.7));

  Generator before = g;
  CHECK(ops::dropout(x, 0.0, g, true).impl() == x.impl());
  CHECK(ops::dropout(x, 0.5, g, false).impl() == x.impl());
  CHECK(g.next_u64() == before.next_u64());  // nothing was drawn
  // p = 1 is refused (it would drop everything; docs/reliability.md), as in SDPA and the models.
  CHECK_THROWS_WITH(ops::dropout(x, 1.0, g, true), Catch::Contains("[dropout] p must be in [0, 1)"));
}

TEST_CASE("dropout: one counter-based hash for the op and the attention weights", "[ops][dropout]") {
  // SplitMix64's finaliser: its first outputs from state 0 are the published sequence
  // (Vigna's splitmix64.c: e220a8397b1dcdaf, 6e789e6aa1b965f4, 06c45d188009454f).
  CHECK(ops::dropout_mix64(0) == 0xE220A8397B1DCDAFull);
  CHECK(ops::dropout_mix64(0x9E3779B97F4A7C15ull) == 0x6E789E6AA1B965F4ull);
  CHECK(ops::dropout_mix64(2 * 0x9E3779B97F4A7C15ull) == 0x06C45D188009454Full);
  // p = 0.5: kept iff the top 53 bits of the hash are below 2^52, i.e. its top bit is 0.
  CHECK(ops::dropout_keep_threshold(0.5) == (std::uint64_t(1) << 52));
  for (std::uint64_t flat = 0; flat < 64; ++flat) {
    const std::uint64_t h = ops::dropout_mix64(7 ^ ops::dropout_mix64(flat));
    CHECK(ops::dropout_keep(7, flat, 0.5) == ((h >> 63) == 0));
  }
  // The op's mask and the attention weights' mask are the same draw, element by element.
  std::size_t kept = 0;
  for (std::uint64_t flat = 0; flat < 4096; ++flat)
    for (double p : {0.1, 0.5, 0.9}) {
      const bool a = ops::dropout_keep(12345, flat, p);
      CHECK(a == nn::attention_dropout_keep(12345, flat, p));
      kept += a;
    }
  // About (0.9 + 0.5 + 0.1) * 4096 kept: the hash is not constant.
  CHECK(kept > 5800);
  CHECK(kept < 6500);
}
