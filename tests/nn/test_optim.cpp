// Optimizers, gradient clipping and the learning-rate schedule (nn/optim.hpp) against their
// published closed forms, hand-expanded for a few steps in the test (never by calling xgrad's
// update code for the expected values):
//   SGD (Robbins-Monro; momentum as torch.optim.SGD, dampening 0): v_t = mu v_{t-1} + g_t,
//     p_t = p_{t-1} - lr v_t, so with v_0 = 0: p_3 = p_0 - lr((1+mu+mu^2) g_1 + (1+mu) g_2 + g_3).
//   Adam (Kingma & Ba 2015, Algorithm 1): m_t = (1-b1) sum_k b1^(t-k) g_k,
//     v_t = (1-b2) sum_k b2^(t-k) g_k^2, p_t = p_{t-1} - lr (m_t/(1-b1^t)) / (sqrt(v_t/(1-b2^t)) + eps).
//   AdamW (Loshchilov & Hutter 2019, torch.optim.AdamW): p_t = p_{t-1} (1 - lr wd) - lr m^_t / (sqrt(v^_t) + eps).
//   Clipping by global norm: N = sqrt(sum of every squared gradient entry); g *= max_norm / N when N > max_norm.
//   Warmup + cosine: lr_max (s+1)/W for s < W, then lr_min + (lr_max - lr_min)(1 + cos(pi (s-W)/(T-W)))/2.
// Nesterov momentum is not offered by nn::SGD.
#include <cmath>
#include <vector>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

constexpr double kTol = 1e-15;

Tensor param(std::vector<double> v) {
  const std::size_t n = v.size();
  return Tensor(Array::from_vector({n}, v, DType::float64), true);
}

void set_grad(Tensor p, const std::vector<double>& g) {
  p.set_grad(Array::from_vector({g.size()}, g, DType::float64));
}

// Sets the gradients g[t] (one per parameter) and takes one step, for each t.
void run(Optimizer& opt, std::vector<Tensor> ps, const std::vector<std::vector<std::vector<double>>>& g) {
  for (const auto& step : g) {
    for (std::size_t k = 0; k < ps.size(); ++k) set_grad(ps[k], step[k]);
    opt.step();
  }
}

void check_values(const Tensor& p, const std::vector<double>& expected, double tol = kTol) {
  const auto got = p.value().to_vector();
  REQUIRE(got.size() == expected.size());
  for (std::size_t k = 0; k < got.size(); ++k) {
    INFO("entry " << k << ": got " << got[k] << ", expected " << expected[k]);
    CHECK(std::fabs(got[k] - expected[k]) <= tol * std::max(1.0, std::fabs(expected[k])));
  }
}

}  // namespace

TEST_CASE("optim: SGD without momentum is p_t = p_0 - lr sum g_k", "[optim][closed_form]") {
  Tensor p = param({1.0, -2.0});
  SGD opt({{"p", p}}, 0.1);
  run(opt, {p}, {{{0.5, 0.25}}, {{-1.0, 2.0}}, {{0.3, -0.7}}});
  check_values(p, {1.0 - 0.1 * (0.5 - 1.0 + 0.3), -2.0 - 0.1 * (0.25 + 2.0 - 0.7)});
  CHECK(opt.step_count() == 3);
}

TEST_CASE("optim: SGD with momentum gives p_3 = p_0 - lr((1+mu+mu^2) g_1 + (1+mu) g_2 + g_3)", "[optim][closed_form]") {
  const double lr = 0.1, mu = 0.9;
  Tensor p = param({1.0, -2.0});
  SGD opt({{"p", p}}, lr, mu);
  const double g1[2] = {0.5, 0.25}, g2[2] = {-1.0, 2.0}, g3[2] = {0.3, -0.7};
  run(opt, {p}, {{{g1[0], g1[1]}}, {{g2[0], g2[1]}}, {{g3[0], g3[1]}}});
  std::vector<double> e(2);
  const double p0[2] = {1.0, -2.0};
  for (int k = 0; k < 2; ++k) e[k] = p0[k] - lr * ((1 + mu + mu * mu) * g1[k] + (1 + mu) * g2[k] + g3[k]);
  check_values(p, e);
  // The momentum buffer is v_3 = mu^2 g_1 + mu g_2 + g_3.
  const auto st = opt.state();
  REQUIRE(st.size() == 1);
  CHECK(st[0].first == "p.momentum");
  for (int k = 0; k < 2; ++k) CHECK(st[0].second.flat(k) == Approx(mu * mu * g1[k] + mu * g2[k] + g3[k]).epsilon(1e-15));
}

TEST_CASE("optim: SGD with momentum and L2 weight decay takes scalar steps d_t = g_t + wd p_{t-1}", "[optim][closed_form]") {
  const double lr = 0.05, mu = 0.8, wd = 0.1;
  Tensor p = param({2.0});
  SGD opt({{"p", p}}, lr, mu, wd);
  run(opt, {p}, {{{1.0}}, {{-0.5}}});
  // Step 1: d = 1 + 0.1*2 = 1.2, v = 1.2, p = 2 - 0.05*1.2 = 1.94.
  // Step 2: d = -0.5 + 0.1*1.94 = -0.306, v = 0.8*1.2 - 0.306 = 0.654, p = 1.94 - 0.05*0.654 = 1.9073.
  check_values(p, {1.9073}, 1e-14);
}

TEST_CASE("optim: Adam against Kingma & Ba's closed form for 3 steps (first step = lr sign(g))", "[optim][closed_form]") {
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  Tensor p = param({0.5, -1.5, 3.0});
  Adam opt({{"p", p}}, lr, b1, b2, eps);
  const std::vector<std::vector<double>> g = {{0.2, -3.0, 1e-3}, {-0.4, -1.0, 2e-3}, {0.1, 0.5, -5e-3}};
  std::vector<double> x = {0.5, -1.5, 3.0};
  for (std::size_t t = 1; t <= 3; ++t) {
    set_grad(p, g[t - 1]);
    opt.step();
    for (std::size_t k = 0; k < 3; ++k) {
      // Moments as explicit sums over the gradients so far (no recursion).
      double m = 0, v = 0;
      for (std::size_t s = 1; s <= t; ++s) {
        m += (1 - b1) * std::pow(b1, static_cast<double>(t - s)) * g[s - 1][k];
        v += (1 - b2) * std::pow(b2, static_cast<double>(t - s)) * g[s - 1][k] * g[s - 1][k];
      }
      const double mhat = m / (1 - std::pow(b1, static_cast<double>(t)));
      const double vhat = v / (1 - std::pow(b2, static_cast<double>(t)));
      x[k] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    INFO("step " << t);
    check_values(p, x, 1e-14);
    if (t == 1)  // m^ = g, v^ = g^2: the first step is lr g / (|g| + eps), about lr sign(g)
      for (std::size_t k = 0; k < 3; ++k)
        CHECK(std::fabs(p.value().flat(k) - (std::vector<double>{0.5, -1.5, 3.0}[k] - lr * (g[0][k] > 0 ? 1 : -1))) < 1e-7);
  }
}

TEST_CASE("optim: Adam with L2 weight decay adds wd p to the gradient before the moments", "[optim][closed_form]") {
  const double lr = 0.1, b1 = 0.5, b2 = 0.75, eps = 1e-3, wd = 0.2;
  Tensor p = param({1.0});
  Adam opt({{"p", p}}, lr, b1, b2, eps, wd);
  run(opt, {p}, {{{0.4}}, {{-0.2}}});
  // Step 1: d1 = 0.4 + 0.2*1 = 0.6; m^ = d1, v^ = d1^2; p1 = 1 - 0.1 * 0.6 / (0.6 + 1e-3).
  const double d1 = 0.6, p1 = 1.0 - 0.1 * d1 / (d1 + 1e-3);
  // Step 2: d2 = -0.2 + 0.2 p1; m2 = 0.5*0.5 d1 + 0.5 d2 ... written out with b1 = 0.5, b2 = 0.75.
  const double d2 = -0.2 + 0.2 * p1;
  const double m2 = 0.5 * (0.5 * d1) + 0.5 * d2, v2 = 0.75 * (0.25 * d1 * d1) + 0.25 * d2 * d2;
  const double p2 = p1 - 0.1 * (m2 / (1 - 0.25)) / (std::sqrt(v2 / (1 - 0.5625)) + 1e-3);
  check_values(p, {p2}, 1e-14);
}

TEST_CASE("optim: AdamW decays the weights before the Adam step: p_t = p_{t-1}(1 - lr wd) - lr m^/(sqrt v^ + eps)",
          "[optim][closed_form]") {
  const double lr = 0.01, wd = 0.1, b1 = 0.9, b2 = 0.99, eps = 1e-8;
  Tensor p = param({2.0, -1.0});
  AdamW opt({{"p", p}}, lr, wd, b1, b2, eps);
  CHECK(opt.kind() == "adamw");
  const std::vector<std::vector<double>> g = {{1.0, 0.0}, {-2.0, 0.0}, {0.5, 0.0}};
  std::vector<double> x = {2.0, -1.0};
  for (std::size_t t = 1; t <= 3; ++t) {
    set_grad(p, g[t - 1]);
    opt.step();
    for (std::size_t k = 0; k < 2; ++k) {
      double m = 0, v = 0;
      for (std::size_t s = 1; s <= t; ++s) {
        m += (1 - b1) * std::pow(b1, static_cast<double>(t - s)) * g[s - 1][k];
        v += (1 - b2) * std::pow(b2, static_cast<double>(t - s)) * g[s - 1][k] * g[s - 1][k];
      }
      const double mhat = m / (1 - std::pow(b1, static_cast<double>(t)));
      const double vhat = v / (1 - std::pow(b2, static_cast<double>(t)));
      x[k] = x[k] * (1 - lr * wd) - lr * mhat / (std::sqrt(vhat) + eps);
    }
    INFO("step " << t);
    check_values(p, x, 1e-14);
  }
  // The second entry has zero gradient throughout: pure decoupled decay, p_0 (1 - lr wd)^3
  // (L2-style decay would have moved it by about lr per step instead).
  CHECK(p.value().flat(1) == Approx(-1.0 * std::pow(1 - lr * wd, 3)).epsilon(1e-15));
}

TEST_CASE("optim: clip_grad_norm scales by max_norm / N over all parameters and returns N", "[optim][closed_form]") {
  Tensor a = param({0.0, 0.0}), b = param({0.0}), c = param({5.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});  // global norm sqrt(9 + 16 + 144) = 13
  const NamedTensors ps = {{"a", a}, {"b", b}, {"c", c}};  // c has no gradient: skipped
  CHECK(clip_grad_norm(ps, 6.5) == Approx(13.0).epsilon(1e-15));
  check_values(Tensor(a.grad()), {1.5, 2.0});
  check_values(Tensor(b.grad()), {6.0});
  CHECK_FALSE(c.has_grad());
  // Below the threshold: unchanged, and the norm is that of the clipped gradients (6.5).
  CHECK(clip_grad_norm(ps, 100.0) == Approx(6.5).epsilon(1e-15));
  check_values(Tensor(a.grad()), {1.5, 2.0});
  CHECK_THROWS_WITH(clip_grad_norm(ps, 0.0), Catch::Contains("clip_grad_norm") && Catch::Contains("max_norm"));
}

TEST_CASE("optim: warmup_cosine equals its closed form", "[optim][closed_form]") {
  const double hi = 1e-3, lo = 1e-4;
  const std::int64_t W = 4, T = 12;
  // Warmup: lr_max (s + 1) / W.
  CHECK(warmup_cosine(0, W, T, hi, lo) == Approx(hi / 4).epsilon(1e-15));
  CHECK(warmup_cosine(2, W, T, hi, lo) == Approx(3 * hi / 4).epsilon(1e-15));
  CHECK(warmup_cosine(3, W, T, hi, lo) == Approx(hi).epsilon(1e-15));
  // Cosine: progress (s - W) / (T - W) = 0, 1/4, 1/2, 1.
  CHECK(warmup_cosine(4, W, T, hi, lo) == Approx(hi).epsilon(1e-15));
  CHECK(warmup_cosine(6, W, T, hi, lo) == Approx(lo + (hi - lo) * (1 + std::sqrt(0.5)) / 2).epsilon(1e-15));
  CHECK(warmup_cosine(8, W, T, hi, lo) == Approx((hi + lo) / 2).epsilon(1e-15));
  CHECK(warmup_cosine(10, W, T, hi, lo) == Approx(lo + (hi - lo) * (1 - std::sqrt(0.5)) / 2).epsilon(1e-14));
  CHECK(warmup_cosine(12, W, T, hi, lo) == Approx(lo).epsilon(1e-15));
  CHECK(warmup_cosine(1000, W, T, hi, lo) == Approx(lo).epsilon(1e-15));
  // No warmup: the cosine starts at step 0.
  CHECK(warmup_cosine(0, 0, 8, 2.0) == Approx(2.0).epsilon(1e-15));
  CHECK(warmup_cosine(4, 0, 8, 2.0) == Approx(1.0).epsilon(1e-15));
  CHECK(warmup_cosine(2, 0, 8, 2.0) == Approx(1 + std::sqrt(0.5)).epsilon(1e-15));
}
