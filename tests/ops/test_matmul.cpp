// matmul on BLAS: values against a naive triple loop, broadcasting, transpose flags, 1-d
// operands, and gradchecks for each configuration.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

// Reference: out[b, i, j] = sum_k A[b, i, k] B[b, k, j] on explicit broadcast copies.
Array naive_matmul(const Array& a, const Array& b) {
  const Shape& sa = a.shape();
  const Shape& sb = b.shape();
  const std::size_t M = sa[sa.size() - 2], K = sa.back(), N = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  Shape batch = broadcast_shapes("ref", "a", ba, "b", bb);
  Shape fa = batch, fb = batch, out = batch;
  fa.insert(fa.end(), {M, K});
  fb.insert(fb.end(), {K, N});
  out.insert(out.end(), {M, N});
  const Array A = ops::broadcast_to(Tensor(a), fa).value(), B = ops::broadcast_to(Tensor(b), fb).value();
  Array C = Array::zeros(out, DType::float64);
  for (std::size_t n = 0; n < numel(batch); ++n)
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) {
        double s = 0;
        for (std::size_t k = 0; k < K; ++k) s += A.flat(n * M * K + i * K + k) * B.flat(n * K * N + k * N + j);
        C.set_flat(n * M * N + i * N + j, s);
      }
  return C;
}

struct Case {
  Shape a, b;
};
const std::vector<Case> kCases = {
    {{2, 3}, {3, 4}},           // plain
    {{5, 2, 3}, {3, 4}},        // stack of x, one W (single-GEMM path)
    {{2, 3}, {5, 3, 4}},        // one a, a stack of b
    {{2, 1, 2, 3}, {3, 3, 2}},  // both broadcast on batch axes
    {{1, 3}, {2, 3, 1}},        // size-1 matrix dims
};

}  // namespace

TEST_CASE("matmul: values match a naive loop under batch broadcasting", "[ops][matmul]") {
  Generator g(83);
  for (const Case& c : kCases) {
    const Array a = rnd(c.a, g), b = rnd(c.b, g);
    require_close(ops::matmul(Tensor(a), Tensor(b)).value(), naive_matmul(a, b), 1e-12);
  }
}

TEST_CASE("matmul: transpose flags equal explicit transposes",
          "[ops][matmul]") {
  Generator g(97);
  const Array a = rnd({2, 4, 3}, g), b = rnd({2, 5, 4}, g);  // a^T: [2,3,4], b^T: [2,4,5]
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      DYNAMIC_SECTION("transpose_a " << ta << ", transpose_b " << tb) {
        const Array A = ta ? a : ops::transpose(Tensor(a)).value();  // stored so that op(A) is [2,3,4]
        const Array B = tb ? b : ops::transpose(Tensor(b)).value();  // op(B) is [2,4,5]
        const Array ref = naive_matmul(ops::transpose(Tensor(a)).value(), ops::transpose(Tensor(b)).value());
        const ops::MatmulOptions o{ta, tb};
        require_close(ops::matmul(Tensor(A), Tensor(B), o).value(), ref, 1e-12);
      }
    }
}

TEST_CASE("matmul: 1-d operands follow NumPy (vector-matrix and matrix-vector and dot)", "[ops][matmul]") {
  Generator g(101);
  const Array v = rnd({3}, g), m = rnd({3, 2}, g), mt = rnd({2, 3}, g);
  CHECK(ops::matmul(Tensor(v), Tensor(m)).shape() == Shape{2});
  CHECK(ops::matmul(Tensor(mt), Tensor(v)).shape() == Shape{2});
  const Tensor dot = ops::matmul(Tensor(v), Tensor(v));
  CHECK(dot.shape() == Shape{});
  double ref = 0;
  for (std::size_t i = 0; i < 3; ++i) ref += v.flat(i) * v.flat(i);
  CHECK(dot.item() == Approx(ref));
}

TEST_CASE("matmul: float32 runs sgemm and matches float64 to single precision", "[ops][matmul]") {
  Generator g(103);
  const Array a = rnd({4, 8, 16}, g), b = rnd({16, 8}, g);
  const Array c32 = ops::matmul(Tensor(a.astype(DType::float32)), Tensor(b.astype(DType::float32))).value();
  CHECK(c32.dtype() == DType::float32);
  CHECK(max_abs_diff(c32.astype(DType::float64), naive_matmul(a, b)) < 1e-5);
}

TEST_CASE("matmul: one row or one column of output (matrix-vector products) in every transpose layout whatever the "
          "output memory held - the same for any thread count",
          "[ops][matmul]") {
  // Batch-1 decoding multiplies one row by every weight matrix: a GEMM with M = 1 (or N = 1)
  // runs as a matrix-vector product, split over the pool when large (core/blas.cpp).
  Generator g(104);
  for (DType dt : {DType::float32, DType::float64}) {
    const double tol = dt == DType::float32 ? 1e-4 : 1e-12;
    // {M, K, N}: one row (small, and large enough to be split), one column.
    for (const auto& [M, K, N] : std::vector<std::array<std::size_t, 3>>{{1, 37, 300}, {1, 64, 20000}, {20000, 64, 1},
                                                                          {9, 5, 1}}) {
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          INFO("dtype " << dtype_name(dt) << ", M " << M << ", K " << K << ", N " << N << ", ta " << ta << ", tb " << tb);
          const Array a = rnd({M, K}, g), b = rnd({K, N}, g);
          const Array a_in = (ta ? ops::transpose(Tensor(a), 0, 1).value().clone() : a).astype(dt);
          const Array b_in = (tb ? ops::transpose(Tensor(b), 0, 1).value().clone() : b).astype(dt);
          std::vector<Array> results;
          for (int threads : {1, 2}) {
            ThreadCount t(threads);
            // Leave a block of NaNs of the output's size in the allocator's cache: the product
            // must not read what its output held.
            { const Array junk = Array::full({M, N}, std::nan(""), dt); }
            results.push_back(ops::matmul(Tensor(a_in), Tensor(b_in), {ta, tb}).value());
          }
          CHECK(results[0].shape() == Shape{M, N});
          CHECK(max_abs_diff(results[0].astype(DType::float64), naive_matmul(a, b)) < tol);
          // Bits across thread counts: the pool splits y into blocks at multiples of 64 entries
          // (core/blas.cpp, kAlignGemv), so each entry is the same dot product over the same
          // K-loop, in the same position modulo any kernel's row group, whatever the split.
          XGT_CHECK_SAME(results[0], results[1]);
        }
    }
  }
}


TEST_CASE("linear: value and gradients equal matmul then add bit for bit", "[ops][matmul][linear]") {
  Generator g(211);
  struct LinCase {
    Shape x;
    std::size_t N;
  };
  // 2-d and batched x, odd widths, and a product big enough to be split over the pool.
  const std::vector<LinCase> cases = {{{7, 5}, 9}, {{3, 4, 5}, 1}, {{2, 3, 33, 17}, 13}, {{1, 6}, 4}, {{300, 129}, 131}};
  for (MatmulDtype md : {MatmulDtype::float32, MatmulDtype::bfloat16})
    for (DType dt : {DType::float32, DType::float64})
      for (const LinCase& c : cases) {
        if (md == MatmulDtype::bfloat16 && (dt != DType::float32 || !bfloat16_matmul_unavailable_reason().empty()))
          continue;
        const MatmulDtypeScope scope(md);
        INFO(dtype_name(dt) << " x " << shape_str(c.x) << " N " << c.N << " matmul dtype " << matmul_dtype_name(md));
        const std::size_t K = c.x.back();
        const Tensor x(rnd(c.x, g).astype(dt), true), W(rnd({K, c.N}, g).astype(dt), true),
            b(rnd({c.N}, g).astype(dt), true);
        const Tensor y = ops::linear(x, W, b), yc = ops::add(ops::matmul(x, W), b);
        CHECK(y.shape() == yc.shape());
        CHECK(same_bits(y.value(), yc.value()));
        Shape ys = c.x;
        ys.back() = c.N;
        const Array G = rnd(ys, g).astype(dt);
        BackwardOptions keep;
        keep.retain_graph = true;  // y and yc share the tape
        const auto gr = grad(y, {x, W, b}, G, keep), gc = grad(yc, {x, W, b}, G);
        for (std::size_t i = 0; i < 3; ++i) {
          INFO("gradient " << i);
          CHECK(same_bits(gr[i], gc[i]));
        }
      }
}

TEST_CASE("linear: no bias is matmul and bad input gets matmul's and add's errors", "[ops][matmul][linear]") {
  Generator g(223);
  const Tensor x(rnd({4, 3}, g)), W(rnd({3, 2}, g));
  CHECK(same_bits(ops::linear(x, W, Tensor()).value(), ops::matmul(x, W).value()));
  CHECK_THROWS_AS(ops::linear(x, W, Tensor(rnd({3}, g))), ShapeError);             // b of the wrong width
  CHECK_THROWS_AS(ops::linear(x, Tensor(rnd({4, 2}, g)), Tensor(rnd({2}, g))), ShapeError);  // K differs
  CHECK_THROWS_AS(ops::linear(x, W, Tensor(rnd({2}, g).astype(DType::float32))), DTypeError);
  // A 1-d x (one vector) goes through matmul and add: the same values.
  const Tensor v(rnd({3}, g)), b(rnd({2}, g));
  CHECK(same_bits(ops::linear(v, W, b).value(), ops::add(ops::matmul(v, W), b).value()));
}

TEST_CASE("linear: second-order gradients equal those of matmul then add", "[ops][matmul][linear]") {
  Generator g(227);
  const Tensor x(rnd({2, 3, 4}, g), true), W(rnd({4, 5}, g), true), b(rnd({5}, g), true);
  BackwardOptions cg;
  cg.create_graph = true;
  const auto hessian_vector = [&](const Tensor& y) {
    // d/d(x, W, b) of sum(tanh(y) * y)'s gradient dotted with itself
    const Tensor L = ops::sum(ops::mul(ops::tanh(y), y));
    const auto g1 = grad(L, {x, W, b}, Tensor(), cg);
    Tensor s = ops::sum(ops::mul(g1[0], g1[0]));
    s = ops::add(s, ops::sum(ops::mul(g1[1], g1[1])));
    s = ops::add(s, ops::sum(ops::mul(g1[2], g1[2])));
    return grad(s, {x, W, b}, Array());
  };
  const auto h = hessian_vector(ops::linear(x, W, b));
  const auto hc = hessian_vector(ops::add(ops::matmul(x, W), b));
  for (std::size_t i = 0; i < 3; ++i) require_close(h[i], hc[i], 1e-12);
}
