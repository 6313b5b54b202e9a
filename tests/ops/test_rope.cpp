// The RoPE op (ops/rope.hpp): values written out from the published definition (Su et al.
// 2021), both layouts and a partial rotation, the VJP's gradcheck, the rotation's invariants,
// bad input, and the packed-heads form rope_heads. RoPE inside attention and the GPT:
// tests/nn/attention/test_positions.cpp.
#include <cmath>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;
using ops::RopeConfig;
using ops::RopeLayout;

namespace {

RopeConfig rope_cfg(RopeLayout layout, double fraction = 1.0, double base = 10000.0) {
  RopeConfig c;
  c.layout = layout;
  c.fraction = fraction;
  c.base = base;
  return c;
}

double dot_rows(const Array& a, std::size_t ia, const Array& b, std::size_t ib, std::size_t d) {
  double s = 0;
  for (std::size_t j = 0; j < d; ++j) s += a.flat(ia * d + j) * b.flat(ib * d + j);
  return s;
}

}  // namespace

TEST_CASE("rope: hand-computed values for both layouts and a partial rotation", "[ops][rope]") {
  // d = 2 at position 1, base 10000: theta_0 = 1 * 10000^0 = 1 rad, so [1, 0] -> [cos 1, sin 1].
  const Array y2 = ops::rope(Tensor(Array::of({{1.0, 0.0}}, DType::float64)), {1}).value();
  CHECK(std::abs(y2.flat(0) - 0.5403023058681398) < 1e-15);
  CHECK(std::abs(y2.flat(1) - 0.8414709848078965) < 1e-15);
  // d = 4 at position 1: theta_0 = 1, theta_1 = 10000^(-2/4) = 0.01.
  const Tensor x(Array::of({{1.0, 2.0, 3.0, 4.0}}, DType::float64));
  const double c1 = std::cos(1.0), s1 = std::sin(1.0), c2 = std::cos(0.01), s2 = std::sin(0.01);
  const Array yi = ops::rope(x, {1}, rope_cfg(RopeLayout::interleaved)).value();  // pairs (0,1), (2,3)
  const double want_i[] = {c1 - 2 * s1, s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2};
  const Array yh = ops::rope(x, {1}, rope_cfg(RopeLayout::half_split)).value();  // pairs (0,2), (1,3)
  const double want_h[] = {c1 - 3 * s1, 2 * c2 - 4 * s2, s1 + 3 * c1, 2 * s2 + 4 * c2};
  // fraction 0.5: r = 2, only the pair (0, 1) turns, by theta = 1 (the frequency uses r, not d).
  const Array yp = ops::rope(x, {1}, rope_cfg(RopeLayout::interleaved, 0.5)).value();
  const double want_p[] = {c1 - 2 * s1, s1 + 2 * c1, 3, 4};
  for (std::size_t j = 0; j < 4; ++j) {
    CHECK(std::abs(yi.flat(j) - want_i[j]) < 1e-14);
    CHECK(std::abs(yh.flat(j) - want_h[j]) < 1e-14);
    CHECK(std::abs(yp.flat(j) - want_p[j]) < 1e-14);
  }
  // Position 0 is the identity; float32 goes through the same code.
  XGT_CHECK_SAME(ops::rope(x, {0}).value(), x.value());  // cos 0 = 1, sin 0 = 0: exact
  const Array y32 = ops::rope(Tensor(x.value().astype(DType::float32)), {1}).value();
  CHECK(y32.dtype() == DType::float32);
  CHECK(std::abs(y32.flat(0) - want_i[0]) < 1e-6);
}

TEST_CASE("rope: VJP passes gradcheck for both layouts plus partial fractions and arbitrary positions",
          "[ops][rope][gradcheck]") {
  Generator g(11);
  for (const RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half_split})
    for (const double fraction : {1.0, 0.75, 0.5}) {
      INFO(ops::rope_layout_name(layout) << " fraction " << fraction);
      const RopeConfig cfg = rope_cfg(layout, fraction, 100.0);
      require_gradcheck([&](const std::vector<Tensor>& in) { return ops::rope(in[0], {0, 3, 7}, cfg); },
                        {rnd({2, 2, 3, 6}, g)}, {"x"});
    }
}

TEST_CASE("rope: preserves norms and q.k depends only on the relative position", "[ops][rope]") {
  Generator g(12);
  for (const RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half_split}) {
    const RopeConfig cfg = rope_cfg(layout);
    const Array q = rnd({1, 8}, g), k = rnd({1, 8}, g);
    for (std::int64_t p : {0, 1, 5, 1000}) {
      const Array qr = ops::rope(Tensor(q), {p}, cfg).value();
      CHECK(std::abs(dot_rows(qr, 0, qr, 0, 8) - dot_rows(q, 0, q, 0, 8)) < 1e-12);
    }
    // (R_p q) . (R_s k) for (p, s) = (3, 1), (10, 8), (1003, 1001): all the same (s - p = -2).
    auto score = [&](std::int64_t p, std::int64_t s) {
      return dot_rows(ops::rope(Tensor(q), {p}, cfg).value(), 0, ops::rope(Tensor(k), {s}, cfg).value(), 0, 8);
    };
    const double ref = score(3, 1);
    CHECK(std::abs(score(10, 8) - ref) < 1e-11);
    CHECK(std::abs(score(1003, 1001) - ref) < 1e-11);
    CHECK(std::abs(score(3, 2) - ref) > 1e-6);  // another distance gives another score
  }
}

TEST_CASE("rope: bad configuration and positions are errors naming the op and the values", "[ops][rope][errors]") {
  const Tensor x(Array::zeros({1, 3, 4}, DType::float64));
  CHECK_THROWS_WITH(ops::rope(x, {0, 1}), Catch::Contains("[rope]") && Catch::Contains("positions has 2 entries"));
  CHECK_THROWS_AS(ops::rope(x, {0, 1}), ShapeError);
  CHECK_THROWS_WITH(ops::rope(x, {0, -1, 2}), Catch::Contains("position 1 is -1"));
  CHECK_THROWS_WITH(ops::rope(x, {0, 1, 2}, rope_cfg(RopeLayout::interleaved, 0.0)),
                    Catch::Contains("fraction must be in (0, 1]"));
  CHECK_THROWS_WITH(ops::rope(x, {0, 1, 2}, rope_cfg(RopeLayout::interleaved, 1.5)),
                    Catch::Contains("fraction must be in (0, 1], got 1.5"));
  CHECK_THROWS_WITH(ops::rope(x, {0, 1, 2}, rope_cfg(RopeLayout::interleaved, 1.0, 1.0)),
                    Catch::Contains("base must be finite and > 1"));
  CHECK_THROWS_WITH(ops::rope(x, {0, 1, 2}, rope_cfg(RopeLayout::interleaved, 0.25)),
                    Catch::Contains("= 0 features") && Catch::Contains("head width d = 4"));
  CHECK_THROWS_AS(ops::rope(Tensor(Array::zeros({3}, DType::float64)), {0}), ShapeError);
  CHECK_THROWS_AS(ops::rope_layout_from_name("neox"), ValueError);
  // Odd widths rotate the largest even number of features and pass the last one through.
  const Tensor odd(Array::of({{1.0, 0.0, 7.0}}, DType::float64));
  CHECK(ops::rope(odd, {1}).value().flat(2) == 7.0);
}

TEST_CASE("rope_heads: packed heads rotate bit for bit as rope on each head split out", "[ops][rope]") {
  // x [B, T, w] = [3 rotated heads of width d | 2 more columns passed through], both layouts,
  // a partial fraction, both dtypes; forward and VJP against rope() on each head's slice.
  Generator g(12);
  const std::size_t B = 2, T = 5, d = 6, heads = 3, w = heads * d + 2;
  const std::vector<std::int64_t> pos = {4, 0, 9, 2, 2};
  for (const DType dt : {DType::float32, DType::float64})
    for (const RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half_split})
      for (const double fraction : {1.0, 0.7}) {
        INFO(dtype_name(dt) << ", " << ops::rope_layout_name(layout) << ", fraction " << fraction);
        const ops::RopeConfig cfg = rope_cfg(layout, fraction);
        const Tensor x(rnd({B, T, w}, g).astype(dt), true);
        const Array G = rnd({B, T, w}, g).astype(dt);
        const Tensor packed = ops::rope_heads(x, heads, d, pos, cfg);
        const Array dx_packed = grad(packed, {x}, G)[0];
        std::vector<Tensor> parts;
        for (const Tensor& part : ops::split(x, {d, d, d, 2}, -1))
          parts.push_back(parts.size() < heads ? ops::rope(part, pos, cfg) : part);
        const Tensor split = ops::concat(parts, -1);
        const Array dx_split = grad(split, {x}, G)[0];
        // Elementwise: the same multiplications on each element, only addressed another way.
        XGT_CHECK_SAME(packed.value(), split.value());
        XGT_CHECK_SAME(dx_packed, dx_split);
        CHECK(max_abs_diff(packed.value(), x.value()) > 0.0);  // it did rotate
        // the passed-through columns are x's own
        for (std::size_t row = 0; row < B * T; ++row)
          for (std::size_t j = heads * d; j < w; ++j)
            CHECK(packed.value().flat(row * w + j) == x.value().flat(row * w + j));
      }
  const Tensor x(Array::zeros({1, 3, 8}, DType::float64));
  CHECK_THROWS_WITH(ops::rope_heads(x, 3, 4, {0, 1, 2}),
                    Catch::Contains("[rope]") && Catch::Contains("3 heads of width 4") && Catch::Contains("(1, 3, 8)"));
  CHECK_THROWS_AS(ops::rope_heads(x, 0, 4, {0, 1, 2}), ShapeError);
  CHECK_THROWS_AS(ops::rope_heads(x, 2, 0, {0, 1, 2}), ShapeError);
  CHECK_THROWS_WITH(ops::rope_heads(x, 2, 4, {0, 1}), Catch::Contains("positions has 2 entries"));
}
