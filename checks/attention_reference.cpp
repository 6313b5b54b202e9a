#include <xgrad/checks/attention_reference.hpp>

#include <cmath>
#include <limits>
#include <string>

#include <xgrad/core/error.hpp>

namespace xg::checks::reference {

Mat matmul(const Mat& x, const Mat& y) {
  Mat z(x.rows, y.cols);
  for (std::size_t i = 0; i < x.rows; ++i)
    for (std::size_t k = 0; k < x.cols; ++k)
      for (std::size_t j = 0; j < y.cols; ++j) z(i, j) += x(i, k) * y(k, j);
  return z;
}

Mat transpose(const Mat& x) {
  Mat z(x.cols, x.rows);
  for (std::size_t i = 0; i < x.rows; ++i)
    for (std::size_t j = 0; j < x.cols; ++j) z(j, i) = x(i, j);
  return z;
}

HeadForward head_forward(const Head& h) {
  const std::size_t T = h.Q.rows, S = h.K.rows, d_v = h.V.cols;
  HeadForward f{Mat(T, S), Mat(T, S), Mat(T, S), Mat(T, d_v)};  // step 1: O, A start at zero
  for (std::size_t i = 0; i < T; ++i) {
    if (!h.valid[i]) continue;  // step 2: invalid query, row stays zero
    double c = -std::numeric_limits<double>::infinity();
    bool any = false;
    for (std::size_t j = 0; j < S; ++j) {
      if (!h.allowed[i * S + j]) continue;
      double u = 0;  // step 3
      for (std::size_t k = 0; k < h.Q.cols; ++k) u += h.Q(i, k) * h.K(j, k);
      u = u * h.scale + (h.soft.rows ? h.soft(i, j) : 0.0);
      f.U(i, j) = u;
      c = std::max(c, u);
      any = true;
    }
    if (!any) throw VisibilityError("[reference] query " + std::to_string(i) + " is valid but sees no key");
    double z = 0;  // step 4
    for (std::size_t j = 0; j < S; ++j)
      if (h.allowed[i * S + j]) z += std::exp(f.U(i, j) - c);
    for (std::size_t j = 0; j < S; ++j) {  // step 5; forbidden j take no part
      if (!h.allowed[i * S + j]) continue;
      f.A(i, j) = std::exp(f.U(i, j) - c) / z;
      f.Ad(i, j) = f.A(i, j) * (h.drop.rows ? h.drop(i, j) : 1.0);
      for (std::size_t k = 0; k < d_v; ++k) f.O(i, k) += f.Ad(i, j) * h.V(j, k);
    }
  }
  return f;
}

HeadGrads head_backward(const Head& h, const HeadForward& f, const Mat& G) {
  const std::size_t T = h.Q.rows, S = h.K.rows;
  HeadGrads g;
  g.V_bar = matmul(transpose(f.Ad), G);  // (5.26)
  g.R = matmul(G, transpose(h.V));       // (5.26), dL/dAd
  g.D = Mat(T, S);
  for (std::size_t i = 0; i < T; ++i) {
    if (!h.valid[i]) continue;  // invalid row: zero gradient along the constant branch
    double dot = 0;
    for (std::size_t r = 0; r < S; ++r)
      dot += f.A(i, r) * g.R(i, r) * (h.drop.rows ? h.drop(i, r) : 1.0);
    for (std::size_t j = 0; j < S; ++j)  // (5.27); forbidden: A = 0 so D = 0
      g.D(i, j) = f.A(i, j) * (g.R(i, j) * (h.drop.rows ? h.drop(i, j) : 1.0) - dot);
  }
  g.Q_bar = matmul(g.D, h.K);               // (5.28)
  g.K_bar = matmul(transpose(g.D), h.Q);
  for (double& v : g.Q_bar.a) v *= h.scale;
  for (double& v : g.K_bar.a) v *= h.scale;
  return g;
}

namespace {

// Matrix [rows, cols] at offset `off` of a float64 array.
Mat take(const Array& a, std::size_t off, std::size_t rows, std::size_t cols) {
  Mat m(rows, cols);
  const double* p = a.data<double>() + off;
  std::copy(p, p + rows * cols, m.a.begin());
  return m;
}
void put(Array& a, std::size_t off, const Mat& m, bool add) {
  double* p = a.data<double>() + off;
  for (std::size_t i = 0; i < m.a.size(); ++i) p[i] = add ? p[i] + m.a[i] : m.a[i];
}
// Columns [c0, c0 + n) of m.
Mat cols(const Mat& m, std::size_t c0, std::size_t n) {
  Mat z(m.rows, n);
  for (std::size_t i = 0; i < m.rows; ++i)
    for (std::size_t j = 0; j < n; ++j) z(i, j) = m(i, c0 + j);
  return z;
}
void put_cols(Mat& m, std::size_t c0, const Mat& x, bool add) {
  for (std::size_t i = 0; i < x.rows; ++i)
    for (std::size_t j = 0; j < x.cols; ++j) m(i, c0 + j) = (add ? m(i, c0 + j) : 0.0) + x(i, j);
}
Mat add_bias(Mat m, const Array& b) {
  if (!b.defined()) return m;
  for (std::size_t i = 0; i < m.rows; ++i)
    for (std::size_t j = 0; j < m.cols; ++j) m(i, j) += b.flat(j);
  return m;
}
Mat as_mat(const Array& a) { return take(a, 0, a.shape()[0], a.shape()[1]); }
Array as_array(const Mat& m) { return Array::from_vector({m.rows, m.cols}, m.a, DType::float64); }
void add_colsum(Array& b, const Mat& m) {
  for (std::size_t i = 0; i < m.rows; ++i)
    for (std::size_t j = 0; j < m.cols; ++j) b.set_flat(j, b.flat(j) + m(i, j));
}

struct HeadPlan {
  std::size_t B, H_q, H_kv, T, S;
};

// Runs one head (b, h) given its Q, K, V matrices; returns forward and grads.
Head make_head(const Mat& Q, const Mat& K, const Mat& V, std::size_t b, std::size_t h, const HeadPlan& p,
               const std::vector<unsigned char>& allowed, const BoolArray& query_valid, const Array& soft, double scale,
               const Array& drop) {
  Head hd;
  hd.Q = Q;
  hd.K = K;
  hd.V = V;
  hd.scale = scale;
  const std::size_t TS = p.T * p.S, off = (b * p.H_q + h) * TS;
  hd.allowed.assign(allowed.begin() + static_cast<long>(off), allowed.begin() + static_cast<long>(off + TS));
  hd.valid.assign(p.T, 1);
  if (query_valid.size())
    for (std::size_t i = 0; i < p.T; ++i) hd.valid[i] = query_valid.data[b * p.T + i];
  if (soft.defined()) hd.soft = take(soft, off, p.T, p.S);
  if (drop.defined()) hd.drop = take(drop, off, p.T, p.S);
  return hd;
}

}  // namespace

std::vector<unsigned char> allowed_sets(const AllowedSets& a, std::size_t B, std::size_t H, std::size_t T,
                                        std::size_t S) {
  auto fits = [](const std::vector<std::int64_t>& v, std::size_t n, std::size_t Bn, const char* name) {
    if (!v.empty() && v.size() != n && v.size() != Bn * n)
      throw ShapeError("[reference] allowed_sets: " + std::string(name) + " has " + std::to_string(v.size()) +
                       " entries, expected " + std::to_string(n) + " or " + std::to_string(Bn * n));
  };
  fits(a.q_pos, T, 1, "q_pos");
  fits(a.k_pos, S, 1, "k_pos");
  fits(a.key_lengths, B, 1, "key_lengths");
  fits(a.q_doc, T, B, "q_doc");
  fits(a.k_doc, S, B, "k_doc");
  fits(a.arrival, S, B, "arrival");
  fits(a.query_time, T, B, "query_time");
  if (a.q_doc.empty() != a.k_doc.empty())
    throw ShapeError("[reference] allowed_sets: q_doc and k_doc must be given together");
  if (a.arrival.empty() != a.query_time.empty())
    throw ShapeError("[reference] allowed_sets: arrival and query_time must be given together");
  if (!a.mask.empty() && a.mask.size() != B * H * T * S)
    throw ShapeError("[reference] allowed_sets: mask has " + std::to_string(a.mask.size()) + " entries, expected " +
                     std::to_string(B * H * T * S));
  // Element b of a per-sample or shared list of n entries.
  auto at = [](const std::vector<std::int64_t>& v, std::size_t n, std::size_t b, std::size_t k) {
    return v.size() == n ? v[k] : v[b * n + k];
  };
  auto qpos = [&](std::size_t i) {
    return a.q_pos.empty() ? static_cast<std::int64_t>(S) - static_cast<std::int64_t>(T) + static_cast<std::int64_t>(i)
                           : a.q_pos[i];
  };
  auto kpos = [&](std::size_t j) { return a.k_pos.empty() ? static_cast<std::int64_t>(j) : a.k_pos[j]; };
  std::vector<unsigned char> out(B * H * T * S);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i)
        for (std::size_t j = 0; j < S; ++j) {
          bool ok = true;
          if (a.causal) ok = ok && kpos(j) <= qpos(i);                                               // (5.12)
          if (!a.key_lengths.empty()) ok = ok && static_cast<std::int64_t>(j) < a.key_lengths[b];    // SPEC 3.5
          if (!a.q_doc.empty()) ok = ok && at(a.q_doc, T, b, i) == at(a.k_doc, S, b, j);             // SPEC 3.7
          if (!a.arrival.empty()) ok = ok && at(a.arrival, S, b, j) <= at(a.query_time, T, b, i);    // SPEC 8
          const std::size_t k = ((b * H + h) * T + i) * S + j;
          if (!a.mask.empty()) ok = ok && a.mask[k] != 0;
          out[k] = ok;
        }
  return out;
}

Sdpa sdpa(const Array& Q, const Array& K, const Array& V, const std::vector<unsigned char>& allowed,
          const BoolArray& query_valid, const Array& soft, double scale, const Array& drop, const Array& G) {
  const HeadPlan p{Q.shape()[0], Q.shape()[1], K.shape()[1], Q.shape()[2], K.shape()[2]};
  const std::size_t d_k = Q.shape()[3], d_v = V.shape()[3], r = p.H_q / p.H_kv;
  Sdpa out{Array::zeros({p.B, p.H_q, p.T, d_v}, DType::float64), Array::zeros({p.B, p.H_q, p.T, p.S}, DType::float64),
           Array::zeros({p.B, p.H_q, p.T, p.S}, DType::float64), Array::zeros(Q.shape(), DType::float64),
           Array::zeros(K.shape(), DType::float64), Array::zeros(V.shape(), DType::float64)};
  for (std::size_t b = 0; b < p.B; ++b)
    for (std::size_t h = 0; h < p.H_q; ++h) {
      const std::size_t g = h / r;  // (5.36)
      const std::size_t qo = (b * p.H_q + h) * p.T, ko = (b * p.H_kv + g) * p.S;
      const Head hd = make_head(take(Q, qo * d_k, p.T, d_k), take(K, ko * d_k, p.S, d_k), take(V, ko * d_v, p.S, d_v),
                                b, h, p, allowed, query_valid, soft, scale, drop);
      const HeadForward f = head_forward(hd);
      const HeadGrads gr = head_backward(hd, f, take(G, qo * d_v, p.T, d_v));
      put(out.O, qo * d_v, f.O, false);
      put(out.A, qo * p.S, f.A, false);
      put(out.D, qo * p.S, gr.D, false);
      put(out.Q_bar, qo * d_k, gr.Q_bar, false);
      put(out.K_bar, ko * d_k, gr.K_bar, true);  // group sum over query heads sharing kv head g
      put(out.V_bar, ko * d_v, gr.V_bar, true);
    }
  return out;
}

LayerGrads layer(const Layer& w, const Array& X_q, const Array& X_m, const std::vector<unsigned char>& allowed,
                 const BoolArray& query_valid, const Array& soft, double scale, const Array& drop, const Array& Y_bar) {
  const std::size_t B = X_q.shape()[0], T = X_q.shape()[1], d_q = X_q.shape()[2];
  const std::size_t S = X_m.shape()[1], d_m = X_m.shape()[2], d_h = w.d_h, r = w.H_q / w.H_kv;
  const std::size_t d_out = w.W_O.shape()[1];
  const HeadPlan p{B, w.H_q, w.H_kv, T, S};
  const Mat W_Q = as_mat(w.W_Q), W_K = as_mat(w.W_K), W_V = as_mat(w.W_V), W_O = as_mat(w.W_O);
  LayerGrads out;
  out.Y = Array::zeros({B, T, d_out}, DType::float64);
  out.X_q_bar = Array::zeros(X_q.shape(), DType::float64);
  out.X_m_bar = Array::zeros(X_m.shape(), DType::float64);
  Mat WQb(d_q, w.H_q * d_h), WKb(d_m, w.H_kv * d_h), WVb(d_m, w.H_kv * d_h), WOb(w.H_q * d_h, d_out);
  out.b_Q_bar = Array::zeros({w.H_q * d_h}, DType::float64);
  out.b_K_bar = Array::zeros({w.H_kv * d_h}, DType::float64);
  out.b_V_bar = Array::zeros({w.H_kv * d_h}, DType::float64);
  out.b_O_bar = Array::zeros({d_out}, DType::float64);
  for (std::size_t b = 0; b < B; ++b) {
    const Mat Xq = take(X_q, b * T * d_q, T, d_q), Xm = take(X_m, b * S * d_m, S, d_m);
    const Mat Q = add_bias(matmul(Xq, W_Q), w.b_Q), K = add_bias(matmul(Xm, W_K), w.b_K),
              V = add_bias(matmul(Xm, W_V), w.b_V);  // (5.2)
    Mat C(T, w.H_q * d_h), Qb(T, w.H_q * d_h), Kb(S, w.H_kv * d_h), Vb(S, w.H_kv * d_h);
    std::vector<Head> heads;
    std::vector<HeadForward> fwd;
    for (std::size_t h = 0; h < w.H_q; ++h) {
      const std::size_t g = h / r;
      heads.push_back(make_head(cols(Q, h * d_h, d_h), cols(K, g * d_h, d_h), cols(V, g * d_h, d_h), b, h, p, allowed,
                                query_valid, soft, scale, drop));
      fwd.push_back(head_forward(heads.back()));
      put_cols(C, h * d_h, fwd.back().O, false);  // C = concat_h O^(h) (5.20)
    }
    const Mat Y = add_bias(matmul(C, W_O), w.b_O);
    put(out.Y, b * T * d_out, Y, false);
    const Mat Yb = take(Y_bar, b * T * d_out, T, d_out);
    const Mat WOb_b = matmul(transpose(C), Yb);  // W_O_bar = C^T Y_bar
    for (std::size_t i = 0; i < WOb.a.size(); ++i) WOb.a[i] += WOb_b.a[i];
    if (w.b_O.defined()) add_colsum(out.b_O_bar, Yb);
    const Mat Cb = matmul(Yb, transpose(W_O));  // C_bar = Y_bar W_O^T, split by heads
    for (std::size_t h = 0; h < w.H_q; ++h) {
      const std::size_t g = h / r;
      const HeadGrads gr = head_backward(heads[h], fwd[h], cols(Cb, h * d_h, d_h));
      put_cols(Qb, h * d_h, gr.Q_bar, false);
      put_cols(Kb, g * d_h, gr.K_bar, true);  // GQA group sum
      put_cols(Vb, g * d_h, gr.V_bar, true);
    }
    // (5.29) projection gradients, (5.30) input gradients
    auto acc = [](Mat& into, const Mat& x) {
      for (std::size_t i = 0; i < into.a.size(); ++i) into.a[i] += x.a[i];
    };
    acc(WQb, matmul(transpose(Xq), Qb));
    acc(WKb, matmul(transpose(Xm), Kb));
    acc(WVb, matmul(transpose(Xm), Vb));
    if (w.b_Q.defined()) add_colsum(out.b_Q_bar, Qb);
    if (w.b_K.defined()) add_colsum(out.b_K_bar, Kb);
    if (w.b_V.defined()) add_colsum(out.b_V_bar, Vb);
    put(out.X_q_bar, b * T * d_q, matmul(Qb, transpose(W_Q)), false);
    Mat Xmb = matmul(Kb, transpose(W_K));
    acc(Xmb, matmul(Vb, transpose(W_V)));
    put(out.X_m_bar, b * S * d_m, Xmb, false);
  }
  out.W_Q_bar = as_array(WQb);
  out.W_K_bar = as_array(WKb);
  out.W_V_bar = as_array(WVb);
  out.W_O_bar = as_array(WOb);
  return out;
}

}  // namespace xg::checks::reference
