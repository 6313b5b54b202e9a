// Algorithm 5.1, batched. Order of work:
//   1. checks: ranks, Q/K widths, K/V lengths, H_q % H_kv, finite inputs      (step 1)
//   2. allowed sets expanded to [B, H_q, T, S]; a valid query with an empty set is a
//      VisibilityError naming batch, head and query                            (step 2)
//   3. U = Q K^T * scale with query heads grouped per kv head (5.36); a non-finite score of
//      a visible key of a valid query is an error, others are set to 0 (unused)  (step 3)
//   4. A = softmax(U + M): M is 0 / -inf / soft bias; rows of invalid queries get M = 0
//      so their softmax is finite (never -inf - -inf = NaN)                     (steps 3-5)
//   5. optional dropout on A with a saved mask (SPEC 2)
//   6. O = A V; invalid rows selected to exact zero (select, not multiply)     (step 5;
//      invalid rows stay zero as in step 2)
#include <xgrad/nn/sdpa.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/mask.hpp>
#include <xgrad/ops/matmul.hpp>
#include <xgrad/ops/shape_ops.hpp>
#include <xgrad/ops/softmax.hpp>

namespace xg::nn {

namespace {

const char* kOp = "attention";

std::string index_str(const Shape& s, std::size_t flat) { return "(" + index_list(unravel_index(flat, s)) + ")"; }

void check_finite(const Array& a, const std::string& name, const std::string& why) {
  const std::size_t i = a.first_nonfinite();
  if (i == a.size()) return;
  throw ValueError(op_message(kOp, name + " has " + std::to_string(a.flat(i)) + " at index " +
                                       index_str(a.shape(), i) + "; " + why));
}

std::string shapes(const Tensor& a, const char* an, const Tensor& b, const char* bn) {
  return std::string(an) + " has shape " + shape_str(a.shape()) + ", " + bn + " has shape " +
         shape_str(b.shape());
}

// Algorithm 5.1 step 3 on the composed path's scores U [B, H, T, S]: throws at the first
// non-finite score of a visible key of a valid query (`valid(b, i)`). Called only when U has
// a non-finite value somewhere.
template <class Valid> void check_used_scores(const Array& U, const VisibilityPlan& plan, const Valid& valid) {
  const Shape& s = U.shape();
  const std::size_t B = s[0], H = s[1], T = s[2], S = s[3];
  std::vector<double> allowed(S);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t h = 0; h < H; ++h)
      for (std::size_t i = 0; i < T; ++i) {
        if (!valid(b, i)) continue;
        std::size_t lo = 0, hi = 0;
        const bool exact = plan.range(b, h, i, lo, hi);
        bool have_allowed = exact;  // allowed[] filled for this row (not needed when exact)
        for (std::size_t j = lo; j < hi; ++j) {
          const double v = U.flat(((b * H + h) * T + i) * S + j);
          if (std::isfinite(v)) continue;
          if (!have_allowed) {  // which keys of [lo, hi) are visible: apply() sets the others to -inf
            std::fill(allowed.begin(), allowed.begin() + (hi - lo), 0.0);
            plan.apply(b, h, i, lo, hi, allowed.data());
            have_allowed = true;
          }
          if (!exact && allowed[j - lo] == -std::numeric_limits<double>::infinity()) continue;
          throw ValueError(op_message(kOp, "score U has " + std::to_string(v) + " at batch " + std::to_string(b) +
                                               ", head " + std::to_string(h) + ", query " + std::to_string(i) +
                                               ", key " + std::to_string(j) +
                                               "; a non-finite score is a numerical error (Algorithm 5.1 step 3)"));
        }
      }
}

// Step 1's checks of the options (after those of the shapes); returns the scale, and whether
// dropout applies in `dropout`.
double check_options(std::size_t B, std::size_t T, std::size_t d_k, const SdpaOptions& opts, bool& dropout) {
  const double scale = opts.scale.value_or(1.0 / std::sqrt(static_cast<double>(d_k)));
  if (!(std::isfinite(scale) && scale > 0.0))  // 0 would ignore Q and K: refused (docs/reliability.md)
    throw ValueError(op_message(kOp, "scale must be finite and > 0, got " + std::to_string(scale)));
  dropout = opts.training && opts.dropout_p > 0.0;
  if (!(opts.dropout_p >= 0.0 && opts.dropout_p < 1.0))
    throw ValueError(op_message(kOp, "dropout_p must be in [0, 1), got " + std::to_string(opts.dropout_p)));
  if (dropout && !opts.generator)
    throw ValueError(op_message(kOp, "dropout_p > 0 in training needs a generator"));
  if (opts.query_valid.size() > 0 && opts.query_valid.shape != Shape{B, T})
    throw ShapeError(op_message(kOp, "query_valid must be [B, T] = " + shape_str({B, T}) + ", has shape " +
                                         shape_str(opts.query_valid.shape)));
  return scale;
}

// The fused kernel's options; draws the dropout seed into res.
FlashOptions flash_options(const SdpaOptions& opts, double scale, bool dropout, SdpaResult& res) {
  FlashOptions fo;
  fo.scale = scale;
  fo.query_valid = opts.query_valid;
  fo.check_finite = opts.check_finite;
  res.path = SdpaImpl::fused;
  if (dropout) {
    fo.dropout_p = opts.dropout_p;
    fo.dropout_seed = res.dropout_seed = opts.generator->next_u64();
    fo.dropout_row_offset = ops::dropout_row_offset();
  }
  return fo;
}

// The sizes of Q [B, H_q, T, d_k], K [B, H_kv, S, d_k] and V [B, H_kv, S, d_v].
struct Dims {
  std::size_t B, H_q, T, d_k, H_kv, S, d_v;
};

// Step 1's checks of Q, K and V: defined, rank 4, one dtype, sizes that agree, H_q a multiple
// of H_kv, d_k > 0. Returns their sizes.
Dims check_operands(const Tensor& Q, const Tensor& K, const Tensor& V) {
  for (const auto& [name, t] : {std::pair<const char*, const Tensor&>{"Q", Q}, {"K", K}, {"V", V}}) {
    if (!t.defined()) throw ValueError(op_message(kOp, std::string(name) + " is undefined"));
    if (t.ndim() != 4)
      throw ShapeError(op_message(kOp, std::string(name) + " must be [B, H, length, width], has shape " +
                                           shape_str(t.shape())));
  }
  if (Q.dtype() != K.dtype() || K.dtype() != V.dtype())
    throw DTypeError(op_message(kOp, std::string("dtypes differ: Q is ") + dtype_name(Q.dtype()) + ", K is " +
                                         dtype_name(K.dtype()) + ", V is " + dtype_name(V.dtype())));
  const std::size_t B = Q.shape()[0], H_q = Q.shape()[1], T = Q.shape()[2], d_k = Q.shape()[3];
  const std::size_t H_kv = K.shape()[1], S = K.shape()[2], d_v = V.shape()[3];
  if (K.shape()[0] != B || V.shape()[0] != B)
    throw ShapeError(op_message(kOp, "batch sizes differ: " + shapes(Q, "Q", K, "K") + ", V has shape " +
                                         shape_str(V.shape())));
  if (K.shape()[3] != d_k)
    throw ShapeError(op_message(kOp, "Q and K widths (d_k) differ: " + shapes(Q, "Q", K, "K")));
  if (V.shape()[2] != S)
    throw ShapeError(op_message(kOp, "K and V lengths (S) differ: " + shapes(K, "K", V, "V")));
  if (V.shape()[1] != H_kv)
    throw ShapeError(op_message(kOp, "K and V head counts (H_kv) differ: " + shapes(K, "K", V, "V")));
  if (H_kv == 0 || H_q % H_kv != 0)
    throw ShapeError(op_message(kOp, "H_q (" + std::to_string(H_q) + ") must be a multiple of H_kv (" +
                                         std::to_string(H_kv) + ")"));
  if (d_k == 0) throw ShapeError(op_message(kOp, "d_k is 0: Q has shape " + shape_str(Q.shape())));
  return {B, H_q, T, d_k, H_kv, S, d_v};
}

// Whether the fused kernel computes the call: when asked for, or automatically unless the
// weights A are wanted (only the composed path forms them).
bool takes_fused_path(const SdpaOptions& opts) {
  if (opts.impl == SdpaImpl::fused && opts.return_weights)
    throw ValueError(op_message(kOp, "the fused path does not form the weights A; request return_weights with "
                                     "impl = composed (or automatic, which then takes the composed path)"));
  return opts.impl == SdpaImpl::fused || (opts.impl == SdpaImpl::automatic && !opts.return_weights);
}

// The composed path: Algorithm 5.1 steps 2-6 from recorded ops (the tape differentiates them),
// on operands that passed step 1.
class ComposedPath {
 public:
  ComposedPath(const Tensor& Q, const Tensor& K, const Tensor& V, const Visibility& vis, const SdpaOptions& opts,
               const Dims& d, const VisibilityPlan& plan)
      : Q_(Q), K_(K), V_(V), vis_(vis), opts_(opts), d_(d), plan_(plan), BHTS_{d.B, d.H_q, d.T, d.S},
        any_validity_(opts.query_valid.size() > 0) {}

  SdpaResult run(double scale, bool dropout) const {
    const bool has_invalid = check_allowed_sets();
    const Tensor A = weights(scores(scale), has_invalid);

    // ---- 5. dropout on the weights
    SdpaResult res;
    res.path = SdpaImpl::composed;
    Tensor Ad = A;
    if (dropout) {
      res.dropout_seed = opts_.generator->next_u64();
      res.dropout_mask =
          attention_dropout_mask(BHTS_, opts_.dropout_p, res.dropout_seed, Q_.dtype(), ops::dropout_row_offset());
      Ad = ops::apply_dropout_mask(A, res.dropout_mask);
    }

    // ---- 6. O = A V, invalid rows selected to zero
    const std::size_t B = d_.B, H_q = d_.H_q, T = d_.T, S = d_.S, r = H_q / d_.H_kv;
    const auto L = [](std::size_t v) { return static_cast<long>(v); };
    Tensor O = ops::reshape(ops::matmul(ops::reshape(Ad, {L(B), L(d_.H_kv), L(r * T), L(S)}), V_),
                            {L(B), L(H_q), L(T), L(d_.d_v)});
    BoolArray row_valid;
    if (has_invalid) row_valid = BoolArray({B, 1, T, 1}, opts_.query_valid.data);
    const Tensor zero = ops::scalar_like(O, 0.0);
    res.output = has_invalid ? ops::where(row_valid, O, zero) : O;
    if (opts_.return_weights) res.weights = has_invalid ? ops::where(row_valid, A, zero) : A;
    return res;
  }

 private:
  bool valid(std::size_t b, std::size_t i) const { return !any_validity_ || opts_.query_valid.data[b * d_.T + i]; }

  // ---- 2. allowed sets and query validity: a valid query that sees no key is an error.
  // Returns whether some query is invalid.
  bool check_allowed_sets() const {
    const std::size_t B = d_.B, H_q = d_.H_q, T = d_.T;
    bool has_invalid = false;
    std::vector<double> row(d_.S);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t h = 0; h < H_q; ++h)
        for (std::size_t i = 0; i < T; ++i) {
          if (!valid(b, i)) {
            has_invalid = true;
            continue;
          }
          std::size_t lo = 0, hi = 0;
          const bool exact = plan_.range(b, h, i, lo, hi);
          bool any = lo < hi;
          if (any && !exact) {
            std::fill(row.begin(), row.begin() + (hi - lo), 0.0);
            plan_.apply(b, h, i, lo, hi, row.data());
            any = std::any_of(row.begin(), row.begin() + (hi - lo), [](double v) { return std::isfinite(v); });
          }
          if (!any)
            throw VisibilityError(op_message(kOp, "batch " + std::to_string(b) + ", head " + std::to_string(h) +
                                                      ", query " + std::to_string(i) +
                                                      " is valid but sees no key; check mask polarity and causal "
                                                      "offset, or mark the query invalid"));
        }
    return has_invalid;
  }

  // ---- 3. scores U = Q K^T * scale, query heads grouped per kv head (5.36)
  Tensor scores(double scale) const {
    const std::size_t B = d_.B, H_kv = d_.H_kv, T = d_.T, r = d_.H_q / H_kv;
    const auto L = [](std::size_t v) { return static_cast<long>(v); };
    const Tensor Qg = ops::reshape(Q_, {L(B), L(H_kv), L(r * T), L(d_.d_k)});
    Tensor U = ops::reshape(ops::matmul(Qg, K_, {false, true}), {L(B), L(d_.H_q), L(T), L(d_.S)}) * scale;
    if (opts_.check_finite && U.value().first_nonfinite() != U.value().size()) {
      // Step 3 checks the scores that are used: visible keys of valid queries (as the fused path
      // does). A non-finite score at a forbidden key or in an invalid row is not an error; it is
      // replaced by 0 so that U + M stays finite (inf + -inf would be NaN). Its weight is 0 or its
      // row is selected to zero either way, so the value does not matter.
      check_used_scores(U.value(), plan_, [this](std::size_t b, std::size_t i) { return valid(b, i); });
      const Array& u = U.value();
      BoolArray finite(u.shape(), std::vector<unsigned char>(u.size()));
      for (std::size_t k = 0; k < u.size(); ++k) finite.data[k] = std::isfinite(u.flat(k)) ? 1 : 0;
      U = ops::where(finite, U, ops::scalar_like(U, 0.0));
    }
    return U;
  }

  // ---- 4. A = masked softmax of the scores U over the key axis
  Tensor weights(Tensor U, bool has_invalid) const {
    if (!vis_.unconstrained() || has_invalid) {
      Array M = vis_.bias(Q_.dtype());
      if (has_invalid) {  // rows of invalid queries: M = 0, so their softmax is finite
        const std::size_t B = d_.B, H_q = d_.H_q, T = d_.T, S = d_.S;
        M = kernels::broadcast_to(M, BHTS_);
        for (std::size_t b = 0; b < B; ++b)
          for (std::size_t i = 0; i < T; ++i)
            if (!valid(b, i))
              for (std::size_t h = 0; h < H_q; ++h)
                for (std::size_t j = 0; j < S; ++j) M.set_flat(((b * H_q + h) * T + i) * S + j, 0.0);
      }
      U = ops::add_mask(U, M);
    }
    const Tensor A = ops::softmax(U, -1);
    if (opts_.check_finite && !vis_.unconstrained())  // a huge additive bias can overflow U + M to +inf
      check_finite(A.value(), "attention weight A", "the additive mask overflows the scores (U + M = +inf)");
    return A;
  }

  const Tensor &Q_, &K_, &V_;
  const Visibility& vis_;
  const SdpaOptions& opts_;
  const Dims& d_;
  const VisibilityPlan& plan_;
  const Shape BHTS_;
  const bool any_validity_;  // query_valid given: otherwise every query is valid
};

}  // namespace

bool packed_self_attention(const Tensor& P, std::size_t H_q, std::size_t H_kv, const Visibility& vis,
                           const SdpaOptions& opts, SdpaResult& out) {
  if (opts.return_weights || opts.impl == SdpaImpl::composed) return false;
  const std::size_t B = P.shape()[0], T = P.shape()[1], d = P.shape()[2] / (H_q + 2 * H_kv);
  bool dropout = false;
  const double scale = check_options(B, T, d, opts, dropout);
  // A non-finite input goes the split way, whose error names Q, K or V and the index there.
  if (opts.check_finite && P.value().first_nonfinite() != P.value().size()) return false;
  const VisibilityPlan plan = vis.plan(kOp, {B, H_q, T, T});
  SdpaResult res;
  const FlashOptions fo = flash_options(opts, scale, dropout, res);
  res.output = flash_attention_packed(P, H_q, H_kv, plan, fo);
  out = res;
  return true;
}

SdpaResult scaled_dot_product_attention(const Tensor& Q, const Tensor& K, const Tensor& V,
                                        const Visibility& vis, const SdpaOptions& opts) {
  // ---- 1. checks
  const Dims d = check_operands(Q, K, V);
  bool dropout = false;
  const double scale = check_options(d.B, d.T, d.d_k, opts, dropout);
  if (opts.check_finite) {
    const std::string why = "attention inputs must be finite (Algorithm 5.1 step 1; check_finite = false skips this)";
    check_finite(Q.value(), "Q", why);
    check_finite(K.value(), "K", why);
    check_finite(V.value(), "V", why);
  }
  const VisibilityPlan plan = vis.plan(kOp, {d.B, d.H_q, d.T, d.S});
  if (takes_fused_path(opts)) {
    SdpaResult res;
    const FlashOptions fo = flash_options(opts, scale, dropout, res);
    res.output = flash_attention(Q, K, V, plan, fo);
    return res;
  }
  return ComposedPath(Q, K, V, vis, opts, d, plan).run(scale, dropout);
}

Tensor attention(const Tensor& Q, const Tensor& K, const Tensor& V, const Visibility& vis,
                 const SdpaOptions& opts) {
  return scaled_dot_product_attention(Q, K, V, vis, opts).output;
}

}  // namespace xg::nn
