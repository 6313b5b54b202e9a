// softmax / log_softmax (SPEC 1.2, (5.24)-(5.25)), mask ops and dropout (SPEC 2).
#include <cmath>
#include <limits>

#include "helpers.hpp"
#include <xgrad/nn/flash_attention.hpp>
#include <xgrad/ops/dropout.hpp>

using namespace xg;
using namespace xgt;

namespace {
const double kInf = std::numeric_limits<double>::infinity();
}

TEST_CASE("softmax: rows sum to 1 along any axis", "[ops][softmax]") {
  Generator g(107);
  const Array u = rnd({2, 3, 4}, g, -3, 3);
  for (int axis : {0, 1, 2, -1}) {
    const Tensor a = ops::softmax(Tensor(u), axis);
    const auto s = ops::sum(a, {axis}).value().to_vector();
    for (double v : s) CHECK(v == Approx(1.0).margin(1e-15));
  }
}

TEST_CASE("softmax: scores of magnitude 1e3 give finite, correct weights (SPEC 1.2)", "[ops][softmax][spec]") {
  // Expected values in closed form, from the differences to the row maximum: row (1000, 1001,
  // 999) -> (e^-1, 1, e^-2) / (1 + e^-1 + e^-2), and so on. The last two rows spread over
  // 2000, so shifting by anything but the maximum (the mean, the first entry) overflows exp
  // even in float64 (exp(1250) = inf) and gives NaN.
  const double e1 = std::exp(-1.0), e2 = std::exp(-2.0), z3 = 1 + e1 + e2, z2 = 1 + e1;
  const Array u = Array::of({{1000.0, 1001.0, 999.0, 1000.0},
                             {-1000.0, -1001.0, -999.0, -1000.0},
                             {1000.0, 999.0, -1000.0, -1000.0},
                             {-1000.0, 1000.0, -1000.0, 999.0}});
  const Array expected = Array::of({{e1 / (z3 + e1), 1 / (z3 + e1), e2 / (z3 + e1), e1 / (z3 + e1)},
                                    {e1 / (z3 + e1), e2 / (z3 + e1), 1 / (z3 + e1), e1 / (z3 + e1)},
                                    {1 / z2, e1 / z2, 0.0, 0.0},
                                    {0.0, 1 / z2, 0.0, e1 / z2}});
  const Array a = ops::softmax(Tensor(u)).value();
  REQUIRE(a.all_finite());
  require_close(a, expected, 1e-15);
  const Array a32 = ops::softmax(Tensor(u.astype(DType::float32))).value();
  REQUIRE(a32.all_finite());
  require_close(a32.astype(DType::float64), expected, 1e-7);
}

TEST_CASE("softmax: -inf scores get weight exactly 0 and no part in the sum (5.11)", "[ops][softmax][spec]") {
  const Tensor u(Array::of({{0.0, -kInf, std::log(3.0)}}));
  const auto a = ops::softmax(u).value().to_vector();
  CHECK(a[1] == 0.0);
  CHECK(a[0] == Approx(0.25));
  CHECK(a[2] == Approx(0.75));
}

TEST_CASE("softmax: VJP (5.25) agrees with central differences along each axis", "[ops][softmax][gradcheck]") {
  Generator g(109);
  const Array u = rnd({2, 3, 4}, g, -2, 2);
  for (int axis : {0, 1, -1})
    require_gradcheck([axis](const std::vector<Tensor>& in) { return ops::softmax(in[0], axis); }, {u}, {"u"});
  require_gradcheck([](const std::vector<Tensor>& in) { return ops::softmax(in[0]); }, {rnd({1}, g)}, {"u"});
}

TEST_CASE("softmax: score-gradient rows sum to zero, and the VJP of ones is zero (5.24)", "[ops][softmax][spec]") {
  Generator g(113);
  Tensor u(rnd({3, 5}, g, -2, 2), true);
  Tensor a = ops::softmax(u);
  a.backward(rnd({3, 5}, g));
  const auto row_sums = ops::sum(Tensor(u.grad()), {1}).value().to_vector();
  for (double s : row_sums) CHECK(std::fabs(s) < 1e-15);
  u.zero_grad();
  Tensor a2 = ops::softmax(u);
  a2.backward(Array::full({3, 5}, 1.0, DType::float64));
  CHECK(max_abs_diff(u.grad(), Array::zeros({3, 5}, DType::float64)) < 1e-16);
}

TEST_CASE("softmax: the dedicated VJP equals the composed exp/sum oracle", "[ops][softmax]") {
  Generator g(127);
  const Array u0 = rnd({4, 6}, g, -2, 2), seed = rnd({4, 6}, g);
  Tensor u1(u0, true), u2(u0, true);
  ops::softmax(u1).backward(seed);
  Tensor e = ops::exp(u2 - ops::max(u2, {1}, true).detach());
  (e / ops::sum(e, {1}, true)).backward(seed);
  require_close(u1.grad(), u2.grad(), 1e-14);
}

TEST_CASE("log_softmax: values equal log(softmax) and VJP agrees with central differences",
          "[ops][softmax][gradcheck]") {
  Generator g(131);
  const Array u = rnd({3, 4}, g, -3, 3);
  const Array ls = ops::log_softmax(Tensor(u)).value();
  const Array ref = ops::log(ops::softmax(Tensor(u))).value();
  require_close(ls, ref, 1e-14);
  // Large scores: log_softmax stays finite where log(softmax) would give -inf.
  const Array big = ops::log_softmax(Tensor(Array::of({{0.0, -800.0}}))).value();
  CHECK(big.all_finite());
  CHECK(big.at({0, 1}) == Approx(-800.0));
  for (int axis : {0, -1})
    require_gradcheck([axis](const std::vector<Tensor>& in) { return ops::log_softmax(in[0], axis); }, {u}, {"u"});
}

TEST_CASE("add_mask: -inf positions are exactly -inf and get zero gradient, NaN cannot leak",
          "[ops][mask][gradcheck]") {
  Generator g(137);
  const Array bias = Array::of({{0.0, -kInf, -0.5}, {0.0, 0.0, -kInf}});
  require_gradcheck([&](const std::vector<Tensor>& in) { return ops::softmax(ops::add_mask(in[0], bias)); },
                    {rnd({2, 2, 3}, g)}, {"u"});
  Tensor u(Array::of({{NAN, 1.0, 2.0}}), true);
  const Array forbid_first = Array::of({{-kInf, 0.0, 0.0}});
  Tensor a = ops::softmax(ops::add_mask(u, forbid_first));
  REQUIRE(a.value().all_finite());
  CHECK(a.value().at({0, 0}) == 0.0);
  a.backward(Array::of({{1.0, 2.0, 3.0}}));
  CHECK(u.grad().at({0, 0}) == 0.0);
  CHECK(u.grad().all_finite());
}

TEST_CASE("masked_fill: replaces where true, gradient only where false", "[ops][mask][gradcheck]") {
  Generator g(139);
  const BoolArray m({1, 3}, {1, 0, 0});
  require_gradcheck([&](const std::vector<Tensor>& in) { return ops::masked_fill(in[0], m, -2.0); },
                    {rnd({2, 3}, g)}, {"x"});
  Tensor x(Array::of({{INFINITY, 1.0, 2.0}}), true);
  Tensor y = ops::masked_fill(x, m, 0.0);
  CHECK(y.value().to_vector() == std::vector<double>{0, 1, 2});
  ops::sum(y * y).backward();
  CHECK(x.grad().to_vector() == std::vector<double>{0, 2, 4});
}

TEST_CASE("dropout: backward reuses the forward mask; identity when p = 0 or evaluating (SPEC 2)",
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

TEST_CASE("dropout: VJP agrees with central differences for a fixed mask", "[ops][dropout][gradcheck]") {
  Generator g(151);
  const Array mask = ops::dropout_mask({3, 4}, 0.5, g, DType::float64);
  require_gradcheck([&](const std::vector<Tensor>& in) { return ops::apply_dropout_mask(in[0], mask); },
                    {rnd({3, 4}, g)}, {"x"});
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
