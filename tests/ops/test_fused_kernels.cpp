// The fused work between the GEMMs: bias_gelu and the one-op cross_entropy against
// their compositions, the run-time-dispatched float32 kernels (LayerNorm rows, the multi-tensor
// Adam(W) update) on every ISA build this CPU runs against the float64 path, on odd shapes.
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/helpers.hpp"
#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/suite.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/fused_kernels.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/ops/layer_norm.hpp>
#include <xgrad/ops/loss.hpp>
#include <xgrad/ops/shape_ops.hpp>
#include <xgrad/ops/unary.hpp>

using namespace xg;
using namespace xgt;

namespace {

const std::vector<std::size_t> kOdd{1, 7, 13, 127, 129};

// The kernel builds this CPU can run: avx512, avx2 (where the CPU has them) and sse2.
std::vector<std::string> kernel_builds() {
  std::vector<std::string> out;
  const std::string cpu = blas::cpu_isa();
  if (cpu == "avx512") out.push_back("avx512");
  if (cpu == "avx512" || cpu == "avx2") out.push_back("avx2");
  out.push_back("sse2");
  return out;
}

struct ForceIsa {
  explicit ForceIsa(const std::string& isa) { fused::force_kernel_isa(isa); }
  ~ForceIsa() { fused::force_kernel_isa(""); }
};

bool bit_equal(const Array& a, const Array& b) {
  if (a.shape() != b.shape()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a.flat(i) != b.flat(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("bias_gelu equals gelu(x + b) in value and in the gradients of x and b on odd shapes",
          "[ops][fused][bias_gelu]") {
  Generator gen(11);
  for (DType dt : {DType::float32, DType::float64}) {
    const double tol = dt == DType::float32 ? 2e-6 : 1e-14;
    for (std::size_t rows : kOdd)
      for (std::size_t cols : {std::size_t{1}, std::size_t{13}, std::size_t{129}, std::size_t{300}}) {
        INFO(dtype_name(dt) << " rows " << rows << " cols " << cols);
        // x as a strided view's copy: the transpose of a [cols, rows] array
        const Tensor xt(rnd({cols, rows}, gen, -4, 4).astype(dt), true);
        const Tensor x = ops::transpose(xt, 0, 1);
        const Tensor b(rnd({cols}, gen).astype(dt), true);
        const Array G = rnd({rows, cols}, gen).astype(dt);
        const Tensor y = ops::bias_gelu(x, b), yc = ops::bias_gelu_composed(x, b);
        require_close(y.value(), yc.value(), tol);
        BackwardOptions keep;
        keep.retain_graph = true;
        const auto g = grad(y, {xt, b}, G, keep), gc = grad(yc, {xt, b}, G);
        require_close(g[0], gc[0], tol);
        require_close(g[1], gc[1], tol * double(rows));
      }
  }
  const Tensor x(Array::zeros({2, 3}, DType::float32), true);
  CHECK_THROWS_AS(ops::bias_gelu(x, Tensor(Array::zeros({4}, DType::float32))), ShapeError);
  CHECK_THROWS_AS(ops::bias_gelu(x, Tensor(Array::zeros({3}, DType::float64))), DTypeError);
  CHECK_THROWS_AS(ops::bias_gelu(x, Tensor(Array::zeros({1, 3}, DType::float32))), ShapeError);
}

TEST_CASE("bias_gelu: large float32 inputs recompute the normal CDF in the backward with the kept one's bits",
          "[ops][fused][bias_gelu]") {
  // 1100 x 1000 float32 values (from 2^20 the backward computes Phi again instead of keeping
  // it) against its two halves of 550 rows (kept): the same bits in y and in x's gradient, each
  // element's arithmetic being the same; the bias gradient (column sums in another order) within
  // rounding; both against the composed float64 GELU. Which path ran shows in the memory the
  // forward keeps: y and Phi, or y alone.
  const std::size_t R = 1100, C = 1000, H = R / 2;
  Generator gen(23);
  const std::vector<double> xv = rnd({R, C}, gen, -4, 4).to_vector(), gv = rnd({R, C}, gen).to_vector();
  const Array b64 = rnd({C}, gen);
  struct Run {
    Array y, dx, db;
    std::size_t kept;  // bytes the forward left in use
  };
  const auto run = [&](std::size_t r0, std::size_t rows) {
    const auto part = [&](const std::vector<double>& v) {
      return std::vector<double>(v.begin() + std::ptrdiff_t(r0 * C), v.begin() + std::ptrdiff_t((r0 + rows) * C));
    };
    const Tensor x(Array::from_vector({rows, C}, part(xv), DType::float32), true);
    const Tensor b(b64.astype(DType::float32), true);
    const std::size_t before = memory_stats().in_use;
    const Tensor y = ops::bias_gelu(x, b);
    const std::size_t kept = memory_stats().in_use - before;
    const auto g = grad(y, {x, b}, Array::from_vector({rows, C}, part(gv), DType::float32));
    return Run{y.value(), g[0], g[1], kept};
  };
  const Run whole = run(0, R), top = run(0, H), bottom = run(H, R - H);
  const std::size_t bytes = R * C * sizeof(float), half = H * C * sizeof(float);
  INFO("memory kept by the forward: " << whole.kept << " bytes for " << bytes << " of y; " << top.kept << " and "
                                      << bottom.kept << " for " << half << " each");
  CHECK(whole.kept < 2 * bytes);  // y alone: Phi is computed again
  CHECK(top.kept >= 2 * half);    // y and Phi
  CHECK(bottom.kept >= 2 * half);
  const auto joined = [](const Array& a, const Array& b) { return ops::concat({Tensor(a), Tensor(b)}, 0).value(); };
  XGT_CHECK_SAME(whole.y, joined(top.y, bottom.y));  // each element's arithmetic is the same
  XGT_CHECK_SAME(whole.dx, joined(top.dx, bottom.dx));
  const Tensor halves = Tensor(top.db.astype(DType::float64)) + Tensor(bottom.db.astype(DType::float64));
  require_close(whole.db.astype(DType::float64), halves.value(), 1e-3);
  // The composed float64 GELU.
  const Tensor x64(Array::from_vector({R, C}, xv, DType::float64), true), bb64(b64, true);
  const Tensor yc = ops::bias_gelu_composed(x64, bb64);
  const auto gc = grad(yc, {x64, bb64}, Array::from_vector({R, C}, gv, DType::float64));
  require_close(whole.y.astype(DType::float64), yc.value(), 2e-6);
  require_close(whole.dx.astype(DType::float64), gc[0], 2e-6);
  require_close(whole.db.astype(DType::float64), gc[1], 2e-6 * double(R));
}

TEST_CASE("cross_entropy as one op equals its composition with ignore_index and weights on odd shapes",
          "[ops][fused][cross_entropy]") {
  Generator gen(12);
  for (DType dt : {DType::float32, DType::float64}) {
    const double tol = dt == DType::float32 ? 2e-6 : 1e-14;
    for (std::size_t rows : kOdd)  // classes: a tail alone, whole blocks of 8 partials, both
      for (std::size_t C :
           {std::size_t{1}, std::size_t{7}, std::size_t{8}, std::size_t{16}, std::size_t{65}, std::size_t{129}}) {
        INFO(dtype_name(dt) << " rows " << rows << " classes " << C);
        const Tensor z(rnd({rows, C}, gen, -6, 6).astype(dt), true);
        std::vector<std::int64_t> t(rows);
        std::vector<double> w(rows);
        for (std::size_t i = 0; i < rows; ++i) {
          t[i] = static_cast<std::int64_t>(gen.below(C));
          w[i] = 0.25 + 0.5 * double(i % 3);
        }
        if (rows > 1) t[rows / 2] = -100;  // ignored
        ops::CrossEntropyOptions o;
        o.weights = Array::from_vector({rows}, w, dt);
        const IndexArray T({rows}, t);
        const Tensor L = ops::cross_entropy(z, T, o), Lc = ops::cross_entropy_composed(z, T, o);
        CHECK(L.shape() == Lc.shape());
        CHECK(L.value().flat(0) == Approx(Lc.value().flat(0)).epsilon(tol).margin(tol));
        BackwardOptions keep;
        keep.retain_graph = true;
        const Array gz = grad(L, {z}, Array(), keep)[0];
        require_close(gz, grad(Lc, {z})[0], tol);
      }
  }
  // Large logits (1e3 apart) stay finite, as the composition does
  const Tensor z(Array::from_vector({2, 3}, {1000, -1000, 0, 5, 5, 5}, DType::float32), true);
  const Tensor L = ops::cross_entropy(z, IndexArray({2}, {1, 2}));
  CHECK(L.value().flat(0) == Approx(ops::cross_entropy_composed(z, IndexArray({2}, {1, 2})).value().flat(0)));
  CHECK(std::isfinite(L.value().flat(0)));
}

TEST_CASE("float32 layer_norm kernels agree with the float64 path on every ISA build and bit for bit across the FMA builds",
          "[ops][fused][layer_norm]") {
  Generator gen(13);
  for (std::size_t rows : kOdd)
    for (std::size_t D : {std::size_t{1}, std::size_t{7}, std::size_t{16}, std::size_t{129}}) {
      const Array x64 = rnd({rows, D}, gen, -3, 3), g64 = rnd({D}, gen, 0.5, 1.5), b64 = rnd({D}, gen);
      const Array G64 = rnd({rows, D}, gen);
      for (bool affine : {true, false}) {
        const auto run = [&](DType dt) {
          const Tensor x(x64.astype(dt), true), g(g64.astype(dt), true), b(b64.astype(dt), true);
          const Tensor y = affine ? ops::layer_norm(x, g, b) : ops::layer_norm(x);
          std::vector<Array> out{y.value()};
          for (const Array& a : grad(y, affine ? std::vector<Tensor>{x, g, b} : std::vector<Tensor>{x}, G64.astype(dt)))
            out.push_back(a);
          return out;
        };
        const auto ref = run(DType::float64);
        std::vector<Array> first;
        for (const std::string& isa : kernel_builds()) {
          INFO("rows " << rows << " D " << D << (affine ? " affine " : " plain ") << isa);
          ForceIsa force(isa);
          CHECK(std::string(fused::kernel_isa()) == isa);
          const auto got = run(DType::float32);
          REQUIRE(got.size() == ref.size());
          for (std::size_t k = 0; k < got.size(); ++k) {
            INFO("output " << k);
            // x_bar of a 1-wide row is 0 up to rounding: its scale is 1/sqrt(eps)
            require_close(got[k], ref[k], (k >= 2 ? 1e-5 * double(rows) : 2e-5) * (D == 1 ? 500 : 1));
            if (!first.empty() && isa != "sse2") CHECK(bit_equal(got[k], first[k]));  // avx2 as avx512
          }
          if (first.empty()) first = got;
        }
      }
    }
}

TEST_CASE("Adam and AdamW update every float32 parameter in one pass as the per-element formulas in float64",
          "[ops][fused][optim]") {
  const std::vector<std::size_t> sizes{1, 7, 13, 127, 129, 1023, 40000};  // 40000: split over the pool
  for (bool decoupled : {true, false})
    for (const std::string& isa : kernel_builds()) {
      INFO((decoupled ? "AdamW " : "Adam ") << isa);
      ForceIsa force(isa);
      Generator gen(14);
      nn::NamedTensors params;
      std::vector<std::vector<double>> p, m, v;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const Array a = rnd({sizes[k]}, gen);
        params.emplace_back("p" + std::to_string(k), Tensor(a.astype(DType::float32), true));
        p.push_back(params.back().second.value().to_vector());
        m.emplace_back(sizes[k], 0.0);
        v.emplace_back(sizes[k], 0.0);
      }
      // a float64 parameter among them (updated by the per-parameter path) and one without a gradient
      params.emplace_back("d", Tensor(Array::from_vector({3}, {0.5, -1, 2}, DType::float64), true));
      params.emplace_back("none", Tensor(Array::full({5}, 1.0, DType::float32), true));
      const double lr = 1e-2, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
      nn::Adam opt(params, lr, b1, b2, eps, wd, decoupled);
      for (int step = 1; step <= 3; ++step) {
        std::vector<std::vector<double>> g;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const Array a = rnd({sizes[k]}, gen).astype(DType::float32);
          g.push_back(a.to_vector());
          Tensor(params[k].second).set_grad(a);
        }
        Tensor(params[sizes.size()].second).set_grad(Array::from_vector({3}, {1, 1, 1}, DType::float64));
        opt.step();
        const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const std::vector<double> got = params[k].second.value().to_vector();
          for (std::size_t i = 0; i < sizes[k]; ++i) {
            double d = g[k][i];
            if (decoupled)
              p[k][i] -= lr * wd * p[k][i];
            else
              d += wd * p[k][i];
            m[k][i] = b1 * m[k][i] + (1 - b1) * d;
            v[k][i] = b2 * v[k][i] + (1 - b2) * d * d;
            p[k][i] -= lr * (m[k][i] / c1) / (std::sqrt(v[k][i] / c2) + eps);
            if (std::fabs(got[i] - p[k][i]) > 1e-5) {
              FAIL_CHECK("step " << step << " parameter " << k << " element " << i << ": " << got[i] << " vs "
                                 << p[k][i]);
              break;
            }
          }
          p[k] = got;  // the next step from the float32 values
        }
      }
      CHECK(params.back().second.value().to_vector() == std::vector<double>(5, 1.0));  // no gradient: untouched
      CHECK(params[sizes.size()].second.value().flat(0) != 0.5);  // the float64 one moved
    }
}

// Each built-in check also runs, in both dtypes, as a test case of its own
// (tests/checks/test_builtin_checks.cpp); here only that the fused ops have theirs.
TEST_CASE("gradcheck suite: the bias_gelu and one-op cross_entropy checks are built in", "[gradcheck][suite][fused]") {
  GradcheckSuite s;
  checks::register_builtin_checks(s);
  std::vector<std::string> names;
  for (const Check* c : s.select("ops/bias_gelu,ops/cross_entropy")) names.push_back(c->name);
  CHECK(names == std::vector<std::string>{"ops/cross_entropy", "ops/bias_gelu", "ops/cross_entropy-plain"});
}

// Also run by ctest's gemm_paths_avx2 (XGRAD_ISA=avx2): the ceiling caps these kernels too.
TEST_CASE("the fused float32 kernels run the CPU's widest build unless XGRAD_ISA caps them at avx2",
          "[ops][fused][gemm_paths]") {
  const char* env = std::getenv("XGRAD_ISA");
  const std::string cpu = blas::cpu_isa();
  const std::string want = env && std::string(env) == "avx2" && cpu != "none" ? "avx2" : (cpu == "none" ? "sse2" : cpu);
  CHECK(std::string(fused::kernel_isa()) == want);
  CHECK_THROWS_AS(fused::force_kernel_isa("avx1024"), ValueError);
}
