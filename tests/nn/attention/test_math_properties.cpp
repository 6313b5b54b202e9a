// Properties docs/math.md states of attention, each with a test that fails if the property
// did not hold: SPEC 1.1 / (5.9) (rows sum to 1, columns do not, A not symmetric even when
// Q = K, without a mask), (5.8) (correlated coordinates: score variance tr(C_q C_k)),
// (5.10) (attention commutes with a linear map applied to V), Algorithm 5.1 step 3 (a
// non-finite score from finite inputs is an error naming the step, on both paths and both
// dtypes), and the streaming-source availability mask of SPEC 8.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/support/helpers.hpp"
#include <xgrad/checks/attention_reference.hpp>

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

double at4(const Array& a, std::size_t b, std::size_t h, std::size_t i, std::size_t j) { return a.at({b, h, i, j}); }

}  // namespace

TEST_CASE("attention properties: with no mask and Q = K the weight rows sum to 1 but not the columns and A is not symmetric (5.9) SPEC 1.1",
          "[attention][properties]") {
  Generator g(911);
  const std::size_t T = 5, d = 3;
  const Array X = rnd({1, 1, T, d}, g, -2, 2);
  SdpaOptions o;
  o.return_weights = true;
  // Q = K = X, no mask at all.
  const Array A = scaled_dot_product_attention(Tensor(X), Tensor(X), Tensor(X), Visibility::all(), o).weights.value();
  REQUIRE(A.shape() == Shape{1, 1, T, T});
  // The scores are symmetric when Q = K (computed here from the definition (5.3)) ...
  double max_col_dev = 0, max_asym = 0;
  for (std::size_t i = 0; i < T; ++i) {
    double row = 0, col = 0;
    for (std::size_t j = 0; j < T; ++j) {
      row += at4(A, 0, 0, i, j);
      col += at4(A, 0, 0, j, i);
      CHECK(at4(A, 0, 0, i, j) > 0.0);  // no mask: every weight positive
      max_asym = std::max(max_asym, std::fabs(at4(A, 0, 0, i, j) - at4(A, 0, 0, j, i)));
    }
    CHECK(row == Approx(1.0).epsilon(0).margin(1e-14));
    max_col_dev = std::max(max_col_dev, std::fabs(col - 1.0));
  }
  // ... but each row has its own denominator: A is neither doubly stochastic nor symmetric.
  INFO("max |column sum - 1| = " << max_col_dev << ", max |A_ij - A_ji| = " << max_asym);
  CHECK(max_col_dev > 0.05);
  CHECK(max_asym > 0.05);
  // Symmetric scores, asymmetric weights: A_ij / A_ji = Z_j / Z_i (row normalisers), checked
  // for one pair against the definition.
  auto Z = [&](std::size_t i) {
    double z = 0;
    for (std::size_t j = 0; j < T; ++j) {
      double u = 0;
      for (std::size_t r = 0; r < d; ++r) u += X.at({0, 0, i, r}) * X.at({0, 0, j, r});
      z += std::exp(u / std::sqrt(static_cast<double>(d)));
    }
    return z;
  };
  CHECK(at4(A, 0, 0, 0, 1) / at4(A, 0, 0, 1, 0) == Approx(Z(1) / Z(0)).epsilon(1e-12));
}

TEST_CASE("attention properties: correlated query/key coordinates give score variance tr(C_q C_k) and not d_k s_q^2 s_k^2 (5.8)",
          "[attention][properties]") {
  // q = z_q L_q^T and k = z_k L_k^T with z standard normal, so C_q = L_q L_q^T and
  // C_k = L_k L_k^T (d_k = 4, strongly correlated coordinates). As in the (5.5)-(5.7) test,
  // each pair is a sample with two keys, key 0 = 0 (score 0) and key 1 = k; the raw score
  // s = q.k (scale = 1) the library computed is log(a_1) - log(a_0).
  const std::size_t N = 20000, d = 4;
  const double Lq[4][4] = {{1.0, 0, 0, 0}, {0.9, 0.5, 0, 0}, {0.8, 0.3, 0.4, 0}, {0.7, 0.2, 0.1, 0.6}};
  const double Lk[4][4] = {{1.2, 0, 0, 0}, {1.0, 0.4, 0, 0}, {0.9, 0.1, 0.5, 0}, {1.1, 0.3, 0.2, 0.3}};
  double Cq[4][4] = {}, Ck[4][4] = {};
  for (std::size_t a = 0; a < d; ++a)
    for (std::size_t b = 0; b < d; ++b)
      for (std::size_t r = 0; r < d; ++r) {
        Cq[a][b] += Lq[a][r] * Lq[b][r];
        Ck[a][b] += Lk[a][r] * Lk[b][r];
      }
  double M[4][4] = {};  // C_q C_k
  for (std::size_t a = 0; a < d; ++a)
    for (std::size_t b = 0; b < d; ++b)
      for (std::size_t r = 0; r < d; ++r) M[a][b] += Cq[a][r] * Ck[r][b];
  double trM = 0, trM2 = 0, trCq = 0, trCk = 0;
  for (std::size_t a = 0; a < d; ++a) {
    trM += M[a][a];
    trCq += Cq[a][a];
    trCk += Ck[a][a];
    for (std::size_t b = 0; b < d; ++b) trM2 += M[a][b] * M[b][a];
  }
  // The isotropic formula (5.6) with the average coordinate variances, for contrast.
  const double isotropic = static_cast<double>(d) * (trCq / d) * (trCk / d);

  Generator g(5008);
  const Array zq = random_normal({N, 1, 1, d}, g, DType::float64);
  const Array zk = random_normal({N, 1, 1, d}, g, DType::float64);
  Array Q = Array::zeros({N, 1, 1, d}, DType::float64);
  Array K = Array::zeros({N, 1, 2, d}, DType::float64);
  for (std::size_t n = 0; n < N; ++n)
    for (std::size_t a = 0; a < d; ++a) {
      double q = 0, k = 0;
      for (std::size_t r = 0; r < d; ++r) {
        q += Lq[a][r] * zq.flat(n * d + r);
        k += Lk[a][r] * zk.flat(n * d + r);
      }
      Q.set_flat(n * d + a, q);
      K.set_flat((n * 2 + 1) * d + a, k);
    }
  SdpaOptions o;
  o.return_weights = true;
  o.scale = 1.0;
  const Array A = scaled_dot_product_attention(Tensor(Q), Tensor(K), Tensor(Array::zeros({N, 1, 2, 1}, DType::float64)),
                                               Visibility::all(), o)
                      .weights.value();
  double m2 = 0;
  for (std::size_t n = 0; n < N; ++n) {
    const double s = std::log(A.flat(2 * n + 1)) - std::log(A.flat(2 * n));
    m2 += s * s;
  }
  const double var = m2 / static_cast<double>(N);
  // E[s] = 0, so mean(s^2) estimates Var(s). For Gaussian q, k: given q, s ~ N(0, q C_k q^T),
  // so E[s^4] = 3 E[(q C_k q^T)^2] = 3 (tr(M)^2 + 2 tr(M^2)) with M = C_q C_k, hence
  // Var(s^2) = 2 tr(M)^2 + 6 tr(M^2) and the standard error of mean(s^2) is
  // sqrt(Var(s^2) / N). We allow 5 standard errors.
  const double se = std::sqrt((2 * trM * trM + 6 * trM2) / static_cast<double>(N));
  INFO("estimated Var(s) = " << var << ", tr(C_q C_k) = " << trM << ", standard error " << se
                             << ", isotropic d_k s_q^2 s_k^2 = " << isotropic);
  CHECK(std::fabs(var - trM) < 5 * se);
  // The isotropic formula is far off here (the test can tell the two apart).
  CHECK(std::fabs(isotropic - trM) > 20 * se);
}

TEST_CASE("attention properties: attention commutes with a linear map applied to V: P(o_i) = sum_j a_ij P(v_j) (5.10)",
          "[attention][properties]") {
  Generator g(1010);
  const std::size_t B = 2, H_q = 4, H_kv = 2, T = 5, S = 7, d_k = 3, d_v = 4, d_p = 3;
  const Array Q = rnd({B, H_q, T, d_k}, g, -2, 2), K = rnd({B, H_kv, S, d_k}, g, -2, 2);
  const Array V = rnd({B, H_kv, S, d_v}, g, -2, 2);
  const Array P = rnd({d_v, d_p}, g, -2, 2);  // not square: a projection to 3 dimensions
  // V P computed by plain loops.
  Array VP = Array::zeros({B, H_kv, S, d_p}, DType::float64);
  for (std::size_t r = 0; r < B * H_kv * S; ++r)
    for (std::size_t c = 0; c < d_p; ++c) {
      double s = 0;
      for (std::size_t k = 0; k < d_v; ++k) s += V.flat(r * d_v + k) * P.at({k, c});
      VP.set_flat(r * d_p + c, s);
    }
  const Visibility vis = Visibility::causal(T, S) & Visibility::key_lengths({7, 6}, S);
  for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
    INFO((impl == SdpaImpl::fused ? "fused" : "composed"));
    SdpaOptions o;
    o.impl = impl;
    const Array O = attention(Tensor(Q), Tensor(K), Tensor(V), vis, o).value();
    const Array OVP = attention(Tensor(Q), Tensor(K), Tensor(VP), vis, o).value();
    REQUIRE(OVP.shape() == Shape{B, H_q, T, d_p});
    double worst = 0;
    for (std::size_t r = 0; r < B * H_q * T; ++r)
      for (std::size_t c = 0; c < d_p; ++c) {
        double s = 0;
        for (std::size_t k = 0; k < d_v; ++k) s += O.flat(r * d_v + k) * P.at({k, c});
        worst = std::max(worst, std::fabs(s - OVP.flat(r * d_p + c)));
      }
    CHECK(worst < 1e-13);
    // Convex combination: without dropout each output coordinate lies between the smallest
    // and largest value coordinate of its kv head.
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H_q; ++h)
        for (std::size_t i = 0; i < T; ++i)
          for (std::size_t c = 0; c < d_v; ++c) {
            double lo = 1e300, hi = -1e300;
            for (std::size_t j = 0; j < S; ++j) {
              const double v = V.at({b, h / (H_q / H_kv), j, c});
              lo = std::min(lo, v);
              hi = std::max(hi, v);
            }
            const double oc = O.at({b, h, i, c});
            CHECK(oc >= lo - 1e-14);
            CHECK(oc <= hi + 1e-14);
          }
  }
}

TEST_CASE("attention properties: a non-finite score from finite inputs is an error naming Algorithm 5.1 step 3 on both paths and dtypes",
          "[attention][properties][errors]") {
  // float64: 1e200 * 1e200 overflows; float32: 1e20 * 1e20 = 1e40 overflows (max ~3.4e38).
  for (const DType dt : {DType::float64, DType::float32}) {
    const double big = dt == DType::float64 ? 1e200 : 1e20;
    const Tensor Q(Array::full({1, 1, 2, 1}, big, dt));
    const Tensor K(Array::full({1, 1, 3, 1}, big, dt));
    const Tensor V(Array::full({1, 1, 3, 1}, 1.0, dt));
    REQUIRE(Q.value().first_nonfinite() == Q.value().size());  // the inputs are finite
    for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
      INFO(dtype_name(dt) << (impl == SdpaImpl::fused ? " fused" : " composed"));
      SdpaOptions o;
      o.impl = impl;
      CHECK_THROWS_AS(scaled_dot_product_attention(Q, K, V, Visibility::all(), o), ValueError);
      CHECK_THROWS_WITH(scaled_dot_product_attention(Q, K, V, Visibility::all(), o),
                        Catch::Contains("Algorithm 5.1 step 3") && Catch::Contains("score"));
      // Also with a mask: the overflowing scores of the allowed keys are the error.
      CHECK_THROWS_WITH(scaled_dot_product_attention(Q, K, V, Visibility::causal(2, 3), o),
                        Catch::Contains("Algorithm 5.1 step 3"));
      // -inf from finite inputs too (opposite signs).
      const Tensor Kneg(Array::full({1, 1, 3, 1}, -big, dt));
      CHECK_THROWS_WITH(scaled_dot_product_attention(Q, Kneg, V, Visibility::all(), o),
                        Catch::Contains("Algorithm 5.1 step 3"));
    }
  }
}

// ---- SPEC 8: streaming sources, Visibility::available(arrival, query_time)

namespace {

// The allowed set from the definitions alone, [B, T, S]: source position j exists for
// query i of sample b iff arrival[b][j] <= time[b][i]; causal self-style constraint by
// absolute positions k_pos[j] <= q_pos[i]; key padding j < len[b].
std::vector<unsigned char> stream_allowed(const std::vector<std::vector<std::int64_t>>& arrival,
                                          const std::vector<std::vector<std::int64_t>>& time, bool with_causal,
                                          const std::vector<std::int64_t>& q_pos, const std::vector<std::int64_t>& k_pos,
                                          const std::vector<std::int64_t>& len) {
  const std::size_t B = arrival.size(), S = arrival[0].size(), T = time[0].size();
  std::vector<unsigned char> a(B * T * S);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t j = 0; j < S; ++j) {
        bool ok = arrival[b][j] <= time[b][i];
        if (with_causal) ok = ok && k_pos[j] <= q_pos[i];
        if (!len.empty()) ok = ok && static_cast<std::int64_t>(j) < len[b];
        a[(b * T + i) * S + j] = ok;
      }
  return a;
}

IndexArray to_index(const std::vector<std::vector<std::int64_t>>& v) {
  std::vector<std::int64_t> flat;
  for (const auto& r : v) flat.insert(flat.end(), r.begin(), r.end());
  return IndexArray({v.size(), v[0].size()}, flat);
}

}  // namespace

TEST_CASE("availability mask: streaming sources (SPEC 8) alone and intersected with the fused path equal to the composed",
          "[attention][properties][visibility]") {
  // Sample 0: source positions arrive one per step in order (0, 1, 2, ...); sample 1 arrives
  // in bursts and out of order (position 4 before position 3).
  const std::vector<std::vector<std::int64_t>> arrival = {{0, 1, 2, 3, 4, 5, 6, 7}, {0, 0, 2, 5, 3, 3, 6, 9}};
  const std::vector<std::vector<std::int64_t>> time = {{0, 2, 3, 5, 7, 9}, {1, 2, 3, 4, 6, 9}};
  const std::size_t B = 2, T = 6, S = 8;
  const std::vector<std::int64_t> q_pos = {2, 3, 4, 5, 6, 7}, k_pos = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<std::int64_t> len = {8, 7};
  const Visibility avail = Visibility::available(to_index(arrival), to_index(time));
  CHECK(avail.shape() == Shape{B, 1, T, S});

  struct Variant {
    const char* name;
    Visibility vis;
    std::vector<unsigned char> expected;
  };
  const std::vector<Variant> variants = {
      {"available alone", avail, stream_allowed(arrival, time, false, q_pos, k_pos, {})},
      {"available & causal & key padding",
       avail & Visibility::causal(q_pos, k_pos) & Visibility::key_lengths(len, static_cast<Position>(S)),
       stream_allowed(arrival, time, true, q_pos, k_pos, len)},
      {"key padding & available (order does not matter)",
       Visibility::key_lengths(len, static_cast<Position>(S)) & avail,
       stream_allowed(arrival, time, false, q_pos, k_pos, len)},
  };
  Generator g(808);
  const std::size_t H = 2, d = 3;
  const Array Qa = rnd({B, H, T, d}, g, -2, 2), Ka = rnd({B, H, S, d}, g, -2, 2), Va = rnd({B, H, S, d}, g, -2, 2);
  const Array G = rnd({B, H, T, d}, g);
  for (const Variant& v : variants) {
    INFO(v.name);
    // The allowed set the library expands equals the definition.
    const auto got = v.vis.expand_allowed("test", {B, H, T, S});
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < T; ++i)
          for (std::size_t j = 0; j < S; ++j) {
            INFO("b " << b << " h " << h << " i " << i << " j " << j);
            REQUIRE(got[((b * H + h) * T + i) * S + j] == v.expected[(b * T + i) * S + j]);
          }
    // Queries that see nothing yet are declared invalid (SPEC 3.8).
    BoolArray valid = BoolArray::filled({B, T}, true);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t i = 0; i < T; ++i) {
        bool any = false;
        for (std::size_t j = 0; j < S; ++j) any = any || v.expected[(b * T + i) * S + j];
        valid.data[b * T + i] = any;
      }
    Array O[2], dQ[2], dK[2], dV[2];
    int k = 0;
    for (const SdpaImpl impl : {SdpaImpl::composed, SdpaImpl::fused}) {
      Tensor Q(Qa, true), K(Ka, true), V(Va, true);
      SdpaOptions o;
      o.impl = impl;
      o.query_valid = valid;
      const Tensor out = attention(Q, K, V, v.vis, o);
      const auto gr = grad(out, {Q, K, V}, G);
      O[k] = out.value();
      dQ[k] = gr[0];
      dK[k] = gr[1];
      dV[k] = gr[2];
      ++k;
    }
    require_close(O[0], O[1], 1e-12);
    require_close(dQ[0], dQ[1], 1e-12);
    require_close(dK[0], dK[1], 1e-12);
    require_close(dV[0], dV[1], 1e-12);
    // The output from the definition (plain loops): a softmax over the allowed set.
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < T; ++i) {
          std::vector<double> u(S, -std::numeric_limits<double>::infinity());
          double mx = -std::numeric_limits<double>::infinity();
          for (std::size_t j = 0; j < S; ++j)
            if (v.expected[(b * T + i) * S + j]) {
              double s = 0;
              for (std::size_t r = 0; r < d; ++r) s += Qa.at({b, h, i, r}) * Ka.at({b, h, j, r});
              u[j] = s / std::sqrt(static_cast<double>(d));
              mx = std::max(mx, u[j]);
            }
          double z = 0;
          for (std::size_t j = 0; j < S; ++j)
            if (v.expected[(b * T + i) * S + j]) z += std::exp(u[j] - mx);
          for (std::size_t c = 0; c < d; ++c) {
            double o = 0;
            for (std::size_t j = 0; j < S; ++j)
              if (v.expected[(b * T + i) * S + j]) o += std::exp(u[j] - mx) / z * Va.at({b, h, j, c});
            CHECK(O[1].at({b, h, i, c}) == Approx(o).epsilon(0).margin(1e-12));
          }
        }
  }
  // Query 0 of sample 0 (time 0) sees exactly source position 0; a later query sees more.
  const auto a0 = avail.expand_allowed("test", {B, 1, T, S});
  CHECK(a0[0] == 1);
  CHECK(a0[1] == 0);
  // Broadcast forms: [S] arrival shared by the batch, [T] query times.
  const Visibility shared = Visibility::available(IndexArray{0, 1, 2}, IndexArray{1, 2});
  CHECK(shared.shape() == Shape{1, 1, 2, 3});
  const auto as = shared.expand_allowed("test", {1, 1, 2, 3});
  CHECK(as == std::vector<unsigned char>{1, 1, 0, 1, 1, 1});
}

TEST_CASE("availability mask: bad input is an error naming Visibility::available and the offending value",
          "[attention][properties][errors]") {
  const IndexArray arr({2, 3}, {0, 1, 2, 0, 1, 2});
  const IndexArray tm({2, 2}, {0, 1, 2, 3});
  CHECK_NOTHROW(Visibility::available(arr, tm));
  CHECK_THROWS_AS(Visibility::available(IndexArray({2, 3}, {0, -1, 2, 0, 1, 2}), tm), ValueError);
  CHECK_THROWS_WITH(Visibility::available(IndexArray({2, 3}, {0, -1, 2, 0, 1, 2}), tm),
                    Catch::Contains("available(arrival, query_time)") && Catch::Contains("-1") &&
                        Catch::Contains("(0, 1)"));
  CHECK_THROWS_WITH(Visibility::available(arr, IndexArray({2, 2}, {0, 1, -5, 3})),
                    Catch::Contains("available(arrival, query_time)") && Catch::Contains("query times") &&
                        Catch::Contains("-5"));
  CHECK_THROWS_AS(Visibility::available(arr, IndexArray({3, 2}, {0, 1, 2, 3, 4, 5})), ShapeError);
  CHECK_THROWS_WITH(Visibility::available(arr, IndexArray({3, 2}, {0, 1, 2, 3, 4, 5})),
                    Catch::Contains("available(arrival, query_time)") && Catch::Contains("(2, 3)") &&
                        Catch::Contains("(3, 2)"));
  CHECK_THROWS_WITH(Visibility::available(IndexArray({1, 2, 3}, {0, 1, 2, 0, 1, 2}), tm),
                    Catch::Contains("available(arrival, query_time)") && Catch::Contains("arrival must be"));
  CHECK_THROWS_WITH(Visibility::available(arr, IndexArray({1, 1, 2}, {0, 1})),
                    Catch::Contains("available(arrival, query_time)") && Catch::Contains("query_time must be"));
  // A shape that does not broadcast to the scores is the attention op's ShapeError.
  const Tensor Q(Array::zeros({2, 1, 3, 2}, DType::float64)), K(Array::zeros({2, 1, 3, 2}, DType::float64));
  CHECK_THROWS_AS(attention(Q, K, K, Visibility::available(arr, tm)), ShapeError);
  // A valid query with no source position yet is an empty row: VisibilityError (SPEC 3.8).
  const Tensor Q2(Array::zeros({2, 1, 2, 2}, DType::float64));
  CHECK_THROWS_AS(attention(Q2, K, K, Visibility::available(IndexArray({2, 3}, {1, 1, 2, 0, 1, 2}), tm)),
                  VisibilityError);
}

TEST_CASE("attention reference: the allowed sets from their definitions and their size errors", "[attention][properties][reference]") {
  // (5.12) bottom-right causal with T = 2, S = 3 (queries at 1, 2), key padding 2 for sample 1.
  checks::reference::AllowedSets a;
  a.causal = true;
  a.key_lengths = {3, 2};
  const auto got = checks::reference::allowed_sets(a, 2, 1, 2, 3);
  CHECK(got == std::vector<unsigned char>{1, 1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 0});
  CHECK(got == (Visibility::causal(2, 3) & Visibility::key_lengths({3, 2}, 3)).expand_allowed("test", {2, 1, 2, 3}));
  checks::reference::AllowedSets bad;
  bad.key_lengths = {1, 2, 3};
  CHECK_THROWS_WITH(checks::reference::allowed_sets(bad, 2, 1, 2, 3), Catch::Contains("key_lengths") && Catch::Contains("3 entries"));
  checks::reference::AllowedSets half;
  half.q_doc = {0, 0};
  CHECK_THROWS_AS(checks::reference::allowed_sets(half, 1, 1, 2, 3), ShapeError);
}
