/// \file
/// The spec's hand-derived attention backward (SPEC 9, (5.24)-(5.31)), implemented
/// independently of the tape and of ops/: plain float64 loops over row-major matrices,
/// following Algorithm 5.1 literally for the forward. Tests compare it with the tape's
/// gradients of nn/sdpa.hpp and nn/attention.hpp to 1e-10.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <xgrad/core/array.hpp>

/// The closed-form attention forward and backward (SPEC 9) in plain float64 loops, no tape:
/// the oracle the tape's gradients are tested against.
namespace xg::checks::reference {

/// Dense row-major float64 matrix.
struct Mat {
  /// Number of rows and columns. @{
  std::size_t rows = 0, cols = 0;
  /// @}
  std::vector<double> a;  ///< The elements, row-major (rows * cols).
  Mat() = default;        ///< A 0 x 0 matrix.
  /// An `r` x `c` matrix of zeros.
  Mat(std::size_t r, std::size_t c) : rows(r), cols(c), a(r * c, 0.0) {}
  /// Element (i, j), writable.
  double& operator()(std::size_t i, std::size_t j) { return a[i * cols + j]; }
  /// Element (i, j).
  double operator()(std::size_t i, std::size_t j) const { return a[i * cols + j]; }
};
/// The matrix product x y (x.cols == y.rows).
Mat matmul(const Mat& x, const Mat& y);
/// The transpose of x.
Mat transpose(const Mat& x);

/// One head, one sample. allowed is T x S (J_i as 0/1), valid has T flags b_i; soft (T x S,
/// optional) is a finite additive bias on allowed positions; drop (T x S, optional) is the
/// scaled dropout mask m / q.
struct Head {
  /// Queries Q (T x d_k), keys K (S x d_k) and values V (S x d_v). @{
  Mat Q, K, V;
  /// @}
  std::vector<unsigned char> allowed;  ///< T x S, row-major: 1 where query i may see key j.
  std::vector<unsigned char> valid;    ///< T flags b_i: 1 for a real query, 0 for padding.
  double scale = 1.0;                  ///< Score scale (1 / sqrt(d_k) in standard attention).
  /// The optional soft bias and dropout mask (0 x 0 when absent). @{
  Mat soft, drop;
  /// @}
};
/// The forward values of one head.
struct HeadForward {
  /// Scores, weights (before dropout), weights after dropout, output. @{
  Mat U, A, Ad, O;
  /// @}
};
/// The gradients of one head.
struct HeadGrads {
  /// V_bar (5.26), R = dL/dA (5.26), the score gradient D (5.27), Q_bar and K_bar (5.28). @{
  Mat V_bar, R, D, Q_bar, K_bar;
  /// @}
};
/// Algorithm 5.1 for the head `h`. A valid query with an empty allowed set throws
/// VisibilityError.
HeadForward head_forward(const Head& h);
/// The backward pass of head `h` with forward values `f` and G = dL/dO (T x d_v):
/// V_bar = Ad^T G, R = G V^T, R' = R * drop,
/// D_ij = A_ij (R'_ij - sum_r A_ir R'_ir), Q_bar = scale D K, K_bar = scale D^T Q.
HeadGrads head_backward(const Head& h, const HeadForward& f, const Mat& G);

/// The outputs and gradients of sdpa().
struct Sdpa {
  /// Output O, weights A, score gradient D, and the gradients of Q, K and V. @{
  Array O, A, D, Q_bar, K_bar, V_bar;
  /// @}
};
/// Batched scaled dot-product attention with GQA (5.36): Q [B, H_q, T, d_k], K [B, H_kv, S, d_k],
/// V [B, H_kv, S, d_v] (float64 Arrays); allowed [B, H_q, T, S]; query_valid [B, T] (empty =
/// all valid); soft and drop [B, H_q, T, S] or undefined; `scale` multiplies the scores.
/// G = dL/dO [B, H_q, T, d_v]. K_bar, V_bar of a shared kv head sum over its group of query
/// heads.
Sdpa sdpa(const Array& Q, const Array& K, const Array& V, const std::vector<unsigned char>& allowed,
          const BoolArray& query_valid, const Array& soft, double scale, const Array& drop, const Array& G);

/// The allowed sets J_i described by their definitions (SPEC 3, (5.12), SPEC 8), evaluated by
/// allowed_sets() in plain loops, never through nn::Visibility: tests build the Visibility
/// from the same description and compare, so a mask bug cannot hide on both sides. Every
/// field left empty (or false) imposes nothing; the allowed set is the intersection of the
/// constraints given (SPEC 3.4).
struct AllowedSets {
  /// (5.12) causal by absolute position: key j visible to query i iff k_pos[j] <= q_pos[i].
  bool causal = false;
  /// Absolute positions of the T queries and S keys (causal uses them); empty means bottom-right
  /// aligned, queries at S - T to S - 1 and keys at 0 to S - 1. @{
  std::vector<std::int64_t> q_pos, k_pos;
  /// @}
  /// SPEC 3.5 key padding: sample b has key_lengths[b] real keys (the first ones).
  std::vector<std::int64_t> key_lengths;
  /// SPEC 3.7 packed documents: query i sees key j only if q_doc[b, i] == k_doc[b, j]; T
  /// entries (shared by the batch) or B T, and S or B S. @{
  std::vector<std::int64_t> q_doc, k_doc;
  /// @}
  /// SPEC 8 streaming source: key j visible to query i iff arrival[b, j] <= query_time[b, i];
  /// S or B S entries, and T or B T. @{
  std::vector<std::int64_t> arrival, query_time;
  /// @}
  /// A user mask given as data (nothing to derive): B H T S bytes, 1 = allowed.
  std::vector<unsigned char> mask;
};
/// The allowed sets [B, H, T, S] (0/1 bytes) of `a` from the definitions. Field sizes that do
/// not fit B, H, T, S are a ShapeError naming the field.
std::vector<unsigned char> allowed_sets(const AllowedSets& a, std::size_t B, std::size_t H, std::size_t T,
                                        std::size_t S);

/// A full attention layer (5.18)-(5.23), (5.29)-(5.31): separate W_Q, W_K, W_V (in x out),
/// optional biases (undefined = none), W_O, b_O. Self-attention passes the same X as X_q and
/// X_m and adds the two input gradients (5.31).
struct Layer {
  /// Projection weights and biases (biases undefined = none). @{
  Array W_Q, W_K, W_V, b_Q, b_K, b_V, W_O, b_O;
  /// @}
  /// Query heads, key/value heads, head width. @{
  std::size_t H_q = 1, H_kv = 1, d_h = 1;
  /// @}
};
/// The output and every gradient of layer().
struct LayerGrads {
  Array Y;  ///< The layer output.
  /// X_q_bar = Q_bar W_Q^T, X_m_bar = K_bar W_K^T + V_bar W_V^T (5.30). @{
  Array X_q_bar, X_m_bar;
  /// @}
  /// Parameter gradients (5.29), and those of W_O and b_O. @{
  Array W_Q_bar, W_K_bar, W_V_bar, b_Q_bar, b_K_bar, b_V_bar, W_O_bar, b_O_bar;
  /// @}
};
/// The layer `p` on X_q [B, T, d_q] and X_m [B, S, d_m], with `allowed`, `query_valid`,
/// `soft`, `scale` and `drop` as for sdpa(), and Y_bar = dL/dY.
LayerGrads layer(const Layer& p, const Array& X_q, const Array& X_m, const std::vector<unsigned char>& allowed,
                 const BoolArray& query_valid, const Array& soft, double scale, const Array& drop, const Array& Y_bar);

}  // namespace xg::checks::reference
