// The spec's worked examples and exercise answers for attention (SPEC 5, 8, 10, 13, and
// exercises 5.6 from SPEC 3.6 and 5.9 from SPEC 2), to the printed precision.
//
// Tolerances: a value printed with n decimals is checked to half a unit of its last digit
// (5e-7 for 6 decimals, 5e-8 for 7), i.e. "rounds to the printed number". Values the spec
// gives exactly (fractions, closed forms) are checked to float64 rounding.
// Indices: the spec counts queries, keys and coordinates from 1 (o_{2,1}, K_{1,2}); C++ from
// 0, so o_{2,1} is O[1][0] and K_{1,2} is K[0][1]. Absolute positions count from 0.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

constexpr double kPrinted6 = 5e-7;  // half a unit of the 6th decimal
constexpr double kPrinted7 = 5e-8;  // half a unit of the 7th decimal

// [T, d] -> [1, 1, T, d]: one sample, one head.
Array bh(const Array& m) { return m.reshaped({1, 1, m.shape()[0], m.shape()[1]}); }
// Element (i, j) of a [1, 1, T, d] array.
double at(const Array& a, std::size_t i, std::size_t j) { return a.at({0, 0, i, j}); }

// The causal example's inputs (5.13)-(5.14): X, W_Q = W_K = I, W_V = diag(1, 2).
Array example_X() { return Array::of({{1, 0}, {0, 1}, {1, 1}}); }
Array example_W_V() { return Array::of({{1, 0}, {0, 2}}); }
// V = X W_V, computed (not transcribed).
Array example_V(const Array& X) { return ops::matmul(Tensor(X), Tensor(example_W_V())).value(); }

// Checks every element of `actual` ([1, 1, T, d]) against the printed [T, d] matrix.
void check_printed(const Array& actual, const Array& printed, double tol) {
  REQUIRE(actual.size() == printed.size());
  for (std::size_t k = 0; k < printed.size(); ++k) {
    INFO("flat index " << k << ": actual " << actual.flat(k) << ", printed " << printed.flat(k));
    CHECK(std::fabs(actual.flat(k) - printed.flat(k)) <= tol);
  }
}

}  // namespace

TEST_CASE("attention: causal single head worked example (5.13)-(5.17)", "[nn][attention][spec]") {
  const Array X = example_X();
  const Array V = example_V(X);
  const Array V_expected = Array::of({{1, 0}, {0, 2}, {1, 2}});  // (5.14)
  XGT_CHECK_SAME(V, V_expected);  // small integers: exact in any order

  nn::SdpaOptions opts;
  opts.return_weights = true;
  // W_Q = W_K = I, so Q = K = X; d_k = 2, scale 1/sqrt(2) by default.
  const nn::SdpaResult r =
      nn::scaled_dot_product_attention(Tensor(bh(X)), Tensor(bh(X)), Tensor(bh(V)), nn::Visibility::causal(3, 3), opts);
  const Array A = r.weights.value(), O = r.output.value();
  REQUIRE(A.shape() == Shape{1, 1, 3, 3});
  REQUIRE(O.shape() == Shape{1, 1, 3, 2});

  // (5.16), printed to 6 decimals.
  const Array A_printed = Array::of({{1, 0, 0}, {0.330238, 0.669762, 0}, {0.248255, 0.248255, 0.503490}});
  check_printed(A, A_printed, kPrinted6);
  // The closed forms beside them: row 2 = (1, e^c)/(1 + e^c), row 3 = (1, 1, e^c)/(2 + e^c).
  const double c = 1.0 / std::sqrt(2.0), ec = std::exp(c);
  CHECK(c == Approx(0.707107).epsilon(0).margin(kPrinted6));
  CHECK(at(A, 1, 0) == Approx(1 / (1 + ec)).epsilon(0).margin(1e-15));
  CHECK(at(A, 1, 1) == Approx(ec / (1 + ec)).epsilon(0).margin(1e-15));
  CHECK(at(A, 2, 0) == Approx(1 / (2 + ec)).epsilon(0).margin(1e-15));
  CHECK(at(A, 2, 1) == Approx(1 / (2 + ec)).epsilon(0).margin(1e-15));
  CHECK(at(A, 2, 2) == Approx(ec / (2 + ec)).epsilon(0).margin(1e-15));
  // Forbidden (future) positions: weight exactly 0; rows sum to 1.
  CHECK(at(A, 0, 1) == 0.0);
  CHECK(at(A, 0, 2) == 0.0);
  CHECK(at(A, 1, 2) == 0.0);
  for (std::size_t i = 0; i < 3; ++i) CHECK(at(A, i, 0) + at(A, i, 1) + at(A, i, 2) == Approx(1.0).epsilon(0).margin(1e-15));
  // Q = K, yet A is not symmetric (SPEC 1.1).
  CHECK(at(A, 1, 0) != at(A, 0, 1));

  // (5.17), printed to 6 decimals.
  const Array O_printed = Array::of({{1, 0}, {0.330238, 1.339523}, {0.751745, 1.503490}});
  check_printed(O, O_printed, kPrinted6);
}

TEST_CASE("attention: summing X instead of V halves the second coordinate - A alone is not enough (5.17)",
          "[nn][attention][spec]") {
  const Array X = example_X();
  const Array V = example_V(X);
  nn::SdpaOptions opts;
  opts.return_weights = true;
  const auto vis = nn::Visibility::causal(3, 3);
  const nn::SdpaResult right = nn::scaled_dot_product_attention(Tensor(bh(X)), Tensor(bh(X)), Tensor(bh(V)), vis, opts);
  const nn::SdpaResult wrong = nn::scaled_dot_product_attention(Tensor(bh(X)), Tensor(bh(X)), Tensor(bh(X)), vis, opts);

  // Same weights (they depend on Q and K only) ...
  XGT_CHECK_SAME(right.weights.value(), wrong.weights.value());  // the same calls on the same Q, K
  // ... but A X keeps the first coordinate and halves the second (W_V = diag(1, 2)).
  const Array O = right.output.value(), OX = wrong.output.value();
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(at(OX, i, 0) == Approx(at(O, i, 0)).epsilon(0).margin(1e-15));
    CHECK(at(OX, i, 1) == Approx(at(O, i, 1) / 2).epsilon(0).margin(1e-15));
  }
  // So the outputs differ wherever the second coordinate is non-zero (rows 2 and 3).
  CHECK(std::fabs(at(OX, 1, 1) - at(O, 1, 1)) > 0.5);
  CHECK(std::fabs(at(OX, 2, 1) - at(O, 2, 1)) > 0.5);
}

TEST_CASE("attention: local gradient of L = o_{21} in the worked example (5.32)-(5.33) and exercise 5.5",
          "[nn][attention][spec]") {
  const Array X = example_X();
  const Array Vv = example_V(X);
  const double c = 1.0 / std::sqrt(2.0);
  const double alpha = 1.0 / (1.0 + std::exp(c));
  CHECK(alpha == Approx(0.330238).epsilon(0).margin(kPrinted6));

  // G = dL/dO: a single 1 at o_{2,1} (0-based O[1][0]).
  Array G = Array::zeros({1, 1, 3, 2}, DType::float64);
  G.set_flat(1 * 2 + 0, 1.0);

  SECTION("D (5.27) and R (5.26) from the tape of the composed forward U -> A -> O") {
    // The forward of (5.3) built from ops, so the score tensor U and the weights A are
    // tape nodes that xg::grad can differentiate with respect to.
    const Tensor Q(bh(X), true), K(bh(X), true), V(bh(Vv), true);
    const Tensor U = ops::matmul(Q, K, {false, true}) * c;
    const Tensor A = ops::softmax(ops::add_mask(U, nn::Visibility::causal(3, 3).bias(DType::float64)));
    const Tensor O = ops::matmul(A, V);
    const std::vector<Array> g = xg::grad(O, {U, A}, G);
    const Array& D = g[0];
    const Array& R = g[1];  // dL/dA = G V^T

    // R_2 = (1, 0) on the visible keys; the full row is (1, 0, 1) (key 3 is masked).
    CHECK(at(R, 1, 0) == 1.0);
    CHECK(at(R, 1, 1) == 0.0);
    CHECK(at(R, 1, 2) == 1.0);

    // D_{2,1} = alpha (1 - alpha) ~ 0.221181, D_{2,2} = -D_{2,1}, D_{2,3} = 0 (forbidden).
    CHECK(at(D, 1, 0) == Approx(0.221181).epsilon(0).margin(kPrinted6));
    CHECK(at(D, 1, 0) == Approx(alpha * (1 - alpha)).epsilon(0).margin(1e-15));
    CHECK(at(D, 1, 1) == Approx(-alpha * (1 - alpha)).epsilon(0).margin(1e-15));
    CHECK(at(D, 1, 2) == 0.0);
    // The row sums to zero (5.25), and L does not depend on queries 1 and 3.
    CHECK(at(D, 1, 0) + at(D, 1, 1) + at(D, 1, 2) == Approx(0.0).margin(1e-15));
    for (std::size_t j = 0; j < 3; ++j) {
      CHECK(at(D, 0, j) == 0.0);
      CHECK(at(D, 2, j) == 0.0);
    }
  }

  SECTION("Q_bar, K_bar, V_bar from the tape of nn::attention (5.26), (5.28), (5.33)") {
    const Tensor Q(bh(X), true), K(bh(X), true), V(bh(Vv), true);
    const Tensor O = nn::attention(Q, K, V, nn::Visibility::causal(3, 3));
    const std::vector<Array> g = xg::grad(O, {Q, K, V}, G);
    const Array &Q_bar = g[0], &K_bar = g[1], &V_bar = g[2];

    // (5.33): Q_bar_2 = alpha (1 - alpha) / sqrt(2) (1, -1) ~ (0.156399, -0.156399); other rows 0.
    const Array Q_bar_printed = Array::of({{0, 0}, {0.156399, -0.156399}, {0, 0}});
    check_printed(Q_bar, Q_bar_printed, kPrinted6);
    // Exercise 5.5: K_bar_1 = (0, alpha (1 - alpha) / sqrt(2)), K_bar_2 = -K_bar_1, K_bar_3 = 0.
    const double kb = alpha * (1 - alpha) / std::sqrt(2.0);
    const Array K_bar_expected = Array::of({{0, kb}, {0, -kb}, {0, 0}});
    check_printed(K_bar, K_bar_expected, 1e-15);
    CHECK(kb == Approx(0.156399).epsilon(0).margin(kPrinted6));
    // Value gradient, first coordinates: alpha (key 1) and 1 - alpha (key 2); nothing to key 3.
    const Array V_bar_expected = Array::of({{alpha, 0}, {1 - alpha, 0}, {0, 0}});
    check_printed(V_bar, V_bar_expected, 1e-15);
    CHECK(at(V_bar, 0, 0) == Approx(0.330238).epsilon(0).margin(kPrinted6));

    // Sign check (SPEC 10): raising q_{2,1} raises key 1's score, whose value has the larger
    // first coordinate, so dL/dq_{2,1} > 0; a central difference agrees in sign and size.
    CHECK(at(Q_bar, 1, 0) > 0.0);
    const double eps = 1e-5;
    auto L_at = [&](double dq) {
      NoGradGuard ng;
      Array Qp = bh(X).clone();
      Qp.set_flat(1 * 2 + 0, Qp.flat(1 * 2 + 0) + dq);
      return at(nn::attention(Tensor(Qp), Tensor(bh(X)), Tensor(bh(Vv)), nn::Visibility::causal(3, 3)).value(), 1, 0);
    };
    const double fd = (L_at(eps) - L_at(-eps)) / (2 * eps);
    CHECK(fd > 0.0);
    CHECK(fd == Approx(at(Q_bar, 1, 0)).epsilon(0).margin(1e-9));
  }
}

TEST_CASE("attention: central difference in K_{12} alone tends to 0.1563986 (exercise 5.5)", "[nn][attention][spec]") {
  const Array X = example_X();
  const Array Vv = example_V(X);
  // L(K) = o_{2,1} with Q, V and the other entries of K fixed; perturb K_{1,2} = K[0][1].
  auto L_at = [&](double dk) {
    NoGradGuard ng;
    Array K = bh(X).clone();
    K.set_flat(0 * 2 + 1, K.flat(0 * 2 + 1) + dk);
    return at(nn::attention(Tensor(bh(X)), Tensor(K), Tensor(bh(Vv)), nn::Visibility::causal(3, 3)).value(), 1, 0);
  };
  // eps = 1e-5: truncation error ~ |L'''| eps^2 / 6 < 1e-10, rounding ~ 1e-16 / eps = 1e-11.
  const double eps = 1e-5;
  const double fd = (L_at(eps) - L_at(-eps)) / (2 * eps);
  CHECK(fd == Approx(0.1563986).epsilon(0).margin(kPrinted7));

  // It is the tape's partial derivative K_bar_{1,2} (K an independent input) ...
  Array G = Array::zeros({1, 1, 3, 2}, DType::float64);
  G.set_flat(1 * 2 + 0, 1.0);
  const Tensor Q(bh(X), true), K(bh(X), true), V(bh(Vv), true);
  const Array K_bar = xg::grad(nn::attention(Q, K, V, nn::Visibility::causal(3, 3)), {K}, G)[0];
  CHECK(at(K_bar, 0, 1) == Approx(fd).epsilon(0).margin(1e-9));

  // ... and not the total derivative through a shared source X (Q = K = X, V = X W_V):
  // there x_{2,1} reaches L through q_2, k_2 and v_2, and the three paths add (5.31).
  const Tensor Xs(X, true);
  const Tensor X4 = ops::reshape(Xs, {1, 1, 3, 2});
  const Tensor Vs = ops::reshape(ops::matmul(Xs, Tensor(example_W_V())), {1, 1, 3, 2});
  const Array X_bar = xg::grad(nn::attention(X4, X4, Vs, nn::Visibility::causal(3, 3)), {Xs}, G)[0];
  const Array Q_bar = xg::grad(nn::attention(Q, K, V, nn::Visibility::causal(3, 3)), {Q}, G)[0];
  CHECK(std::fabs(X_bar.at({1, 0}) - at(Q_bar, 1, 0)) > 0.1);
  auto L_x = [&](double dx) {
    NoGradGuard ng;
    Array Xp = X.clone();
    Xp.set_flat(1 * 2 + 0, Xp.flat(1 * 2 + 0) + dx);
    return at(nn::attention(Tensor(bh(Xp)), Tensor(bh(Xp)), Tensor(bh(example_V(Xp))), nn::Visibility::causal(3, 3)).value(),
              1, 0);
  };
  CHECK(X_bar.at({1, 0}) == Approx((L_x(eps) - L_x(-eps)) / (2 * eps)).epsilon(0).margin(1e-9));
}

TEST_CASE("attention: no-mask variant of the worked example with weights (r s r) and v_3 = 0 (exercise 5.3)",
          "[nn][attention][spec]") {
  const Array X = example_X();
  const Array Vv = example_V(X);
  nn::SdpaOptions opts;
  opts.return_weights = true;
  const nn::SdpaResult r =
      nn::scaled_dot_product_attention(Tensor(bh(X)), Tensor(bh(X)), Tensor(bh(Vv)), nn::Visibility::all(), opts);
  const Array A = r.weights.value(), O = r.output.value();

  // Row 1 scores (c, 0, c): weights (r, s, r), r = e^c/(2e^c+1), s = 1/(2e^c+1).
  CHECK(at(A, 0, 0) == Approx(0.401112).epsilon(0).margin(kPrinted6));
  CHECK(at(A, 0, 1) == Approx(0.197776).epsilon(0).margin(kPrinted6));
  CHECK(at(A, 0, 2) == Approx(0.401112).epsilon(0).margin(kPrinted6));
  const double ec = std::exp(1.0 / std::sqrt(2.0));
  const double rr = ec / (2 * ec + 1), ss = 1 / (2 * ec + 1);
  CHECK(at(A, 0, 0) == Approx(rr).epsilon(0).margin(1e-15));
  CHECK(at(A, 0, 1) == Approx(ss).epsilon(0).margin(1e-15));
  // Row-1 output (2r, 2s + 2r) ~ (.802224, 1.197776).
  CHECK(at(O, 0, 0) == Approx(0.802224).epsilon(0).margin(kPrinted6));
  CHECK(at(O, 0, 1) == Approx(1.197776).epsilon(0).margin(kPrinted6));

  // v_3 = 0 with Q and K fixed: weights unchanged, row-1 output (r, 2s) ~ (.401112, .395552),
  // and the output moves by exactly r v_3.
  Array V0 = Vv.clone();
  V0.set_flat(2 * 2 + 0, 0.0);
  V0.set_flat(2 * 2 + 1, 0.0);
  const nn::SdpaResult r0 =
      nn::scaled_dot_product_attention(Tensor(bh(X)), Tensor(bh(X)), Tensor(bh(V0)), nn::Visibility::all(), opts);
  const Array O0 = r0.output.value();
  XGT_CHECK_SAME(r0.weights.value(), A);  // the same calls on the same Q, K
  CHECK(at(O0, 0, 0) == Approx(0.401112).epsilon(0).margin(kPrinted6));
  CHECK(at(O0, 0, 1) == Approx(0.395552).epsilon(0).margin(kPrinted6));
  for (std::size_t k = 0; k < 2; ++k)
    CHECK(at(O, 0, k) - at(O0, 0, k) == Approx(at(A, 0, 2) * Vv.at({2, k})).epsilon(0).margin(1e-15));

  // Without the mask, o_1 already differs from the causal o_1 = (1, 0).
  CHECK(std::fabs(at(O, 0, 0) - 1.0) > 0.1);
}

TEST_CASE("cross-attention: worked example (5.23) with T = 3 queries over S = 2 source positions",
          "[nn][attention][spec]") {
  // Keys e_1, e_2 and queries chosen so that the SCALED scores are (0,0), (log 3, 0), (0, log 3):
  // the default scale is 1/sqrt(d_k) = 1/sqrt(2), so the raw query rows carry sqrt(2).
  const double l3 = std::log(3.0) * std::sqrt(2.0);
  const Array Q = Array::of({{0, 0}, {l3, 0}, {0, l3}});
  const Array K = Array::of({{1, 0}, {0, 1}});
  const Array V = Array::of({{2, 0}, {0, 4}});  // v_1 = (2, 0), v_2 = (0, 4)
  nn::SdpaOptions opts;
  opts.return_weights = true;

  const nn::SdpaResult r = nn::scaled_dot_product_attention(Tensor(bh(Q)), Tensor(bh(K)), Tensor(bh(V)),
                                                            nn::Visibility::all(), opts);
  REQUIRE(r.weights.shape() == Shape{1, 1, 3, 2});  // T x S
  REQUIRE(r.output.shape() == Shape{1, 1, 3, 2});   // keeps T rows
  const Array A_expected = Array::of({{0.5, 0.5}, {0.75, 0.25}, {0.25, 0.75}});
  const Array O_expected = Array::of({{1, 2}, {1.5, 1}, {0.5, 3}});
  check_printed(r.weights.value(), A_expected, 1e-15);
  check_printed(r.output.value(), O_expected, 1e-14);

  // Source position 2 masked as padding: every row reads v_1 exactly, O = [[2,0],[2,0],[2,0]].
  const Array O_masked_expected = Array::of({{2, 0}, {2, 0}, {2, 0}});
  const Tensor O_len = nn::attention(Tensor(bh(Q)), Tensor(bh(K)), Tensor(bh(V)), nn::Visibility::key_lengths({1}, 2));
  XGT_CHECK_SAME(O_len.value(), bh(O_masked_expected));  // weights exactly 1 and 0: exact
  const Tensor O_valid = nn::attention(Tensor(bh(Q)), Tensor(bh(K)), Tensor(bh(V)),
                                       nn::Visibility::valid_keys(BoolArray({1, 2}, {1, 0})));
  XGT_CHECK_SAME(O_valid.value(), bh(O_masked_expected));  // weights exactly 1 and 0: exact
}

TEST_CASE("attention: shapes of exercise 5.1 - Q 5x8 K 7x8 V 7x3 -> weights 5x7 and output 5x3",
          "[nn][attention][spec]") {
  Generator g(5001);
  const Tensor Q(rnd({1, 1, 5, 8}, g)), K(rnd({1, 1, 7, 8}, g)), V(rnd({1, 1, 7, 3}, g));
  nn::SdpaOptions opts;
  opts.return_weights = true;
  const nn::SdpaResult r = nn::scaled_dot_product_attention(Q, K, V, nn::Visibility::all(), opts);
  CHECK(r.weights.shape() == Shape{1, 1, 5, 7});
  CHECK(r.output.shape() == Shape{1, 1, 5, 3});
  // Normalised along the key axis: every query's weights sum to 1.
  const auto row_sums = ops::sum(r.weights, {3}).value().to_vector();
  for (double s : row_sums) CHECK(s == Approx(1.0).epsilon(0).margin(1e-15));
}

TEST_CASE("attention: scaled score variance is 16 when q and k coordinates have variance 4 (exercise 5.2 and (5.5)-(5.7))",
          "[nn][attention][spec]") {
  // N independent (q, k) pairs, coordinates N(0, 4), d_k = 16. Each pair is one batch sample
  // with two keys: key 0 is the zero vector (score exactly 0) and key 1 is k, so the scaled
  // score u = q.k/sqrt(d_k) the library computed is recovered from its weights as
  // u = log(a_1) - log(a_0).
  const std::size_t N = 20000, d = 16;
  Generator g(5002);
  const Array q = random_normal({N, 1, 1, d}, g, DType::float64, 0.0, 2.0);
  const Array k = random_normal({N, 1, 1, d}, g, DType::float64, 0.0, 2.0);
  Array K = Array::zeros({N, 1, 2, d}, DType::float64);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t t = 0; t < d; ++t) K.set_flat((n * 2 + 1) * d + t, k.flat(n * d + t));
  nn::SdpaOptions opts;
  opts.return_weights = true;
  const Array A = nn::scaled_dot_product_attention(Tensor(q), Tensor(K), Tensor(Array::zeros({N, 1, 2, 1}, DType::float64)),
                                                   nn::Visibility::all(), opts)
                      .weights.value();
  double m2 = 0.0, max_abs = 0.0;
  for (std::size_t n = 0; n < N; ++n) {
    const double u = std::log(A.flat(2 * n + 1)) - std::log(A.flat(2 * n));
    m2 += u * u;
    max_abs = std::max(max_abs, std::fabs(u));
  }
  // E[u] = 0, so mean(u^2) estimates Var(u) = s_q^2 s_k^2 = 16. u is a sum of d iid products
  // of independent N(0, 4)s; each product has E[p^4] = 3*16 * 3*16 = 9 * 16^2, i.e. excess
  // kurtosis 6, so u has excess kurtosis 6/d and Var(u^2) = (2 + 6/d) 16^2. The standard
  // error of mean(u^2) is 16 sqrt((2 + 6/d) / N) ~ 0.17; we allow 5 of them (~0.87), which
  // separates 16 from an unscaled 16 d = 256 or a 1/d scale's 1 by a wide margin.
  const double var_scaled = m2 / static_cast<double>(N);
  const double se = 16.0 * std::sqrt((2.0 + 6.0 / static_cast<double>(d)) / static_cast<double>(N));
  INFO("estimated Var(u) = " << var_scaled << ", standard error " << se);
  CHECK(std::fabs(var_scaled - 16.0) < 5 * se);
  // Unscaled q.k = sqrt(d_k) u: variance 16 d_k (same samples, same relative error).
  CHECK(std::fabs(var_scaled * d - 16.0 * d) < 5 * se * d);
  // Scaling normalises the variance; it does not bound scores to [-1, 1].
  CHECK(max_abs > 1.0);
}

TEST_CASE("attention: one query at absolute position 8 sees keys 0..8 bottom-right aligned (exercise 5.6 and (5.12))",
          "[nn][attention][visibility][spec]") {
  std::vector<std::int64_t> keys(9);
  std::iota(keys.begin(), keys.end(), 0);
  const Shape BHTS{1, 1, 1, 9};
  const auto by_position = nn::Visibility::causal({8}, keys).expand_allowed("test", BHTS);
  const auto suffix = nn::Visibility::causal(1, 9).expand_allowed("test", BHTS);
  const std::vector<unsigned char> all_nine(9, 1);
  CHECK(by_position == all_nine);  // allowed set {0, ..., 8}
  CHECK(suffix == all_nine);       // causal(T = 1, S = 9) is the bottom-right triangle

  // The top-left 1x9 lower triangle (query row 0 treated as position 0) keeps key 0 only and
  // wrongly drops keys 1..8.
  const auto top_left = nn::Visibility::causal({0}, keys).expand_allowed("test", BHTS);
  std::vector<unsigned char> only_key0(9, 0);
  only_key0[0] = 1;
  CHECK(top_left == only_key0);

  // And the outputs differ: with distinct values the query reads all nine, not just v_0.
  Generator g(5006);
  const Tensor Q(rnd({1, 1, 1, 4}, g)), K(rnd({1, 1, 9, 4}, g)), V(rnd({1, 1, 9, 2}, g));
  const Array O = nn::attention(Q, K, V, nn::Visibility::causal(1, 9)).value();
  const Array O_all = nn::attention(Q, K, V, nn::Visibility::all()).value();
  const Array O_top_left = nn::attention(Q, K, V, nn::Visibility::causal({0}, keys)).value();
  XGT_CHECK_SAME(O, O_all);  // one visibility, two spellings: the same calls
  CHECK(O_top_left.at({0, 0, 0, 0}) == V.value().at({0, 0, 0, 0}));
  CHECK(O_top_left.at({0, 0, 0, 1}) == V.value().at({0, 0, 0, 1}));
  CHECK(max_abs_diff(O, O_top_left) > 1e-3);
}

TEST_CASE("attention: equal K and V with different queries give 1/2 and e/(1+e) (exercise 5.8)",
          "[nn][attention][spec]") {
  // Scalar keys (0, 1), values (0, 1), queries 0 and 1; d_k = 1 so the scale is 1.
  const Array Q = Array::from_vector({1, 1, 2, 1}, {0, 1}, DType::float64);
  const Array K = Array::from_vector({1, 1, 2, 1}, {0, 1}, DType::float64);
  const Array V = Array::from_vector({1, 1, 2, 1}, {0, 1}, DType::float64);
  const Array O = nn::attention(Tensor(Q), Tensor(K), Tensor(V), nn::Visibility::all()).value();
  const double e = std::exp(1.0);
  CHECK(O.flat(0) == Approx(0.5).epsilon(0).margin(1e-15));
  CHECK(O.flat(1) == Approx(e / (1 + e)).epsilon(0).margin(1e-15));
  CHECK(O.flat(1) == Approx(0.7310586).epsilon(0).margin(kPrinted7));

  // The first half of the exercise: the same weights (same Q, K) with different V give
  // different outputs.
  const Array V2 = Array::from_vector({1, 1, 2, 1}, {1, 0}, DType::float64);
  const Array O2 = nn::attention(Tensor(Q), Tensor(K), Tensor(V2), nn::Visibility::all()).value();
  CHECK(std::fabs(O2.flat(1) - O.flat(1)) > 0.1);
}

TEST_CASE("attention dropout: sampled row sums have mean 1 and variance (1-q) sum_j A_j^2 / q (exercise 5.9 and SPEC 2)",
          "[nn][attention][dropout][spec]") {
  // N identical query rows over S = 3 keys give the same weight row A (fixed, as the result
  // requires); each row gets its own Bernoulli(q) mask. With V = I the output row IS the
  // dropped-out weight row A~ = m * A / q, so its sum is the sampled row sum.
  const std::size_t N = 100000, S = 3;
  const double p = 0.3, q = 1.0 - p;
  // d_k = 1, query 1, keys log 2, log 5, log 3, scale 1: A = (0.2, 0.5, 0.3).
  const Array Q = Array::full({1, 1, N, 1}, 1.0, DType::float64);
  const Array K = Array::from_vector({1, 1, S, 1}, {std::log(2.0), std::log(5.0), std::log(3.0)}, DType::float64);
  const Array V = Array::from_vector({1, 1, S, S}, {1, 0, 0, 0, 1, 0, 0, 0, 1}, DType::float64);
  Generator gen(5009);
  nn::SdpaOptions opts;
  opts.scale = 1.0;
  opts.training = true;
  opts.dropout_p = p;
  opts.generator = &gen;
  opts.return_weights = true;
  const nn::SdpaResult r = nn::scaled_dot_product_attention(Tensor(Q), Tensor(K), Tensor(V), nn::Visibility::all(), opts);
  REQUIRE(r.dropout_mask.defined());
  const Array A = r.weights.value(), O = r.output.value();

  // A before dropout: (0.2, 0.5, 0.3), rows sum to 1 (the row-sum check applies here).
  const double a[3] = {A.flat(0), A.flat(1), A.flat(2)};
  CHECK(a[0] == Approx(0.2).epsilon(0).margin(1e-15));
  CHECK(a[1] == Approx(0.5).epsilon(0).margin(1e-15));
  CHECK(a[2] == Approx(0.3).epsilon(0).margin(1e-15));

  double mean = 0.0, m2 = 0.0;
  std::size_t not_one = 0, zero_sums = 0;
  for (std::size_t n = 0; n < N; ++n) {
    const double s = O.flat(n * S) + O.flat(n * S + 1) + O.flat(n * S + 2);
    mean += s;
    m2 += (s - 1.0) * (s - 1.0);
    if (std::fabs(s - 1.0) > 1e-12) ++not_one;
    if (s == 0.0) ++zero_sums;
  }
  mean /= static_cast<double>(N);
  m2 /= static_cast<double>(N);  // variance estimate about the known mean 1

  // Theory: S = sum_j A_j m_j / q, m_j iid Bernoulli(q).
  //   Var S   = sigma^2 = (1-q)/q sum A_j^2                                   (exercise 5.9)
  //   kappa_4 = sum_j A_j^4 kappa_4(m/q),  kappa_4(m/q) = q(1-q)(1 - 6q(1-q)) / q^4
  // (cumulants of independent terms add; kappa_4 scales with the 4th power).
  // mean(S) has standard error sigma/sqrt(N). The variance estimate mean((S-1)^2) has
  // Var((S-1)^2) = mu_4 - sigma^4 = kappa_4 + 2 sigma^4, so its standard error is
  // sqrt((kappa_4 + 2 sigma^4) / N) exactly. We assert both within 5 standard errors
  // (a fixed seed makes the test deterministic; 5 SE would be a < 1e-6 false alarm).
  double sumA2 = 0.0, sumA4 = 0.0;
  for (double x : a) {
    sumA2 += x * x;
    sumA4 += x * x * x * x;
  }
  const double sigma2 = (1.0 - q) / q * sumA2;
  const double kappa4 = sumA4 * q * (1.0 - q) * (1.0 - 6.0 * q * (1.0 - q)) / std::pow(q, 4);
  const double se_mean = std::sqrt(sigma2 / static_cast<double>(N));
  const double se_var = std::sqrt((kappa4 + 2.0 * sigma2 * sigma2) / static_cast<double>(N));
  INFO("mean " << mean << " (se " << se_mean << "), variance " << m2 << " vs " << sigma2 << " (se " << se_var << ")");
  CHECK(std::fabs(mean - 1.0) < 5 * se_mean);
  CHECK(std::fabs(m2 - sigma2) < 5 * se_var);
  // A sampled row sum is in general not 1, and may be 0 (all three dropped, probability
  // 0.3^3). It can also be 1: keeping keys 1 and 2 only gives (0.2 + 0.5)/q = 1, so we
  // claim only "in general": most sums differ from 1 (P(sum = 1) = 0.147 here).
  CHECK(not_one > N / 2);
  CHECK(zero_sums > 0);

  // Dropout off (evaluation) is exactly the deterministic path.
  nn::SdpaOptions eval = opts;
  eval.training = false;
  nn::SdpaOptions plain;
  plain.scale = 1.0;
  const Array O_eval = nn::attention(Tensor(Q), Tensor(K), Tensor(V), nn::Visibility::all(), eval).value();
  const Array O_plain = nn::attention(Tensor(Q), Tensor(K), Tensor(V), nn::Visibility::all(), plain).value();
  XGT_CHECK_SAME(O_eval, O_plain);  // the same calls (dropout off runs no dropout op)
}
