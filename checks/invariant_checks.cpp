// The spec's invariants as checks of an attention core (SPEC 3, 5, 9, 12, (5.36)). Each
// measures something a finite-difference check cannot see: exact zeros (forbidden
// positions, invalid rows), bit-identical prefixes, the head-to-group map. Exact properties
// have tolerance 0; the others a rounding bound gamma_n = n u (u = unit roundoff of the
// run's dtype) times a safety factor, stated where it is used. Every check also verifies
// that it is not vacuous (the perturbation changed something, the negative control differs).
#include <cmath>
#include <numeric>
#include <sstream>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/detail/common.hpp>

namespace xg::checks {

namespace {

// A property check that failed because it could not have failed (nothing was compared).
CheckResult vacuous(const std::string& why) {
  CheckResult r;
  r.passed = false;
  r.mode = "property";
  r.max_abs_error = 0;
  r.worst = "-";
  r.message = "vacuous: " + why;
  return r;
}

// (5.25): sum_j D_ij = 0. D is internal to the core, so it is observed from outside: append
// a constant coordinate, q_i -> (q_i, 1), k_j -> (k_j, c). Scores shift by scale * c per row,
// which softmax ignores, and dL/dq_{i,extra} = scale * c * sum_j D_ij. Each D_ij carries a
// relative rounding error ~u, so |sum_j D_ij| <~ S u max|D|; measured against the other
// columns of Q_bar (which are ~ S max|D| |k| scale), the bound is 64 S u with a safety factor.
CheckResult rows_sum_zero(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t B = 2, H_q = 4, H_kv = 2, T = ctx.pick(5, 12), S = ctx.pick(6, 14), d = 3, dv = 2;
  const double c = 1.7, scale = 1.0 / std::sqrt(double(d));
  const nn::Visibility vis = causal_and_random({B, H_q, T, S}, ctx.gen(), 0.7);
  const Array Qa = ctx.uniform({B, H_q, T, d}, -2, 2), Ka = ctx.uniform({B, H_kv, S, d}, -2, 2);
  const Tensor Q(ops::concat({Tensor(Qa), Tensor(ctx.cast(Array::full({B, H_q, T, 1}, 1.0, DType::float64)))}, 3).value(),
                 true);
  const Tensor K(ops::concat({Tensor(Ka), Tensor(ctx.cast(Array::full({B, H_kv, S, 1}, c, DType::float64)))}, 3).value(),
                 true);
  const Tensor V(ctx.uniform({B, H_kv, S, dv}), true);
  nn::SdpaOptions o;
  o.scale = scale;
  const Tensor O = attn(Q, K, V, vis, o);
  const Array Q_bar = grad(O, {Q}, ctx.uniform(O.shape()))[0];
  double extra = 0, others = 0;
  std::size_t worst_row = 0;
  for (std::size_t r = 0; r < B * H_q * T; ++r) {
    const double e = std::fabs(Q_bar.flat(r * (d + 1) + d));
    if (!(e <= extra)) {
      extra = e;
      worst_row = r;
    }
    for (std::size_t k = 0; k < d; ++k) others = std::max(others, std::fabs(Q_bar.flat(r * (d + 1) + k)));
  }
  if (!(others > 0)) return vacuous("Q_bar is zero everywhere; no score gradient was exercised");
  const auto idx = unravel_index(worst_row, {B, H_q, T});
  const double rel = extra / others;
  CheckResult r = CheckResult::property(
      rel, 64.0 * double(S) * unit_roundoff(ctx.dtype()),
      "Q_bar[" + index_list({idx[0], idx[1], idx[2], d}) + "]",
      "score-gradient row sum |scale c sum_j D_ij| relative to max |Q_bar|", rel);
  r.max_abs_error = extra;
  return r;
}

// SPEC 3.1, 9: for every query (b, h, i), a cotangent on its output row alone must send
// exactly zero gradient to the keys and values it may not see. One backward pass per query.
CheckResult forbidden_zero(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t B = 2, H_q = 4, H_kv = 2, T = ctx.pick(4, 8), S = ctx.pick(6, 12), d = 3, dv = 2, r = H_q / H_kv;
  const BoolArray mask = random_allowed({B, H_q, T, S}, ctx.gen(), 0.5);
  const nn::Visibility vis = nn::Visibility::allowed(mask) & nn::Visibility::key_lengths({pos(S), pos(S - 2)}, pos(S));
  const auto allowed = vis.expand_allowed("gradcheck", {B, H_q, T, S});
  // Repair rows that key padding emptied: key 0 is never padded.
  BoolArray fixed = BoolArray({B, H_q, T, S}, allowed);
  for (std::size_t row = 0; row < B * H_q * T; ++row) {
    bool any = false;
    for (std::size_t j = 0; j < S; ++j) any = any || fixed.data[row * S + j];
    if (!any) fixed.data[row * S] = 1;
  }
  const nn::Visibility v2 = nn::Visibility::allowed(fixed);
  const Tensor Q(ctx.uniform({B, H_q, T, d}, -2, 2), true), K(ctx.uniform({B, H_kv, S, d}, -2, 2), true),
      V(ctx.uniform({B, H_kv, S, dv}), true);
  const Tensor O = attn(Q, K, V, v2, {});
  double worst = 0;
  std::string where;
  std::size_t forbidden = 0;
  BackwardOptions keep;
  keep.retain_graph = true;
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H_q; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        Array G = Array::zeros(O.shape(), ctx.dtype());
        for (std::size_t k = 0; k < dv; ++k) G.set_flat(((b * H_q + h) * T + i) * dv + k, 0.5 + ctx.gen().uniform());
        const auto g = grad(O, {K, V}, G, keep);
        const std::size_t kv = h / r;
        for (std::size_t j = 0; j < S; ++j) {
          if (fixed.data[((b * H_q + h) * T + i) * S + j]) continue;
          ++forbidden;
          for (std::size_t k = 0; k < d; ++k) {
            const double e = std::fabs(g[0].flat(((b * H_kv + kv) * S + j) * d + k));
            if (!(e <= worst)) {
              worst = e;
              where = "K_bar[" + index_list({b, kv, j, k}) + "] for query (" + index_list({b, h, i}) + ")";
            }
          }
          for (std::size_t k = 0; k < dv; ++k) {
            const double e = std::fabs(g[1].flat(((b * H_kv + kv) * S + j) * dv + k));
            if (!(e <= worst)) {
              worst = e;
              where = "V_bar[" + index_list({b, kv, j, k}) + "] for query (" + index_list({b, h, i}) + ")";
            }
          }
        }
      }
  if (forbidden == 0) return vacuous("the random mask forbade nothing");
  return CheckResult::property(worst, 0.0, worst > 0 ? where : "",
                               "largest |gradient| of a key or value forbidden to the query whose output row carries "
                               "the cotangent (" + std::to_string(forbidden) + " forbidden pairs); must be exactly 0");
}

// SPEC 3.8, Algorithm 5.1: a left-padded causal batch; the pad queries are invalid and see no
// key. Their output rows are exactly zero, a cotangent on them alone sends exactly zero
// gradient anywhere, and with a random cotangent every gradient is finite and equal to the
// one with their cotangent removed (to rounding: 8 u max|grad|).
CheckResult invalid_rows(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t B = 2, H = 2, T = ctx.pick(4, 10), d = 3, dv = 2;
  std::vector<unsigned char> real_v(B * T, 1);
  for (std::size_t i = 0; i < T / 2; ++i) real_v[T + i] = 0;
  const BoolArray real({B, T}, real_v);
  const nn::Visibility vis = nn::Visibility::causal(T, T) & nn::Visibility::valid_keys(real);
  const nn::SdpaOptions o{std::nullopt, real};
  const Array Qa = ctx.uniform({B, H, T, d}, -2, 2), Ka = ctx.uniform({B, H, T, d}, -2, 2), Va = ctx.uniform({B, H, T, dv});
  auto invalid = [&](std::size_t b, std::size_t i) { return !real.data[b * T + i]; };
  std::vector<CheckResult> parts;

  const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
  const Tensor O = attn(Q, K, V, vis, o);
  {
    Diff dz;
    bool finite = O.value().all_finite();
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H; ++h)
        for (std::size_t i = 0; i < T; ++i)
          if (invalid(b, i))
            for (std::size_t k = 0; k < dv; ++k) {
              const double e = std::fabs(O.value().flat(((b * H + h) * T + i) * dv + k));
              if (std::isnan(e) || e > dz.max) {
                dz.max = std::isnan(e) ? INFINITY : e;
                dz.where = "O[" + index_list({b, h, i, k}) + "]";
              }
            }
    parts.push_back(CheckResult::property(finite ? dz.max : INFINITY, 0.0, dz.max > 0 || !finite ? dz.where : "",
                                          "invalid queries' output rows must be exactly 0 and finite"));
  }
  Array G_inv = Array::zeros(O.shape(), ctx.dtype());
  const Array G = ctx.uniform(O.shape());
  Array G_valid = G.clone();
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i)
        if (invalid(b, i))
          for (std::size_t k = 0; k < dv; ++k) {
            const std::size_t at = ((b * H + h) * T + i) * dv + k;
            G_inv.set_flat(at, 0.5 + ctx.gen().uniform());
            G_valid.set_flat(at, 0.0);
          }
  {
    const Tensor Q1(Qa, true), K1(Ka, true), V1(Va, true);
    const auto g = grad(attn(Q1, K1, V1, vis, o), {Q1, K1, V1}, G_inv);
    Diff dz = max_abs(g[0], "Q_bar");
    dz.merge(max_abs(g[1], "K_bar"));
    dz.merge(max_abs(g[2], "V_bar"));
    parts.push_back(CheckResult::property(dz.max, 0.0, dz.max > 0 ? dz.where : "",
                                          "a cotangent on invalid rows only must send exactly 0 to Q, K and V"));
  }
  {
    const Tensor Q1(Qa, true), K1(Ka, true), V1(Va, true), Q2(Qa, true), K2(Ka, true), V2(Va, true);
    const auto g1 = grad(attn(Q1, K1, V1, vis, o), {Q1, K1, V1}, G);
    const auto g2 = grad(attn(Q2, K2, V2, vis, o), {Q2, K2, V2}, G_valid);
    Diff dd = max_diff(g1[0], g2[0], "Q_bar");
    dd.merge(max_diff(g1[1], g2[1], "K_bar"));
    dd.merge(max_diff(g1[2], g2[2], "V_bar"));
    double scale = 0;
    for (const Array& a : g2) scale = std::max(scale, max_abs_value(a));
    parts.push_back(CheckResult::property(dd.max, 8 * unit_roundoff(ctx.dtype()) * scale, dd.where,
                                          "random cotangent: gradients equal those without the invalid rows' cotangent"));
  }
  return CheckResult::combine(parts);
}

// SPEC 9: a query with exactly one visible key has weight 1 there and every score gradient
// 0: with a cotangent on its row alone, Q_bar and K_bar are exactly 0 and V_bar at that key
// is exactly its cotangent row.
CheckResult one_visible_key(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t T = 4, S = 5, d = 3, dv = 2;
  BoolArray mask = random_allowed({T, S}, ctx.gen(), 0.7);
  for (std::size_t j = 0; j < S; ++j) mask.data[j] = (j == 2);  // query 0 sees key 2 only
  const nn::Visibility vis = nn::Visibility::allowed(mask);
  const Tensor Q(ctx.uniform({1, 1, T, d}), true), K(ctx.uniform({1, 1, S, d}), true), V(ctx.uniform({1, 1, S, dv}), true);
  Array G = Array::zeros({1, 1, T, dv}, ctx.dtype());
  G.set_flat(0, 0.7);
  G.set_flat(1, -1.3);
  const auto g = grad(attn(Q, K, V, vis, {}), {Q, K, V}, G);
  Diff dz = max_abs(g[0], "Q_bar");
  dz.merge(max_abs(g[1], "K_bar"));
  Array V_expected = Array::zeros({1, 1, S, dv}, ctx.dtype());
  V_expected.set_flat(2 * dv, G.flat(0));
  V_expected.set_flat(2 * dv + 1, G.flat(1));
  dz.merge(max_diff(g[2], V_expected, "V_bar"));
  return CheckResult::property(dz.max, 0.0, dz.max > 0 ? dz.where : "",
                               "one visible key: Q_bar = K_bar = 0 and V_bar = G at that key, exactly");
}

// SPEC 12: when every value row is the same v, any normalised weights give o_i = v, under
// any mask. Rounding: a convex combination of S equal numbers is v to within S u |v|; bound 4 S u |v|.
CheckResult equal_values(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t B = 1, H = 2, T = 4, S = 5, d = 3, dv = 2;
  const Tensor Q(ctx.uniform({B, H, T, d}, -3, 3)), K(ctx.uniform({B, H, S, d}, -3, 3));
  const Array v = ctx.uniform({B, H, 1, dv}, -5, 5);
  const Tensor V = ops::broadcast_to(Tensor(v), {B, H, S, dv});
  Array soft = Array::empty({T, S}, DType::float64);
  for (std::size_t k = 0; k < soft.size(); ++k) soft.set_flat(k, -4 * ctx.gen().uniform());
  soft.set_flat(1 * S + 3, -INFINITY);
  const std::vector<std::pair<std::string, nn::Visibility>> masks = {
      {"no mask", nn::Visibility::all()},
      {"causal", nn::Visibility::causal(T, S)},
      {"random", nn::Visibility::allowed(random_allowed({B, H, T, S}, ctx.gen()))},
      {"soft bias", nn::Visibility::additive(soft)}};
  const Array expected = ops::broadcast_to(Tensor(v), {B, H, T, dv}).value();
  const double tol = 4.0 * S * unit_roundoff(ctx.dtype()) * max_abs_value(v);
  std::vector<CheckResult> parts;
  for (const auto& [name, vis] : masks) {
    const Diff dd = max_diff(attn(Q, K, V, vis, {}).value(), expected, "O");
    parts.push_back(CheckResult::property(dd.max, tol, dd.where + " (" + name + ")", "equal values give o_i = v"));
  }
  return CheckResult::combine(parts);
}

// SPEC 5: through a 3-layer causal residual stack whose only cross-position operation is the
// attention core, output i depends on x_{<= i} only: perturbing position k leaves rows < k
// bit-identical (tolerance 0), and must change row k (else the check proves nothing).
CheckResult prefix_isolation(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t T = ctx.pick(6, 12), dm = 8, H = 2, L = 3;
  struct Layer {
    Tensor W_q, W_k, W_v, W_o;
  };
  std::vector<Layer> layers;
  const double s = 1.0 / std::sqrt(double(dm));
  for (std::size_t l = 0; l < L; ++l)
    layers.push_back({Tensor(ctx.uniform({dm, dm}, -s, s)), Tensor(ctx.uniform({dm, dm}, -s, s)),
                      Tensor(ctx.uniform({dm, dm}, -s, s)), Tensor(ctx.uniform({dm, dm}, -s, s))});
  auto stack = [&](const Array& x0) {
    NoGradGuard ng;
    Tensor x(x0);
    for (const Layer& w : layers) {
      const Tensor O = attn(nn::split_heads(ops::matmul(x, w.W_q), H), nn::split_heads(ops::matmul(x, w.W_k), H),
                            nn::split_heads(ops::matmul(x, w.W_v), H), nn::Visibility::causal(T, T), {});
      x = x + ops::matmul(nn::merge_heads(O), w.W_o);
    }
    return x.value();
  };
  const Array X = ctx.uniform({1, T, dm});
  const Array Y = stack(X);
  double leak = 0, min_change = INFINITY;
  std::string where, quiet;
  for (std::size_t k = 0; k < T; ++k) {
    Array Xk = X.clone();
    for (std::size_t c = 0; c < dm; ++c) Xk.set_flat(k * dm + c, Xk.flat(k * dm + c) + 0.5 + ctx.gen().uniform());
    const Array Yk = stack(Xk);
    for (std::size_t i = 0; i < k; ++i)
      for (std::size_t c = 0; c < dm; ++c) {
        const double e = std::fabs(Y.flat(i * dm + c) - Yk.flat(i * dm + c));
        if (!(e <= leak)) {
          leak = std::isnan(e) ? INFINITY : e;
          where = "Y[0, " + std::to_string(i) + ", " + std::to_string(c) + "] after perturbing x_" + std::to_string(k);
        }
      }
    double change = 0;
    for (std::size_t c = 0; c < dm; ++c) change = std::max(change, std::fabs(Y.flat(k * dm + c) - Yk.flat(k * dm + c)));
    if (change < min_change) {
      min_change = change;
      quiet = "position " + std::to_string(k);
    }
  }
  if (!(min_change > 1e-6)) return vacuous("perturbing " + quiet + " did not change its own output");
  return CheckResult::property(leak, 0.0, leak > 0 ? where : "",
                               "outputs before the perturbed position must be bit-identical (causal prefix isolation)");
}

// (5.37)-(5.41): F(P Q, P K, P V; P M P^T) = P F(Q, K, V; M) for self-attention, outputs
// and gradients (cotangent P G), with GQA heads and a random per-head mask. The permuted
// run sums in another order: relative bound 64 (S + d) u. Negative control: the causal mask
// is not permutation-invariant, so with it fixed the property must visibly fail.
CheckResult permutation_equivariance(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t B = 1, H_q = 4, H_kv = 2, T = ctx.pick(5, 11), d = 3, dv = 2;
  const BoolArray M = random_allowed({B, H_q, T, T}, ctx.gen(), 0.5);
  std::vector<std::int64_t> pi(T);
  std::iota(pi.begin(), pi.end(), 0);
  while (true) {  // a random permutation that moves something
    for (std::size_t i = T; i-- > 1;) std::swap(pi[i], pi[ctx.gen().below(i + 1)]);
    bool moved = false;
    for (std::size_t i = 0; i < T; ++i) moved = moved || pi[i] != static_cast<std::int64_t>(i);
    if (moved) break;
  }
  const IndexArray P(Shape{T}, pi);
  BoolArray M_perm = BoolArray::filled(M.shape, false);  // (P M P^T)_ij = M_{pi(i) pi(j)}
  for (std::size_t h = 0; h < H_q; ++h)
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t j = 0; j < T; ++j) M_perm.data[(h * T + i) * T + j] = M.data[(h * T + pi[i]) * T + pi[j]];
  const Array Qa = ctx.uniform({B, H_q, T, d}, -2, 2), Ka = ctx.uniform({B, H_kv, T, d}, -2, 2),
              Va = ctx.uniform({B, H_kv, T, dv}, -2, 2), G = ctx.uniform({B, H_q, T, dv});
  auto perm = [&](const Array& a) { return ops::index_select(Tensor(a), 2, P).value(); };

  const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
  const Tensor O = attn(Q, K, V, nn::Visibility::allowed(M), {});
  const auto g = grad(O, {Q, K, V}, G);
  const Tensor Qp(perm(Qa), true), Kp(perm(Ka), true), Vp(perm(Va), true);
  const Tensor Op = attn(Qp, Kp, Vp, nn::Visibility::allowed(M_perm), {});
  const auto gp = grad(Op, {Qp, Kp, Vp}, perm(G));
  Diff dd = max_diff(Op.value(), perm(O.value()), "O");
  dd.merge(max_diff(gp[0], perm(g[0]), "Q_bar"));
  dd.merge(max_diff(gp[1], perm(g[1]), "K_bar"));
  dd.merge(max_diff(gp[2], perm(g[2]), "V_bar"));
  double scale = max_abs_value(O.value());
  for (const Array& a : g) scale = std::max(scale, max_abs_value(a));

  NoGradGuard ng;
  const Array Oc = attn(Tensor(Qa), Tensor(Ka), Tensor(Va), nn::Visibility::causal(T, T), {}).value();
  const Array Oc_perm = attn(Tensor(perm(Qa)), Tensor(perm(Ka)), Tensor(perm(Va)), nn::Visibility::causal(T, T), {}).value();
  if (!(max_diff(Oc_perm, perm(Oc), "O").max > 1e-3))
    return vacuous("the negative control (a fixed causal mask) did not break equivariance");
  const double rel = scale > 0 ? dd.max / scale : dd.max;
  CheckResult r = CheckResult::property(rel, 64.0 * double(T + d) * unit_roundoff(ctx.dtype()), dd.where,
                                        "F(PX; P M P^T) - P F(X; M), outputs and gradients, relative to their size", rel);
  r.max_abs_error = dd.max;
  return r;
}

// (5.36): query head h reads kv head floor(h / r), not h % H_kv. The kv heads' values are far
// apart (near +10 and -10), so a wrong map moves outputs by ~20. The grouped call must equal
// per-head single calls, outputs and gradients; K_bar, V_bar of a kv head sum over its group.
// Relative bound 64 (S + d) u (the grouped GEMMs sum in another order).
CheckResult gqa_mapping(CheckContext& ctx, const AttentionFn& attn) {
  const std::size_t H_q = 4, H_kv = 2, r = H_q / H_kv, T = 5, S = 6, d = 4, dv = 3;
  const Array Qa = ctx.uniform({1, H_q, T, d});
  Array Ka = ctx.uniform({1, H_kv, S, d}), Va = ctx.uniform({1, H_kv, S, dv}).astype(DType::float64);
  for (std::size_t i = 0; i < Va.size(); ++i) Va.set_flat(i, Va.flat(i) + (i < Va.size() / 2 ? 10.0 : -10.0));
  Va = ctx.cast(Va);
  const BoolArray mask = random_allowed({1, H_q, T, S}, ctx.gen());  // per QUERY head
  const Array G = ctx.uniform({1, H_q, T, dv});
  const Tensor Q(Qa, true), K(Ka, true), V(Va, true);
  const Tensor O = attn(Q, K, V, nn::Visibility::allowed(mask), {});
  const auto g = grad(O, {Q, K, V}, G);
  auto head_mask = [&](std::size_t h) {
    return nn::Visibility::allowed(BoolArray(
        {T, S}, std::vector<unsigned char>(mask.data.begin() + h * T * S, mask.data.begin() + (h + 1) * T * S)));
  };
  std::vector<Tensor> outs, q_bars;
  std::vector<Array> k_sum(H_kv, Array::zeros({1, 1, S, d}, ctx.dtype())), v_sum(H_kv, Array::zeros({1, 1, S, dv}, ctx.dtype()));
  for (std::size_t h = 0; h < H_q; ++h) {
    const std::size_t kv = h / r;
    const Tensor Qh(head(Tensor(Qa), h).value(), true), Kh(head(Tensor(Ka), kv).value(), true),
        Vh(head(Tensor(Va), kv).value(), true);
    const Tensor Oh = attn(Qh, Kh, Vh, head_mask(h), {});
    const auto gh = grad(Oh, {Qh, Kh, Vh}, head(Tensor(G), h).value());
    outs.push_back(Tensor(Oh.value()));
    q_bars.push_back(Tensor(gh[0]));
    k_sum[kv] = (Tensor(k_sum[kv]) + Tensor(gh[1])).value();
    v_sum[kv] = (Tensor(v_sum[kv]) + Tensor(gh[2])).value();
  }
  std::vector<Tensor> ks, vs;
  for (std::size_t kv = 0; kv < H_kv; ++kv) {
    ks.push_back(Tensor(k_sum[kv]));
    vs.push_back(Tensor(v_sum[kv]));
  }
  Diff dd = max_diff(O.value(), ops::concat(outs, 1).value(), "O");
  dd.merge(max_diff(g[0], ops::concat(q_bars, 1).value(), "Q_bar"));
  dd.merge(max_diff(g[1], ops::concat(ks, 1).value(), "K_bar"));
  dd.merge(max_diff(g[2], ops::concat(vs, 1).value(), "V_bar"));
  double scale = max_abs_value(O.value());
  for (const Array& a : g) scale = std::max(scale, max_abs_value(a));
  const double rel = scale > 0 ? dd.max / scale : dd.max;
  CheckResult res = CheckResult::property(rel, 64.0 * double(S + d) * unit_roundoff(ctx.dtype()), dd.where,
                                          "grouped call vs per-head calls with g(h) = floor(h / r), relative", rel);
  res.max_abs_error = dd.max;
  return res;
}

}  // namespace

void register_attention_invariant_checks(GradcheckSuite& s, const std::string& prefix, AttentionFn attn) {
  const auto add = [&](const std::string& name, const std::string& config,
                       CheckResult (*fn)(CheckContext&, const AttentionFn&)) {
    s.add(prefix + "/invariant-" + name, "invariant", config, [attn, fn](CheckContext& ctx) { return fn(ctx, attn); });
  };
  add("rows-sum-zero", "(5.25) score-gradient rows sum to 0; GQA, causal & random mask", rows_sum_zero);
  add("forbidden-zero-grad", "forbidden keys get exactly 0 gradient, per query; random mask & key padding, GQA",
      forbidden_zero);
  add("invalid-rows", "invalid queries: zero rows, zero and finite gradients (SPEC 3.8); left-padded causal",
      invalid_rows);
  add("one-visible-key", "one visible key: weight 1, zero score gradient, V_bar = G (SPEC 9)", one_visible_key);
  add("equal-values", "equal values make weights irrelevant (SPEC 12); 4 masks", equal_values);
  add("prefix-isolation", "3-layer causal stack: output i depends on x_<=i only, bit for bit (SPEC 5)",
      prefix_isolation);
  add("permutation", "F(PX; P M P^T) = P F(X; M), outputs and gradients, GQA (5.37)-(5.41)",
      permutation_equivariance);
  add("gqa-head-mapping", "query head h reads kv head floor(h/r); group-summed kv gradients (5.36)", gqa_mapping);
}

}  // namespace xg::checks
