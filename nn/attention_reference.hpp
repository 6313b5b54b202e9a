// The spec's hand-derived attention backward (SPEC 9, (5.24)-(5.31)), implemented
// independently of the tape and of ops/: plain float64 loops over row-major matrices,
// following Algorithm 5.1 literally for the forward. Tests compare it with the tape's
// gradients of nn/sdpa.hpp and nn/attention.hpp to 1e-10.
#pragma once

#include <cstddef>
#include <vector>

#include <xgrad/core/array.hpp>

namespace xg::nn::reference {

// Dense row-major float64 matrix.
struct Mat {
  std::size_t rows = 0, cols = 0;
  std::vector<double> a;
  Mat() = default;
  Mat(std::size_t r, std::size_t c) : rows(r), cols(c), a(r * c, 0.0) {}
  double& operator()(std::size_t i, std::size_t j) { return a[i * cols + j]; }
  double operator()(std::size_t i, std::size_t j) const { return a[i * cols + j]; }
};
Mat matmul(const Mat& x, const Mat& y);
Mat transpose(const Mat& x);

// One head, one sample. allowed is T x S (J_i as 0/1), valid has T flags b_i; soft (T x S,
// optional) is a finite additive bias on allowed positions; drop (T x S, optional) is the
// scaled dropout mask m / q.
struct Head {
  Mat Q, K, V;
  std::vector<unsigned char> allowed;
  std::vector<unsigned char> valid;
  double scale = 1.0;
  Mat soft, drop;
};
struct HeadForward {
  Mat U, A, Ad, O;  // scores, weights (before dropout), weights after dropout, output
};
struct HeadGrads {
  Mat V_bar, R, D, Q_bar, K_bar;  // (5.26), (5.26), (5.27), (5.28), (5.28)
};
// Algorithm 5.1. A valid query with an empty allowed set throws VisibilityError.
HeadForward head_forward(const Head& h);
// G = dL/dO (T x d_v):  V_bar = Ad^T G, R = G V^T, R' = R * drop,
// D_ij = A_ij (R'_ij - sum_r A_ir R'_ir), Q_bar = scale D K, K_bar = scale D^T Q.
HeadGrads head_backward(const Head& h, const HeadForward& f, const Mat& G);

// Batched scaled dot-product attention with GQA (5.36): Q [B, H_q, T, d_k], K [B, H_kv, S, d_k],
// V [B, H_kv, S, d_v] (float64 Arrays); allowed [B, H_q, T, S]; query_valid [B, T] (empty =
// all valid); soft and drop [B, H_q, T, S] or undefined. G = dL/dO [B, H_q, T, d_v].
// K_bar, V_bar of a shared kv head sum over its group of query heads.
struct Sdpa {
  Array O, A, D, Q_bar, K_bar, V_bar;
};
Sdpa sdpa(const Array& Q, const Array& K, const Array& V, const std::vector<unsigned char>& allowed,
          const BoolArray& query_valid, const Array& soft, double scale, const Array& drop, const Array& G);

// A full attention layer (5.18)-(5.23), (5.29)-(5.31): separate W_Q, W_K, W_V (in x out),
// optional biases (undefined = none), W_O, b_O; X_q [B, T, d_q], X_m [B, S, d_m].
// Self-attention passes the same X as X_q and X_m and adds the two input gradients (5.31).
struct Layer {
  Array W_Q, W_K, W_V, b_Q, b_K, b_V, W_O, b_O;
  std::size_t H_q = 1, H_kv = 1, d_h = 1;
};
struct LayerGrads {
  Array Y;
  Array X_q_bar, X_m_bar;  // X_q_bar = Q_bar W_Q^T, X_m_bar = K_bar W_K^T + V_bar W_V^T (5.30)
  Array W_Q_bar, W_K_bar, W_V_bar, b_Q_bar, b_K_bar, b_V_bar, W_O_bar, b_O_bar;  // (5.29), W_O
};
LayerGrads layer(const Layer& p, const Array& X_q, const Array& X_m, const std::vector<unsigned char>& allowed,
                 const BoolArray& query_valid, const Array& soft, double scale, const Array& drop, const Array& Y_bar);

}  // namespace xg::nn::reference
