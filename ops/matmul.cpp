// Forward: C = op(A) op(B) per batch element, op = identity or transpose (BLAS flags).
// VJP with G = C_bar (5.26 for O = A V):
//   op(A)_bar = G op(B)^T,   op(B)_bar = op(A)^T G,
// mapped back through op and summed over batch dimensions the input was broadcast along
// (BLAS beta = 1 accumulates straight into the input's matrix, no temporary copies).
// Second-order rule: the same products as recorded matmuls on the operands promoted to >= 2-d,
// then sum_to over broadcast batch axes and reshape back to a 1-d operand's shape; a 2-d b
// against a batched a (a linear layer) gets b_bar as one product with the batch folded into rows.
#include <xgrad/ops/matmul.hpp>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/check.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/detail/strided.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/shape_ops.hpp>

#include <algorithm>
#include <type_traits>

namespace xg::ops {

namespace {

struct Plan {
  bool ta = false, tb = false;
  std::size_t M = 0, N = 0, K = 0;
  Shape a2, b2;         // operands promoted to >= 2-d
  Shape batch;          // broadcast batch shape
  Shape out2;           // batch + [M, N]
  Shape out;            // result shape (1-d operands' dimension dropped)
  std::vector<std::size_t> a_mat, b_mat;  // per batch element: matrix index in a and b
  bool a_single = false, b_single = false;  // operand has exactly one matrix
  // float32 products with bfloat16 inputs (xg::set_matmul_dtype, as in effect when the forward
  // ran; the backward products use the same).
  bool bf16 = false;
};

// blas::gemm, or the bfloat16 product where the plan says so (float32 only).
template <class T>
void mm(const Plan& p, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
        std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  if constexpr (std::is_same<T, float>::value)
    if (p.bf16) return blas::gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  blas::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

std::size_t lda_of(const Plan& p) { return p.ta ? p.M : p.K; }
std::size_t ldb_of(const Plan& p) { return p.tb ? p.K : p.N; }

Plan make_plan(const Tensor& a, const Tensor& b, MatmulOptions o) {
  check::same_dtype("matmul", "a", a, "b", b);
  check::rank_at_least("matmul", "a", a, 1);
  check::rank_at_least("matmul", "b", b, 1);
  if ((a.ndim() == 1 && o.transpose_a) || (b.ndim() == 1 && o.transpose_b))
    throw ShapeError(op_message("matmul", "a 1-d operand cannot be transposed: a has shape " +
                                              shape_str(a.shape()) + ", b has shape " +
                                              shape_str(b.shape())));
  Plan p;
  p.ta = o.transpose_a;
  p.tb = o.transpose_b;
  p.a2 = a.shape();
  p.b2 = b.shape();
  if (a.ndim() == 1) p.a2.insert(p.a2.begin(), 1);
  if (b.ndim() == 1) p.b2.push_back(1);
  const std::size_t na = p.a2.size(), nb = p.b2.size();
  p.M = p.ta ? p.a2[na - 1] : p.a2[na - 2];
  p.K = p.ta ? p.a2[na - 2] : p.a2[na - 1];
  const std::size_t Kb = p.tb ? p.b2[nb - 1] : p.b2[nb - 2];
  p.N = p.tb ? p.b2[nb - 2] : p.b2[nb - 1];
  if (p.K != Kb) {
    std::string flags;
    if (p.ta || p.tb)
      flags = std::string(" (with ") + (p.ta ? "a transposed" : "") + (p.ta && p.tb ? ", " : "") +
              (p.tb ? "b transposed" : "") + ")";
    throw ShapeError(op_message("matmul", "inner dimensions differ: a has shape " +
                                              shape_str(a.shape()) + ", b has shape " +
                                              shape_str(b.shape()) + flags));
  }
  const Shape ba(p.a2.begin(), p.a2.end() - 2), bb(p.b2.begin(), p.b2.end() - 2);
  try {
    p.batch = broadcast_shapes("matmul", "a", ba, "b", bb);
  } catch (const ShapeError&) {
    throw ShapeError(op_message("matmul", "batch dimensions do not broadcast: a has shape " +
                                              shape_str(a.shape()) + ", b has shape " +
                                              shape_str(b.shape())));
  }
  p.out2 = p.batch;
  p.out2.push_back(p.M);
  p.out2.push_back(p.N);
  p.out = p.batch;
  if (a.ndim() > 1) p.out.push_back(p.M);
  if (b.ndim() > 1) p.out.push_back(p.N);
  // Matrix index of each batch element in a and b (0 strides on broadcast axes).
  const std::size_t nbatch = numel(p.batch);
  p.a_mat.resize(nbatch);
  p.b_mat.resize(nbatch);
  const auto sa = broadcast_strides(ba, p.batch), sb = broadcast_strides(bb, p.batch);
  detail::for_each_strided(p.batch, sa, sb, [&](std::size_t i, std::ptrdiff_t ia, std::ptrdiff_t ib) {
    p.a_mat[i] = static_cast<std::size_t>(ia);
    p.b_mat[i] = static_cast<std::size_t>(ib);
  });
  p.bf16 = a.dtype() == DType::float32 && effective_matmul_dtype() == MatmulDtype::bfloat16;
  p.a_single = numel(ba) == 1;
  p.b_single = numel(bb) == 1;
  return p;
}

template <class T> void forward(const Plan& p, const T* A, const T* B, T* C) {
  const std::size_t nbatch = p.a_mat.size();
  if (p.b_single && !p.ta && !p.a_single && nbatch > 0 && p.a_mat.back() == nbatch - 1) {
    // x W with a stack of x and one W: a single GEMM over all rows of a.
    mm(p, false, p.tb, nbatch * p.M, p.N, p.K, T(1), A, lda_of(p), B, ldb_of(p), T(0), C, p.N);
    return;
  }
  // One GEMM per batch element, spread over the pool (each writes its own C).
  detail::parallel_for(nbatch, 1, [&](std::size_t lo, std::size_t hi, std::size_t) {
    for (std::size_t i = lo; i < hi; ++i)
      mm(p, p.ta, p.tb, p.M, p.N, p.K, T(1), A + p.a_mat[i] * p.M * p.K, lda_of(p),
                 B + p.b_mat[i] * p.K * p.N, ldb_of(p), T(0), C + i * p.M * p.N, p.N);
  });
}

// True when batch element i reads matrix i of the operand (no broadcast): its gradient
// matrices are then written by one batch element each, in parallel.
bool one_to_one(const std::vector<std::size_t>& mat) {
  for (std::size_t i = 0; i < mat.size(); ++i)
    if (mat[i] != i) return false;
  return true;
}

// a_bar (in a's stored layout), accumulated over the batch elements that read each matrix.
// beta = 0 when every matrix of a is written by exactly one batch element (Ab need not be zeroed).
template <class T> void grad_a(const Plan& p, const T* G, const T* B, T* Ab) {
  const std::size_t nbatch = p.a_mat.size();
  const bool once = one_to_one(p.a_mat);
  const T beta = once ? T(0) : T(1);
  if (p.b_single && !p.ta && once && nbatch > 1) {
    // A stack of x against one W: every row of a at once, A_bar = G op(B)^T as one GEMM.
    mm(p, false, !p.tb, nbatch * p.M, p.K, p.N, T(1), G, p.N, B, ldb_of(p), T(0), Ab, p.K);
    return;
  }
  detail::parallel_for(nbatch, once ? 1 : nbatch, [&](std::size_t lo, std::size_t hi, std::size_t) {
  for (std::size_t i = lo; i < hi; ++i) {
    const T* Gi = G + i * p.M * p.N;
    const T* Bi = B + p.b_mat[i] * p.K * p.N;
    T* Ai = Ab + p.a_mat[i] * p.M * p.K;
    if (!p.ta)  // A [M,K]: A_bar = G op(B)^T
      mm(p, false, !p.tb, p.M, p.K, p.N, T(1), Gi, p.N, Bi, ldb_of(p), beta, Ai, p.K);
    else        // A [K,M]: A_bar = op(B) G^T
      mm(p, p.tb, true, p.K, p.M, p.N, T(1), Bi, ldb_of(p), Gi, p.N, beta, Ai, p.M);
  }
  });
}

template <class T> void grad_b(const Plan& p, const T* G, const T* A, T* Bb) {
  const std::size_t nbatch = p.a_mat.size();
  if (p.b_single && !p.ta && !p.a_single && nbatch > 0 && p.a_mat.back() == nbatch - 1) {
    const std::size_t rows = nbatch * p.M;  // all rows of a at once
    if (!p.tb)
      mm(p, true, false, p.K, p.N, rows, T(1), A, p.K, G, p.N, T(0), Bb, p.N);
    else
      mm(p, true, false, p.N, p.K, rows, T(1), G, p.N, A, p.K, T(0), Bb, p.K);
    return;
  }
  const bool once = one_to_one(p.b_mat);
  const T beta = once ? T(0) : T(1);
  detail::parallel_for(nbatch, once ? 1 : nbatch, [&](std::size_t lo, std::size_t hi, std::size_t) {
  for (std::size_t i = lo; i < hi; ++i) {
    const T* Gi = G + i * p.M * p.N;
    const T* Ai = A + p.a_mat[i] * p.M * p.K;
    T* Bi = Bb + p.b_mat[i] * p.K * p.N;
    if (!p.tb)  // B [K,N]: B_bar = op(A)^T G
      mm(p, !p.ta, false, p.K, p.N, p.M, T(1), Ai, lda_of(p), Gi, p.N, beta, Bi, p.N);
    else        // B [N,K]: B_bar = G^T op(A)
      mm(p, true, p.ta, p.N, p.K, p.M, T(1), Gi, p.N, Ai, lda_of(p), beta, Bi, p.K);
  }
  });
}

// The cotangents of a and b of the product planned by p (into cot[0], cot[1]): matmul's VJP,
// and linear's without its bias.
void product_cotangents(const Plan& p, const VjpContext& c, Cotangents& cot) {
  const Array& A = c.inputs[0];
  const Array& B = c.inputs[1];
  detail::dispatch(A.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* G = c.grad_output.data<T>();
    if (c.needs(0)) {
      // Zeroed only where gradients accumulate (a broadcast operand) or nothing is written.
      const bool written_once = one_to_one(p.a_mat) && p.N > 0 && p.M > 0 && p.K > 0;
      Array ga = written_once ? Array::empty(A.shape(), A.dtype()) : Array::zeros(A.shape(), A.dtype());
      if (p.N > 0 && p.M > 0 && p.K > 0) grad_a<T>(p, G, B.data<T>(), ga.data<T>());
      cot[0] = std::move(ga);
    }
    if (c.needs(1)) {
      const bool stacked = p.b_single && !p.ta && !p.a_single && !p.a_mat.empty() && p.a_mat.back() == p.a_mat.size() - 1;
      const bool written_once = (stacked || one_to_one(p.b_mat)) && p.N > 0 && p.M > 0 && p.K > 0;
      Array gb = written_once ? Array::empty(B.shape(), B.dtype()) : Array::zeros(B.shape(), B.dtype());
      if (p.N > 0 && p.M > 0 && p.K > 0) grad_b<T>(p, G, A.data<T>(), gb.data<T>());
      cot[1] = std::move(gb);
    }
  });
}

// C = op(a) op(b) as planned, into a new array of the plan's out2 shape.
Array product(const Plan& p, const Tensor& a, const Tensor& b) {
  Array out = Array::empty(p.out2, a.dtype());
  detail::dispatch(a.dtype(), [&](auto t) {
    using T = decltype(t);
    if (out.size() == 0) return;
    if (p.K == 0) {
      std::fill(out.data<T>(), out.data<T>() + out.size(), T(0));
      return;
    }
    forward<T>(p, a.value().data<T>(), b.value().data<T>(), out.data<T>());
  });
  return out;
}

// out[r, k] = res[r, k] + (out[r, k] + b[k]) (res null: out[r, k] + b[k]) over rows x N: linear's
// pass after its product, in a function of its own so that the loops vectorise (out is a new
// array, b and res are inputs: nothing aliases).
template <class T>
void add_bias_rows(T* __restrict out, const T* __restrict b, const T* __restrict res, std::size_t rows,
                   std::size_t N) {
  if (res)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t k = 0; k < N; ++k) out[r * N + k] = res[r * N + k] + (out[r * N + k] + b[k]);
  else
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t k = 0; k < N; ++k) out[r * N + k] = out[r * N + k] + b[k];
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, MatmulOptions opts) {
  auto plan = std::make_shared<const Plan>(make_plan(a, b, opts));
  Array out = product(*plan, a, b);
  if (plan->out != plan->out2) out = out.view(plan->out);
  return record("matmul", std::move(out), {a, b}, [plan](const VjpContext& c) {
    Cotangents cot(2);
    product_cotangents(*plan, c, cot);
    return cot;
  }, second_order([ta = opts.transpose_a, tb = opts.transpose_b](const DiffVjpContext& c) {
    const Tensor &a = c.inputs[0], &b = c.inputs[1];
    auto L = [](const Shape& s) { return std::vector<long>(s.begin(), s.end()); };
    Shape a2 = a.shape(), b2 = b.shape();
    if (a.ndim() == 1) a2.insert(a2.begin(), 1);
    if (b.ndim() == 1) b2.push_back(1);
    const std::size_t M = ta ? a2.back() : a2[a2.size() - 2];
    const std::size_t N = tb ? b2[b2.size() - 2] : b2.back();
    Shape out2 = broadcast_shapes("matmul", "a", Shape(a2.begin(), a2.end() - 2), "b", Shape(b2.begin(), b2.end() - 2));
    out2.push_back(M);
    out2.push_back(N);
    const Tensor A = a.ndim() == 1 ? reshape(a, L(a2)) : a;
    const Tensor B = b.ndim() == 1 ? reshape(b, L(b2)) : b;
    const Tensor G = reshape(c.grad_output, L(out2));
    DiffCotangents cot(2);
    if (c.needs(0)) {
      const Tensor full = ta ? matmul(B, G, {tb, true}) : matmul(G, B, {false, !tb});
      cot[0] = reshape(sum_to(full, a2), L(a.shape()));
    }
    if (c.needs(1)) {
      if (b2.size() == 2 && a2.size() > 2 && !ta) {
        // A batched against one matrix b (a linear layer): fold the batch axes into the rows, so
        // b's cotangent is one product over all rows, not per-batch products summed by sum_to.
        const long K = static_cast<long>(a2.back());
        const Tensor A2 = reshape(A, {-1, K}), G2 = reshape(G, {-1, static_cast<long>(N)});
        cot[1] = reshape(tb ? matmul(G2, A2, {true, false}) : matmul(A2, G2, {true, false}), L(b.shape()));
        return cot;
      }
      const Tensor full = tb ? matmul(G, A, {true, ta}) : matmul(A, G, {!ta, false});
      cot[1] = reshape(sum_to(full, b2), L(b.shape()));
    }
    return cot;
  }));
}

// Forward: the product as matmul computes it (one GEMM over all rows of x), then b (and the
// residual r) added to each row in place: out = r + ((x W) + b), the bits of matmul then add
// (then add). VJP: x_bar and W_bar as matmul's, b_bar = the column sums of g as add's
// (kernels::sum_to_shape), r_bar = g. Anything but x [..., K] (at least 2-d), W [K, N], b [N]
// and r of the output's shape, one dtype, goes to matmul and add, which report bad input.
Tensor linear(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& residual) {
  const bool has_r = residual.defined();
  if (!b.defined()) return has_r ? add(residual, matmul(x, W)) : matmul(x, W);
  const bool fused = x.defined() && W.defined() && x.ndim() >= 2 && W.ndim() == 2 && b.ndim() == 1 &&
                     x.dtype() == W.dtype() && b.dtype() == x.dtype() && x.shape().back() == W.shape()[0] &&
                     b.shape()[0] == W.shape()[1] &&
                     (!has_r || (residual.dtype() == x.dtype() && residual.ndim() == x.ndim() &&
                                 std::equal(x.shape().begin(), x.shape().end() - 1, residual.shape().begin()) &&
                                 residual.shape().back() == W.shape()[1]));
  if (!fused) return has_r ? add(residual, add(matmul(x, W), b)) : add(matmul(x, W), b);
  auto plan = std::make_shared<const Plan>(make_plan(x, W, {}));
  Array out = product(*plan, x, W);
  const std::size_t N = plan->N, rows = N ? out.size() / N : 0;
  detail::dispatch(x.dtype(), [&](auto t) {
    using T = decltype(t);
    T* po = out.data<T>();
    const T* pb = b.value().data<T>();
    const T* pr = has_r ? residual.value().data<T>() : nullptr;
    detail::parallel_for(rows, std::max<std::size_t>(1, (std::size_t{1} << 14) / std::max<std::size_t>(N, 1)),
                         [po, pb, pr, N](std::size_t lo, std::size_t hi, std::size_t) {
                           add_bias_rows(po + lo * N, pb, pr ? pr + lo * N : nullptr, hi - lo, N);
                         });
  });
  const auto vjp = [plan](const VjpContext& c) {
    Cotangents cot(c.inputs.size());
    product_cotangents(*plan, c, cot);
    if (c.needs(2)) cot[2] = kernels::sum_to_shape(c.grad_output, c.inputs[2].shape());
    if (c.inputs.size() == 4 && c.needs(3)) cot[3] = c.grad_output;
    return cot;
  };
  if (has_r)
    return record("linear", std::move(out), {x, W, b, residual}, vjp, second_order([](const DiffVjpContext& c) {
                    return composed_vjp(c, [](const std::vector<Tensor>& in) {
                      return add(in[3], add(matmul(in[0], in[1]), in[2]));
                    });
                  }));
  return record("linear", std::move(out), {x, W, b}, vjp, second_order([](const DiffVjpContext& c) {
                  return composed_vjp(c, [](const std::vector<Tensor>& in) { return add(matmul(in[0], in[1]), in[2]); });
                }));
}

}  // namespace xg::ops
