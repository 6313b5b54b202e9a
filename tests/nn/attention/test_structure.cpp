// Structural properties of attention (SPEC 3, 5, 9, 12): causal isolation of the future,
// permutation equivariance, the GQA head-to-group mapping, invalid queries, forbidden
// positions, and the shape of the score gradients. Every comparison that the spec makes
// exact (o_1, o_2 "unchanged", forbidden values "take no part") is checked with ==.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include <xgrad/checks/detail/common.hpp>
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

// Random masks in which every query row has at least one allowed key (SPEC 12, preconditions of
// permutation equivariance: every query keeps an allowed key, so every row normalises), and
// head slices: shared with checks/.
using checks::head;
using checks::random_allowed;

// Element access for rank-4 arrays.
double at4(const Array& a, std::size_t b, std::size_t h, std::size_t i, std::size_t j) { return a.at({b, h, i, j}); }

// a, b: [1, T, width] or [1, 1, T, width]. Row `row` bit for bit / its largest difference.
bool rows_identical(const Array& a, const Array& b, std::size_t width, std::size_t row) {
  for (std::size_t k = 0; k < width; ++k)
    if (a.flat(row * width + k) != b.flat(row * width + k)) return false;
  return true;
}

double row_max_diff(const Array& a, const Array& b, std::size_t width, std::size_t row) {
  double m = 0.0;
  for (std::size_t k = 0; k < width; ++k) m = std::max(m, std::fabs(a.flat(row * width + k) - b.flat(row * width + k)));
  return m;
}

std::unique_ptr<nn::MultiHeadAttention> make_mha(std::size_t d_model, std::size_t H_q, Generator& g, std::size_t H_kv = 0) {
  nn::AttentionConfig cfg;
  cfg.d_model = d_model;
  cfg.H_q = H_q;
  cfg.H_kv = H_kv;
  cfg.dtype = DType::float64;
  auto m = std::make_unique<nn::MultiHeadAttention>(cfg, g);
  // Non-zero biases, so they take part in every property below.
  m->b_QKV.set_value(rnd(m->b_QKV.shape(), g, -0.5, 0.5));
  m->b_O.set_value(rnd(m->b_O.shape(), g, -0.5, 0.5));
  return m;
}

}  // namespace

TEST_CASE("attention structure: future perturbation leaves o_1 and o_2 bit-identical under the causal mask (SPEC 5)",
          "[nn][attention][causal][spec]") {
  // The worked example (5.13)-(5.14): Q = K = X, V = X W_V; x_3 -> (5, -3).
  const Array X = Array::of({{1, 0}, {0, 1}, {1, 1}});
  const Array X2 = Array::of({{1, 0}, {0, 1}, {5, -3}});
  const Tensor W_V(Array::of({{1, 0}, {0, 2}}));
  auto run = [&](const Array& x, const nn::Visibility& vis) {
    const Tensor x4(x.reshaped({1, 1, 3, 2}));
    const Tensor v = ops::reshape(ops::matmul(Tensor(x), W_V), {1, 1, 3, 2});
    return nn::attention(x4, x4, v, vis).value();
  };
  const Array O = run(X, nn::Visibility::causal(3, 3)), O2 = run(X2, nn::Visibility::causal(3, 3));
  CHECK(rows_identical(O, O2, 2, 0));
  CHECK(rows_identical(O, O2, 2, 1));
  CHECK(row_max_diff(O, O2, 2, 2) > 0.1);  // o_3 changes (generically; it does for this x_3)

  // Without the mask the first query reads key 3, so o_1 moves.
  const Array N = run(X, nn::Visibility::all()), N2 = run(X2, nn::Visibility::all());
  CHECK(row_max_diff(N, N2, 2, 0) > 0.1);
}

TEST_CASE("attention structure: prefix isolation through a 3-layer causal stack - output i depends on x_{<=i} (SPEC 5)",
          "[nn][attention][causal][spec]") {
  const std::size_t T = 6, d = 8, L = 3;
  Generator g(7001);
  std::vector<std::unique_ptr<nn::MultiHeadAttention>> layers;
  for (std::size_t l = 0; l < L; ++l) layers.push_back(make_mha(d, 2, g));
  auto stack = [&](const Array& x0) {
    NoGradGuard ng;
    Tensor x(x0);
    for (auto& layer : layers) x = x + (*layer)(x, nn::Visibility::causal(T, T));  // residual
    return x.value();
  };
  const Array X = rnd({1, T, d}, g);
  const Array Y = stack(X);
  for (std::size_t k = 0; k < T; ++k) {
    Array Xk = X.clone();
    for (std::size_t c = 0; c < d; ++c) Xk.set_flat(k * d + c, Xk.flat(k * d + c) + 0.5 + g.uniform());
    const Array Yk = stack(Xk);
    INFO("perturbed position " << k);
    for (std::size_t i = 0; i < k; ++i) CHECK(rows_identical(Y, Yk, d, i));
    CHECK(row_max_diff(Y, Yk, d, k) > 1e-6);  // the perturbed position itself does change
    if (k + 1 < T) CHECK(row_max_diff(Y, Yk, d, T - 1) > 1e-6);  // and so does the last one
  }
}

TEST_CASE("attention structure: permutation equivariance F(PX | P M P^T) = P F(X | M) but not under a fixed causal "
          "mask (5.37)-(5.41)",
          "[nn][attention][spec]") {
  const std::size_t T = 5, d = 8;
  Generator g(7002);
  auto layer = make_mha(d, 2, g);
  const Array X = rnd({1, T, d}, g);
  const BoolArray M = random_allowed({T, T}, g, 0.5);  // every query has >= 1 allowed key
  const std::vector<std::int64_t> pi = {3, 0, 4, 1, 2};  // (P X)_i = x_{pi(i)}
  const IndexArray P(Shape{T}, pi);

  BoolArray M_perm = BoolArray::filled({T, T}, false);  // (P M P^T)_{ij} = M_{pi(i) pi(j)}
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j < T; ++j) M_perm.data[i * T + j] = M.data[pi[i] * T + pi[j]];

  NoGradGuard ng;
  const Tensor PX = ops::index_select(Tensor(X), 1, P);
  const Array Y = (*layer)(Tensor(X), nn::Visibility::allowed(M)).value();
  const Array Y_perm = (*layer)(PX, nn::Visibility::allowed(M_perm)).value();
  const Array PY = ops::index_select(Tensor(Y), 1, P).value();
  CHECK(max_abs_diff(Y_perm, PY) < 1e-12);
  // Outputs permute; they are not invariant.
  CHECK(max_abs_diff(Y_perm, Y) > 1e-3);

  // Only the tokens move, the causal mask stays: the property fails.
  const Array Yc = (*layer)(Tensor(X), nn::Visibility::causal(T, T)).value();
  const Array Yc_perm = (*layer)(PX, nn::Visibility::causal(T, T)).value();
  CHECK(max_abs_diff(Yc_perm, ops::index_select(Tensor(Yc), 1, P).value()) > 1e-3);
}

TEST_CASE("attention structure: GQA query head h reads kv head floor(h/r) and not h % H_kv (5.36)",
          "[nn][attention][gqa][spec]") {
  const std::size_t H_q = 4, H_kv = 2, T = 5, S = 6, d = 4, dv = 3;
  Generator g(7003);
  const Tensor Q(rnd({1, H_q, T, d}, g), true);
  // Very different kv heads: kv head 0's values sit near +10, kv head 1's near -10.
  Array Kv = rnd({1, H_kv, S, d}, g), Vv = rnd({1, H_kv, S, dv}, g);
  for (std::size_t i = 0; i < Vv.size(); ++i) Vv.set_flat(i, Vv.flat(i) + (i < Vv.size() / 2 ? 10.0 : -10.0));
  const Tensor K(Kv, true), V(Vv, true);
  // A different mask for every QUERY head (the mask is indexed by h, not by the group).
  const BoolArray mask = random_allowed({1, H_q, T, S}, g);
  const nn::Visibility vis = nn::Visibility::allowed(mask);
  const Tensor O = nn::attention(Q, K, V, vis);

  auto head_mask = [&](std::size_t h) {
    return nn::Visibility::allowed(
        BoolArray({T, S}, std::vector<unsigned char>(mask.data.begin() + h * T * S, mask.data.begin() + (h + 1) * T * S)));
  };
  NoGradGuard ng;
  std::vector<Tensor> floor_map, mod_map;
  for (std::size_t h = 0; h < H_q; ++h) {
    floor_map.push_back(nn::attention(head(Q, h), head(K, h / 2), head(V, h / 2), head_mask(h)));
    mod_map.push_back(nn::attention(head(Q, h), head(K, h % 2), head(V, h % 2), head_mask(h)));
  }
  const Array expected = ops::concat(floor_map, 1).value();
  const Array wrong = ops::concat(mod_map, 1).value();
  CHECK(max_abs_diff(O.value(), expected) < 1e-12);
  // The h % H_kv mapping swaps heads 1 and 2 onto the other group: far from the GQA call.
  for (std::size_t h : {1, 2}) {
    const double diff = max_abs_diff(head(O, h).value(), head(Tensor(wrong), h).value());
    INFO("head " << h);
    CHECK(diff > 1.0);
  }
  CHECK(max_abs_diff(head(O, 0).value(), head(Tensor(wrong), 0).value()) < 1e-12);  // h = 0, 3: both maps agree
  CHECK(max_abs_diff(head(O, 3).value(), head(Tensor(wrong), 3).value()) < 1e-12);
}

TEST_CASE("attention structure: GQA kv-head gradients sum over the group of query heads (5.36)",
          "[nn][attention][gqa][spec]") {
  const std::size_t H_q = 4, H_kv = 2, T = 3, S = 5, d = 4;
  Generator g(7004);
  const Array Qa = rnd({1, H_q, T, d}, g), Ka = rnd({1, H_kv, S, d}, g), Va = rnd({1, H_kv, S, d}, g);
  const Array G = rnd({1, H_q, T, d}, g);
  const nn::Visibility vis = nn::Visibility::causal(T, S);
  const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
  const std::vector<Array> gq = xg::grad(nn::attention(Q, K, V, vis), {K, V}, G);
  for (std::size_t kv = 0; kv < H_kv; ++kv) {
    Array K_sum = Array::zeros({1, 1, S, d}, DType::float64), V_sum = K_sum.clone();
    for (std::size_t h = kv * 2; h < kv * 2 + 2; ++h) {  // g(h) = floor(h / 2) = kv
      const Tensor Kh(head(Tensor(Ka), kv).value(), true), Vh(head(Tensor(Va), kv).value(), true);
      const Array Gh = head(Tensor(G), h).value();
      const auto gh = xg::grad(nn::attention(head(Tensor(Qa), h), Kh, Vh, vis), {Kh, Vh}, Gh);
      K_sum = (Tensor(K_sum) + Tensor(gh[0])).value();
      V_sum = (Tensor(V_sum) + Tensor(gh[1])).value();
    }
    INFO("kv head " << kv);
    CHECK(max_abs_diff(head(Tensor(gq[0]), kv).value(), K_sum) < 1e-12);
    CHECK(max_abs_diff(head(Tensor(gq[1]), kv).value(), V_sum) < 1e-12);
  }
}

TEST_CASE("attention structure: equal values make the weights irrelevant - every output row is v (SPEC 12)",
          "[nn][attention][spec]") {
  const std::size_t H = 2, T = 4, S = 5, d = 3, dv = 2;
  Generator g(7005);
  const Tensor Q(rnd({1, H, T, d}, g, -3, 3)), K(rnd({1, H, S, d}, g, -3, 3));
  const Array v = rnd({1, H, 1, dv}, g, -5, 5);  // one value per head, repeated at every key
  const Tensor V = ops::broadcast_to(Tensor(v), {1, H, S, dv});
  Array soft = rnd({T, S}, g, -4, 0);
  soft.set_flat(1 * S + 3, -INFINITY);
  const std::vector<std::pair<const char*, nn::Visibility>> masks = {
      {"all", nn::Visibility::all()},
      {"causal", nn::Visibility::causal(T, S)},
      {"random", nn::Visibility::allowed(random_allowed({1, H, T, S}, g))},
      {"soft bias", nn::Visibility::additive(soft)}};
  nn::SdpaOptions opts;
  opts.return_weights = true;
  for (const auto& [name, vis] : masks) {
    INFO("mask " << name);
    const nn::SdpaResult r = nn::scaled_dot_product_attention(Q, K, V, vis, opts);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i)
        for (std::size_t k = 0; k < dv; ++k)
          CHECK(at4(r.output.value(), 0, h, i, k) == Approx(v.at({0, h, 0, k})).epsilon(0).margin(1e-14));
    // ... while the weights themselves are far from uniform over the visible keys.
    double spread = 0.0;
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        double hi = 0.0, lo = 1.0;
        for (std::size_t j = 0; j < S; ++j) {
          const double a = at4(r.weights.value(), 0, h, i, j);
          hi = std::max(hi, a);
          if (a > 0.0) lo = std::min(lo, a);
        }
        spread = std::max(spread, hi - lo);
      }
    CHECK(spread > 0.1);
  }
}

TEST_CASE("attention structure: a row with one visible key has zero score and query gradients but a value gradient "
          "(SPEC 9)",
          "[nn][attention][spec]") {
  const std::size_t T = 4, S = 5, d = 3, dv = 2;
  Generator g(7006);
  BoolArray mask = random_allowed({T, S}, g, 0.7);
  for (std::size_t j = 0; j < S; ++j) mask.data[j] = (j == 2);  // query 0 sees key 2 only
  mask.data[1 * S + 0] = mask.data[1 * S + 4] = 1;             // other rows see more than one
  const nn::Visibility vis = nn::Visibility::allowed(mask);
  const Array Qa = rnd({1, 1, T, d}, g), Ka = rnd({1, 1, S, d}, g), Va = rnd({1, 1, S, dv}, g);

  SECTION("random cotangent: Q_bar row 0 is exactly zero, the others are not") {
    const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
    const auto gr = xg::grad(nn::attention(Q, K, V, vis), {Q}, rnd({1, 1, T, dv}, g));
    for (std::size_t c = 0; c < d; ++c) CHECK(at4(gr[0], 0, 0, 0, c) == 0.0);
    double other = 0.0;
    for (std::size_t c = 0; c < d; ++c) other = std::max(other, std::fabs(at4(gr[0], 0, 0, 1, c)));
    CHECK(other > 1e-6);
  }
  SECTION("loss on row 0 only: weight 1, no score gradient anywhere, value gradient G_0 at key 2") {
    nn::SdpaOptions opts;
    opts.return_weights = true;
    const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
    const nn::SdpaResult r = nn::scaled_dot_product_attention(Q, K, V, vis, opts);
    for (std::size_t j = 0; j < S; ++j) CHECK(at4(r.weights.value(), 0, 0, 0, j) == (j == 2 ? 1.0 : 0.0));
    Array G = Array::zeros({1, 1, T, dv}, DType::float64);
    G.set_flat(0, 0.7);
    G.set_flat(1, -1.3);
    const auto gr = xg::grad(r.output, {Q, K, V}, G);
    XGT_CHECK_SAME(gr[0], Array::zeros(gr[0].shape(), DType::float64));  // Q_bar = D K scale, D = 0
    XGT_CHECK_SAME(gr[1], Array::zeros(gr[1].shape(), DType::float64));  // K_bar = D^T Q scale
    for (std::size_t j = 0; j < S; ++j) {
      CHECK(at4(gr[2], 0, 0, j, 0) == (j == 2 ? 0.7 : 0.0));  // V_bar = A^T G
      CHECK(at4(gr[2], 0, 0, j, 1) == (j == 2 ? -1.3 : 0.0));
    }
  }
}

TEST_CASE("attention structure: score-gradient rows sum to zero and forbidden score gradients are zero (5.25) and (5.27)",
          "[nn][attention][spec]") {
  const std::size_t B = 2, H = 2, T = 4, S = 6, d = 3, dv = 2;
  Generator g(7007);
  const Array Qa = rnd({B, H, T, d}, g, -2, 2), Ka = rnd({B, H, S, d}, g, -2, 2), Va = rnd({B, H, S, dv}, g);
  const Array G = rnd({B, H, T, dv}, g);
  const BoolArray mask = random_allowed({B, H, T, S}, g);
  const nn::Visibility vis = nn::Visibility::allowed(mask) & nn::Visibility::causal(T, S);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));

  SECTION("D from the tape of the composed forward: rows sum to 0, D K scale is nn::attention's Q_bar") {
    const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
    const Tensor U = ops::matmul(Q, K, {false, true}) * scale;
    const Tensor O = ops::matmul(ops::softmax(ops::add_mask(U, vis.bias(DType::float64))), V);
    const Array D = xg::grad(O, {U}, G)[0];
    const std::vector<unsigned char> allowed = vis.expand_allowed("test", {B, H, T, S});
    double largest = 0.0;
    for (std::size_t r = 0; r < B * H * T; ++r) {
      double sum = 0.0;
      for (std::size_t j = 0; j < S; ++j) {
        const double Dij = D.flat(r * S + j);
        sum += Dij;
        largest = std::max(largest, std::fabs(Dij));
        if (!allowed[r * S + j]) CHECK(Dij == 0.0);
      }
      CHECK(sum == Approx(0.0).margin(1e-15));
    }
    CHECK(largest > 1e-3);  // the row sums are zero, not the rows
    const Tensor Q2(Qa, true), K2(Ka, true), V2(Va, true);
    const Array Q_bar = xg::grad(nn::attention(Q2, K2, V2, vis), {Q2}, G)[0];
    CHECK(max_abs_diff(ops::matmul(Tensor(D), Tensor(Ka)).value(), (Tensor(Q_bar) / scale).value()) < 1e-12);
  }
  SECTION("nn::attention itself: a constant extra key coordinate c gives Q_bar_extra = scale c sum_j D_ij = 0") {
    // Append a coordinate: q_i -> (q_i, 1), k_j -> (k_j, c). Scores shift by scale*c per row,
    // which softmax ignores, and dL/dq_{i,extra} = scale * c * sum_j D_ij.
    const double c = 1.7;
    const Tensor Q(ops::concat({Tensor(Qa), Tensor(Array::full({B, H, T, 1}, 1.0, DType::float64))}, 3).value(), true);
    const Tensor K(ops::concat({Tensor(Ka), Tensor(Array::full({B, H, S, 1}, c, DType::float64))}, 3).value(), true);
    const Tensor V(Va, true);
    nn::SdpaOptions opts;
    opts.scale = scale;
    const Array Q_bar = xg::grad(nn::attention(Q, K, V, vis, opts), {Q}, G)[0];
    double extra = 0.0, others = 0.0;
    for (std::size_t r = 0; r < B * H * T; ++r) {
      extra = std::max(extra, std::fabs(Q_bar.flat(r * (d + 1) + d)));
      for (std::size_t k = 0; k < d; ++k) others = std::max(others, std::fabs(Q_bar.flat(r * (d + 1) + k)));
    }
    CHECK(extra < 1e-14);
    CHECK(others > 1e-3);
  }
}

TEST_CASE("attention structure: invalid queries give zero rows and zero gradients (no NaN) even with empty allowed "
          "sets (SPEC 3.8 and Algorithm 5.1)",
          "[nn][attention][spec]") {
  // Left-padded causal batch: sample 1 has two pad tokens at positions 0 and 1. Its queries
  // 0 and 1 are invalid AND see no key (causal & key padding leaves them empty).
  const std::size_t B = 2, H = 2, T = 4, d = 3, dv = 2;
  Generator g(7008);
  const BoolArray real({B, T}, {1, 1, 1, 1, 0, 0, 1, 1});
  const nn::Visibility vis = nn::Visibility::causal(T, T) & nn::Visibility::valid_keys(real);
  nn::SdpaOptions opts;
  opts.query_valid = real;
  opts.return_weights = true;
  const Array Qa = rnd({B, H, T, d}, g), Ka = rnd({B, H, T, d}, g), Va = rnd({B, H, T, dv}, g);
  auto invalid = [&](std::size_t b, std::size_t i) { return !real.data[b * T + i]; };

  SECTION("forward: exact zero rows, finite everywhere, valid rows sum to 1") {
    const nn::SdpaResult r = nn::scaled_dot_product_attention(Tensor(Qa), Tensor(Ka), Tensor(Va), vis, opts);
    const Array O = r.output.value(), A = r.weights.value();
    REQUIRE(O.all_finite());
    REQUIRE(A.all_finite());
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < T; ++i) {
          double row_sum = 0.0;
          for (std::size_t j = 0; j < T; ++j) row_sum += at4(A, b, h, i, j);
          if (invalid(b, i)) {
            for (std::size_t k = 0; k < dv; ++k) CHECK(at4(O, b, h, i, k) == 0.0);
            for (std::size_t j = 0; j < T; ++j) CHECK(at4(A, b, h, i, j) == 0.0);  // an all-zero row
          } else {
            CHECK(row_sum == Approx(1.0).epsilon(0).margin(1e-15));  // invalid rows are skipped here
          }
        }
  }
  SECTION("backward: a cotangent on the invalid rows only sends exactly zero to Q, K and V") {
    Array G = Array::zeros({B, H, T, dv}, DType::float64);
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i)
        if (invalid(1, i))
          for (std::size_t k = 0; k < dv; ++k) G.set_flat(((1 * H + h) * T + i) * dv + k, g.uniform() + 0.5);
    const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
    const auto gr = xg::grad(nn::attention(Q, K, V, vis, opts), {Q, K, V}, G);
    for (const Array& x : gr) XGT_CHECK_SAME(x, Array::zeros(x.shape(), DType::float64));  // sums of exact zeros
  }
  SECTION("backward: random cotangent, finite gradients equal to those with the invalid rows' cotangent removed") {
    const Array G = rnd({B, H, T, dv}, g);
    Array G_valid = G.clone();
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i)
        if (invalid(1, i))
          for (std::size_t k = 0; k < dv; ++k) G_valid.set_flat(((1 * H + h) * T + i) * dv + k, 0.0);
    const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
    const auto gr = xg::grad(nn::attention(Q, K, V, vis, opts), {Q, K, V}, G);
    const Tensor Q2(Qa, true), K2(Ka, true), V2(Va, true);
    const auto gr2 = xg::grad(nn::attention(Q2, K2, V2, vis, opts), {Q2, K2, V2}, G_valid);
    for (std::size_t n = 0; n < 3; ++n) {
      INFO("input " << n);
      CHECK(gr[n].all_finite());
      CHECK(max_abs_diff(gr[n], gr2[n]) <= 1e-15);
    }
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i)
        if (invalid(1, i))
          for (std::size_t k = 0; k < d; ++k) CHECK(at4(gr[0], 1, h, i, k) == 0.0);  // Q_bar rows
  }
}

TEST_CASE("attention structure: a valid query with an empty allowed set is a VisibilityError naming batch/head/query "
          "(SPEC 3.8 and exercise 5.10)",
          "[nn][attention][errors][spec]") {
  Generator g(7009);
  SECTION("left-padded causal batch without query flags") {
    const std::size_t B = 2, H = 2, T = 4;
    const BoolArray real({B, T}, {1, 1, 1, 1, 0, 0, 1, 1});
    const nn::Visibility vis = nn::Visibility::causal(T, T) & nn::Visibility::valid_keys(real);
    const Tensor Q(rnd({B, H, T, 3}, g)), K(rnd({B, H, T, 3}, g)), V(rnd({B, H, T, 2}, g));
    CHECK_THROWS_AS(nn::attention(Q, K, V, vis), VisibilityError);
    CHECK_THROWS_WITH(nn::attention(Q, K, V, vis),
                      Catch::Contains("batch 1") && Catch::Contains("head 0") && Catch::Contains("query 0"));
  }
  SECTION("one empty row at batch 1, head 2, query 3 of a per-head mask") {
    const std::size_t B = 2, H = 3, T = 4, S = 5;
    BoolArray mask = BoolArray::filled({B, H, T, S}, true);
    for (std::size_t j = 0; j < S; ++j) mask.data[((1 * H + 2) * T + 3) * S + j] = 0;
    const Tensor Q(rnd({B, H, T, 3}, g)), K(rnd({B, H, S, 3}, g)), V(rnd({B, H, S, 2}, g));
    CHECK_THROWS_AS(nn::attention(Q, K, V, nn::Visibility::allowed(mask)), VisibilityError);
    CHECK_THROWS_WITH(nn::attention(Q, K, V, nn::Visibility::allowed(mask)),
                      Catch::Contains("batch 1") && Catch::Contains("head 2") && Catch::Contains("query 3"));
    // Declared invalid, the same row is legal and outputs zero.
    nn::SdpaOptions opts;
    opts.query_valid = BoolArray::filled({B, T}, true);
    opts.query_valid.data[1 * T + 3] = 0;
    const Array O = nn::attention(Q, K, V, nn::Visibility::allowed(mask), opts).value();
    CHECK(O.all_finite());
    CHECK(at4(O, 1, 2, 3, 0) == 0.0);
  }
}

TEST_CASE("attention structure: values at forbidden positions never influence the output - bit for bit (SPEC 3.1)",
          "[nn][attention][spec]") {
  const std::size_t H = 2, T = 5, S = 6, d = 3, dv = 2;
  Generator g(7010);
  const Array Qa = rnd({1, H, T, d}, g), Ka = rnd({1, H, S, d}, g), Va = rnd({1, H, S, dv}, g);
  const BoolArray mask = random_allowed({1, H, T, S}, g, 0.5);
  const nn::Visibility vis = nn::Visibility::allowed(mask);
  const Array O = nn::attention(Tensor(Qa), Tensor(Ka), Tensor(Va), vis).value();
  std::size_t replaced = 0;
  for (std::size_t h = 0; h < H; ++h)
    for (std::size_t i = 0; i < T; ++i) {
      // Huge finite values at every key query (h, i) may not see.
      Array Vh = Va.clone();
      for (std::size_t j = 0; j < S; ++j)
        if (!mask.data[(h * T + i) * S + j]) {
          ++replaced;
          for (std::size_t k = 0; k < dv; ++k) Vh.set_flat((h * S + j) * dv + k, (k % 2 ? -1e300 : 1e300));
        }
      const Array Oh = nn::attention(Tensor(Qa), Tensor(Ka), Tensor(Vh), vis).value();
      INFO("head " << h << ", query " << i);
      for (std::size_t k = 0; k < dv; ++k) CHECK(at4(Oh, 0, h, i, k) == at4(O, 0, h, i, k));
    }
  CHECK(replaced > 0);
}

TEST_CASE("attention structure: H_kv == H_q reproduces per-head MHA exactly (5.19) (5.21) and (5.36)",
          "[nn][attention][gqa][spec]") {
  const std::size_t B = 2, H = 3, T = 4, d = 2, dv = 2, d_model = 6;
  Generator g(7011);
  SECTION("the core: each head equals a single-head call on its own Q, K, V, values and gradients") {
    // With r = 1 no rows are stacked, so each head runs the same-shaped GEMMs as the
    // single-head call and the results agree bit for bit.
    const Array Qa = rnd({B, H, T, d}, g), Ka = rnd({B, H, T, d}, g), Va = rnd({B, H, T, dv}, g);
    const Array G = rnd({B, H, T, dv}, g);
    const nn::Visibility vis = nn::Visibility::causal(T, T);
    const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
    const Tensor O = nn::attention(Q, K, V, vis);
    const Array Ov = O.value();
    const auto gr = xg::grad(O, {Q, K, V}, G);
    for (std::size_t h = 0; h < H; ++h) {
      INFO("head " << h);
      const Tensor Qh(head(Tensor(Qa), h).value(), true), Kh(head(Tensor(Ka), h).value(), true),
          Vh(head(Tensor(Va), h).value(), true);
      const Tensor Oh = nn::attention(Qh, Kh, Vh, vis);
      // Bits: the batched products run one GEMM per (batch, head), of the same shape as one
      // head's alone; the softmax is row by row.
      XGT_CHECK_SAME(head(Tensor(Ov), h).value(), Oh.value());
      const auto gh = xg::grad(Oh, {Qh, Kh, Vh}, head(Tensor(G), h).value());
      for (std::size_t n = 0; n < 3; ++n) XGT_CHECK_SAME(head(Tensor(gr[n]), h).value(), gh[n]);
    }
  }
  SECTION("the layer: MultiHeadAttention with H_kv = H_q is Y = sum_h O^(h) W_O^(h) + b_O") {
    auto layer = make_mha(d_model, H, g, H);  // H_kv given explicitly, equal to H_q
    REQUIRE(layer->config().H_kv == H);
    const Array X = rnd({B, T, d_model}, g);
    NoGradGuard ng;
    const Array Y = (*layer)(Tensor(X), nn::Visibility::causal(T, T)).value();
    const std::size_t d_h = layer->d_head();
    const Tensor P = ops::matmul(Tensor(X), layer->W_QKV) + layer->b_QKV;  // [B, T, 3 H d_h]
    Tensor Y_ref = ops::reshape(layer->b_O, {1, 1, static_cast<long>(d_model)});
    for (std::size_t h = 0; h < H; ++h) {
      auto cols = [&](std::size_t block) {  // block 0 = Q, 1 = K, 2 = V; head h's d_h columns
        const long start = static_cast<long>(block * H * d_h + h * d_h);
        return ops::unsqueeze(ops::slice(P, 2, start, start + static_cast<long>(d_h)), 1);  // [B, 1, T, d_h]
      };
      const Tensor Oh = ops::squeeze(nn::attention(cols(0), cols(1), cols(2), nn::Visibility::causal(T, T)), 1);
      const long r0 = static_cast<long>(h * d_h);
      Y_ref = Y_ref + ops::matmul(Oh, ops::slice(layer->W_O, 0, r0, r0 + static_cast<long>(d_h)));  // (5.21)
    }
    CHECK(max_abs_diff(Y, Y_ref.value()) < 1e-12);
  }
}
