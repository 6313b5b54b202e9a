// softmax and log_softmax (ops/softmax.hpp; SPEC 1.2, (5.24)-(5.25)).
#include <cmath>
#include <limits>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/detail/flash_attention.hpp>
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

TEST_CASE("softmax: scores of magnitude 1e3 give finite and correct weights (SPEC 1.2)", "[ops][softmax][spec]") {
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

TEST_CASE("softmax: score-gradient rows sum to zero and the VJP of ones is zero (5.24)", "[ops][softmax][spec]") {
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

TEST_CASE("log_softmax: values equal log(softmax) and stay finite for large scores",
          "[ops][softmax]") {
  Generator g(131);
  const Array u = rnd({3, 4}, g, -3, 3);
  const Array ls = ops::log_softmax(Tensor(u)).value();
  const Array ref = ops::log(ops::softmax(Tensor(u))).value();
  require_close(ls, ref, 1e-14);
  // Large scores: log_softmax stays finite where log(softmax) would give -inf.
  const Array big = ops::log_softmax(Tensor(Array::of({{0.0, -800.0}}))).value();
  CHECK(big.all_finite());
  CHECK(big.at({0, 1}) == Approx(-800.0));
}
