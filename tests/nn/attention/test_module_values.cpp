// MultiHeadAttention (MHA, GQA, MQA) and CrossAttention VALUES and GRADIENTS against an
// independent plain-loop implementation written here from the definitions (5.18)-(5.22),
// (5.36) and (5.23): no xgrad op, no Visibility, no reference module is used for the
// expected side. Gradients of L = sum(G * Y) are compared with central differences of the
// plain-loop loss (float64, step 1e-6).
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {

// Row-major float64 buffers with explicit sizes.
using Vec = std::vector<double>;

struct Dims {
  std::size_t B, T, S, d_in, d_mem, H_q, H_kv, d_h, d_out;
};

// The allowed set from the definitions: causal by position (j <= i, T == S) when `causal`;
// key j of sample b is real iff j < key_len[b].
bool allowed(bool causal, const std::vector<std::size_t>& key_len, std::size_t b, std::size_t i,
             std::size_t j) {
  if (causal && j > i) return false;
  return j < key_len[b];
}

// Y [B, T, d_out] of the attention layer with projections W_q [d_in, H_q d_h], W_k, W_v
// [d_mem, H_kv d_h] (+ biases), W_o [H_q d_h, d_out] (+ b_o): query head h reads kv head
// h / (H_q / H_kv) (5.36); scores scaled by 1/sqrt(d_h); softmax over the allowed keys (5.11);
// heads concatenated and projected (5.20).
Vec layer_loops(const Dims& n, const Vec& Xq, const Vec& Xm, const Vec& Wq, const Vec& bq, const Vec& Wk,
                const Vec& bk, const Vec& Wv, const Vec& bv, const Vec& Wo, const Vec& bo, bool causal,
                const std::vector<std::size_t>& key_len) {
  auto proj = [](const Vec& X, std::size_t rows, std::size_t din, const Vec& W, const Vec& b, std::size_t dout) {
    Vec Y(rows * dout);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < dout; ++c) {
        double s = b.empty() ? 0.0 : b[c];
        for (std::size_t k = 0; k < din; ++k) s += X[r * din + k] * W[k * dout + c];
        Y[r * dout + c] = s;
      }
    return Y;
  };
  const Vec Q = proj(Xq, n.B * n.T, n.d_in, Wq, bq, n.H_q * n.d_h);
  const Vec K = proj(Xm, n.B * n.S, n.d_mem, Wk, bk, n.H_kv * n.d_h);
  const Vec V = proj(Xm, n.B * n.S, n.d_mem, Wv, bv, n.H_kv * n.d_h);
  const std::size_t group = n.H_q / n.H_kv;
  Vec concat(n.B * n.T * n.H_q * n.d_h, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(n.d_h));
  for (std::size_t b = 0; b < n.B; ++b)
    for (std::size_t h = 0; h < n.H_q; ++h) {
      const std::size_t g = h / group;
      for (std::size_t i = 0; i < n.T; ++i) {
        Vec u(n.S, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < n.S; ++j) {
          if (!allowed(causal, key_len, b, i, j)) continue;
          double s = 0;
          for (std::size_t r = 0; r < n.d_h; ++r)
            s += Q[(b * n.T + i) * n.H_q * n.d_h + h * n.d_h + r] * K[(b * n.S + j) * n.H_kv * n.d_h + g * n.d_h + r];
          u[j] = s * scale;
          mx = std::max(mx, u[j]);
        }
        double z = 0;
        for (std::size_t j = 0; j < n.S; ++j)
          if (allowed(causal, key_len, b, i, j)) z += std::exp(u[j] - mx);
        for (std::size_t j = 0; j < n.S; ++j) {
          if (!allowed(causal, key_len, b, i, j)) continue;
          const double a = std::exp(u[j] - mx) / z;
          for (std::size_t r = 0; r < n.d_h; ++r)
            concat[(b * n.T + i) * n.H_q * n.d_h + h * n.d_h + r] += a * V[(b * n.S + j) * n.H_kv * n.d_h + g * n.d_h + r];
        }
      }
    }
  return proj(concat, n.B * n.T, n.H_q * n.d_h, Wo, bo, n.d_out);
}

Vec vec(const Array& a) { return a.to_vector(); }
Array arr(const Vec& v, const Shape& s) { return Array::from_vector(s, v, DType::float64); }

// Columns [c0, c0 + w) of the row-major rows x cols matrix M.
Vec columns(const Vec& M, std::size_t rows, std::size_t cols, std::size_t c0, std::size_t w) {
  Vec out(rows * w);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < w; ++c) out[r * w + c] = M[r * cols + c0 + c];
  return out;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t k = 0; k < a.size(); ++k) s += a[k] * b[k];
  return s;
}

// Compares the analytic gradient `got` of L w.r.t. `x` with central differences of `loss`
// (which reads x through the reference), relative-plus-absolute tolerance.
void check_fd(const std::string& name, Vec& x, const Array& got, const std::function<double()>& loss) {
  REQUIRE(got.size() == x.size());
  const double h = 1e-6;
  double worst = 0;
  std::size_t worst_k = 0;
  for (std::size_t k = 0; k < x.size(); ++k) {
    const double keep = x[k];
    x[k] = keep + h;
    const double lp = loss();
    x[k] = keep - h;
    const double lm = loss();
    x[k] = keep;
    const double fd = (lp - lm) / (2 * h);
    const double err = std::fabs(fd - got.flat(k)) / (1.0 + std::fabs(fd));
    if (err > worst) {
      worst = err;
      worst_k = k;
    }
  }
  INFO(name << ": worst relative error " << worst << " at flat index " << worst_k);
  CHECK(worst < 1e-7);
}

struct MhaCase {
  const char* name;
  std::size_t d_model, H_q, H_kv, d_h;
};

}  // namespace

TEST_CASE("attention module values: MHA/GQA/MQA outputs and gradients equal plain loops (5.18)-(5.22) and (5.36)",
          "[nn][attention][claims]") {
  const std::vector<MhaCase> cases = {
      {"MHA d_model 4, 2 heads", 4, 2, 2, 2},
      {"MQA d_model 4, H_q 2, H_kv 1", 4, 2, 1, 2},
      {"GQA d_model 4, H_q 4, H_kv 2, d_h 2", 4, 4, 2, 2},
      {"MQA d_model 3, H_q 3, H_kv 1, d_h 2 (H d_h != d_model)", 3, 3, 1, 2},
  };
  for (const MhaCase& c : cases) {
    INFO(c.name);
    for (const bool fused : {false, true}) {
      INFO((fused ? "fused" : "composed"));
      Generator g(4242);
      const std::size_t B = 2, T = 4, D = c.d_model, cq = c.H_q * c.d_h, ckv = c.H_kv * c.d_h;
      const std::size_t wcols = cq + 2 * ckv;
      Vec X = vec(rnd({B, T, D}, g)), W_QKV = vec(rnd({D, wcols}, g)), b_QKV = vec(rnd({wcols}, g));
      Vec W_O = vec(rnd({cq, D}, g)), b_O = vec(rnd({D}, g));
      const Vec G = vec(rnd({B, T, D}, g));
      const std::vector<std::size_t> key_len = {4, 3};  // sample 1: key 3 is padding
      AttentionConfig cfg;
      cfg.d_model = D;
      cfg.H_q = c.H_q;
      cfg.H_kv = c.H_kv;
      cfg.d_head = c.d_h;
      cfg.dtype = DType::float64;
      cfg.impl = fused ? SdpaImpl::fused : SdpaImpl::composed;
      MultiHeadAttention m(cfg, {{"W_QKV", arr(W_QKV, {D, wcols})},
                                 {"b_QKV", arr(b_QKV, {wcols})},
                                 {"W_O", arr(W_O, {cq, D})},
                                 {"b_O", arr(b_O, {D})}});
      Tensor Xt(arr(X, {B, T, D}), true);
      const Visibility vis = Visibility::causal(4, 4) & Visibility::key_lengths({4, 3}, 4);
      AttentionCall call;
      call.visibility = vis;
      const AttentionOutput out = m.forward(Xt, call);
      CHECK(out.path == cfg.impl);  // the config's path really ran
      const Tensor Y = out.Y;
      REQUIRE(Y.shape() == Shape{B, T, D});

      // The reference reads the packed W_QKV by its documented column layout [Q | K | V].
      const Dims n{B, T, T, D, D, c.H_q, c.H_kv, c.d_h, D};
      auto ref = [&]() {
        return layer_loops(n, X, X, columns(W_QKV, D, wcols, 0, cq), columns(b_QKV, 1, wcols, 0, cq),
                           columns(W_QKV, D, wcols, cq, ckv), columns(b_QKV, 1, wcols, cq, ckv),
                           columns(W_QKV, D, wcols, cq + ckv, ckv), columns(b_QKV, 1, wcols, cq + ckv, ckv), W_O, b_O,
                           true, key_len);
      };
      const Vec Yref = ref();
      double worst = 0;
      for (std::size_t k = 0; k < Yref.size(); ++k) worst = std::max(worst, std::fabs(Yref[k] - Y.value().flat(k)));
      INFO("max |Y - Y_loops| = " << worst);
      CHECK(worst < 1e-13);

      // Gradients of L = sum(G * Y) w.r.t. X (self-attention: three paths add, (5.31)) and
      // every parameter.
      const auto gr = grad(Y, {Xt, m.W_QKV, m.b_QKV, m.W_O, m.b_O}, arr(G, {B, T, D}));
      auto loss = [&]() { return dot(G, ref()); };
      check_fd("X", X, gr[0], loss);
      check_fd("W_QKV", W_QKV, gr[1], loss);
      check_fd("b_QKV", b_QKV, gr[2], loss);
      check_fd("W_O", W_O, gr[3], loss);
      check_fd("b_O", b_O, gr[4], loss);
    }
  }
}

TEST_CASE("attention module values: CrossAttention output and gradients equal plain loops (5.23) with GQA memory",
          "[nn][attention][claims]") {
  Generator g(77);
  const std::size_t B = 2, T = 3, S = 4, d_q = 3, d_m = 5, H_q = 2, H_kv = 1, d_h = 2, d_out = 3;
  const std::size_t cq = H_q * d_h, ckv = H_kv * d_h;
  Vec Xq = vec(rnd({B, T, d_q}, g)), Xm = vec(rnd({B, S, d_m}, g));
  Vec W_Q = vec(rnd({d_q, cq}, g)), b_Q = vec(rnd({cq}, g)), W_KV = vec(rnd({d_m, 2 * ckv}, g));
  Vec b_KV = vec(rnd({2 * ckv}, g)), W_O = vec(rnd({cq, d_out}, g)), b_O = vec(rnd({d_out}, g));
  const Vec G = vec(rnd({B, T, d_out}, g));
  CrossAttentionConfig cfg;
  cfg.d_q = d_q;
  cfg.d_m = d_m;
  cfg.H_q = H_q;
  cfg.H_kv = H_kv;
  cfg.d_head = d_h;
  cfg.d_out = d_out;
  cfg.dtype = DType::float64;
  CrossAttention m(cfg, {{"W_Q", arr(W_Q, {d_q, cq})},
                         {"b_Q", arr(b_Q, {cq})},
                         {"W_KV", arr(W_KV, {d_m, 2 * ckv})},
                         {"b_KV", arr(b_KV, {2 * ckv})},
                         {"W_O", arr(W_O, {cq, d_out})},
                         {"b_O", arr(b_O, {d_out})}});
  Tensor Xqt(arr(Xq, {B, T, d_q}), true), Xmt(arr(Xm, {B, S, d_m}), true);
  AttentionCall call;
  call.visibility = Visibility::key_lengths({4, 2}, 4);  // source padding only, no causal mask
  const Tensor Y = m.forward(Xqt, Xmt, call).Y;
  const std::vector<std::size_t> key_len = {4, 2};
  const Dims n{B, T, S, d_q, d_m, H_q, H_kv, d_h, d_out};
  auto ref = [&]() {
    return layer_loops(n, Xq, Xm, W_Q, b_Q, columns(W_KV, d_m, 2 * ckv, 0, ckv), columns(b_KV, 1, 2 * ckv, 0, ckv),
                       columns(W_KV, d_m, 2 * ckv, ckv, ckv), columns(b_KV, 1, 2 * ckv, ckv, ckv), W_O, b_O, false,
                       key_len);
  };
  const Vec Yref = ref();
  REQUIRE(Y.shape() == Shape{B, T, d_out});
  double worst = 0;
  for (std::size_t k = 0; k < Yref.size(); ++k) worst = std::max(worst, std::fabs(Yref[k] - Y.value().flat(k)));
  CHECK(worst < 1e-13);
  const auto gr = grad(Y, {Xqt, Xmt, m.W_Q, m.b_Q, m.W_KV, m.b_KV, m.W_O, m.b_O}, arr(G, {B, T, d_out}));
  auto loss = [&]() { return dot(G, ref()); };
  check_fd("X_q", Xq, gr[0], loss);
  check_fd("X_m", Xm, gr[1], loss);
  check_fd("W_Q", W_Q, gr[2], loss);
  check_fd("b_Q", b_Q, gr[3], loss);
  check_fd("W_KV", W_KV, gr[4], loss);
  check_fd("b_KV", b_KV, gr[5], loss);
  check_fd("W_O", W_O, gr[6], loss);
  check_fd("b_O", b_O, gr[7], loss);
}
