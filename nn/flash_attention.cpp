// The fused attention op: see nn/detail/flash_attention.hpp for the equations. Work is split into
// blocks of kBlock query rows of one head; each block reads only the key range its rows can
// see (VisibilityPlan::range), through two GEMMs forward and four backward (float64, and
// float32 without the tile kernels), or, for float32, by key tiles on the tile kernels of
// nn/detail/flash_tile.hpp (the "float32 tile path" below).
//
// Threads (core/parallel.hpp): the forward pass splits (batch, head, block) items; the
// backward pass splits (batch, kv head) groups, each owning its dK and dV, or, when there are
// fewer groups than threads, splits a group's blocks with per-chunk dK/dV summed in chunk
// order. Either way the partition depends only on the thread count: bit-identical results run
// to run for a fixed count.
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/nn/detail/flash_tile.hpp>
#include <xgrad/nn/kv_cache.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include <xgrad/core/detail/aligned_vector.hpp>
#include <xgrad/core/detail/amx_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/vmath.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/join.hpp>
#include <xgrad/ops/mask.hpp>
#include <xgrad/ops/matmul.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/shape_ops.hpp>
#include <xgrad/ops/softmax.hpp>
#include <xgrad/core/detail/storage.hpp>

namespace xg::nn {

namespace {

const char* kOp = "attention";
constexpr std::size_t kBlock = 128;  // query rows per block

// Dropout of the attention weights draws ops/dropout.hpp's counter-based mask (the one hash).
using ops::dropout_keep_threshold;

struct Geometry {
  std::size_t B = 0, Hq = 0, Hkv = 0, r = 1, T = 0, S = 0, dk = 0, dv = 0;
  std::size_t blocks() const { return (T + kBlock - 1) / kBlock; }
};

// Where element (b, h, t, c) of a [B, H, T, d] operand lives: base + b sb + h sh + t st + c. A
// contiguous [B, H, T, d] array has (H T d, T d, d); in the packed projection [B, T, W] of
// MultiHeadAttention a head's d columns sit at a fixed offset with (T W, d, W), so Q, K and V are
// read there in place. Gradients take their operand's layout, dO takes O's.
struct Layout {
  std::size_t sb = 0, sh = 0, st = 0;
  std::size_t at(std::size_t b, std::size_t h, std::size_t t) const { return b * sb + h * sh + t * st; }
};
Layout contiguous(std::size_t H, std::size_t T, std::size_t d) { return {H * T * d, T * d, d}; }

struct BlockRows;

// Everything a block needs, for one dtype.
template <class T> struct Problem {
  Geometry g;
  const T* Q = nullptr;
  const T* K = nullptr;
  const T* V = nullptr;
  Layout lq, lk, lv, lo;  // of Q (and dQ), K (dK), V (dV), O (dO)
  T scale = 1;
  const VisibilityPlan* plan = nullptr;
  const unsigned char* valid = nullptr;  // [B, T] or null (all valid)
  bool dropout = false;
  std::uint64_t seed = 0, threshold = 0, row_offset = 0;
  T inv_q = 1;
  bool check_finite = true;
  bool bf16 = false;  // float32 under bfloat16 mixed precision: the tile products on tile::bf16_choice()
  // Every block's rows when the visibility is the same for every head ([B, blocks], made once
  // per pass by share_block_rows), else null: plan_block then plans each (b, h, blk) itself.
  const BlockRows* shared_rows = nullptr;

  bool row_valid(std::size_t b, std::size_t i) const { return !valid || valid[b * g.T + i]; }
};

std::string where(std::size_t b, std::size_t h, std::size_t i) {
  return "batch " + std::to_string(b) + ", head " + std::to_string(h) + ", query " + std::to_string(i);
}

// Per-block row bookkeeping: visible key range of each row and the block's union [L, U).
struct BlockRows {
  std::size_t i0 = 0, rows = 0, L = 0, U = 0;
  std::size_t lo[kBlock], hi[kBlock];
  bool use[kBlock];    // valid and sees at least one key
  bool exact[kBlock];  // no per-key work inside [lo, hi)
  // Keys [full_lo, full_hi) are seen by every row of the block, with nothing to apply (every
  // row used and exact); empty otherwise. A tile inside needs no per-row look (tile_rows).
  std::size_t full_lo = 0, full_hi = 0;
};

template <class T> void plan_block(const Problem<T>& P, std::size_t b, std::size_t h, std::size_t blk, BlockRows& R) {
  if (P.shared_rows) {
    R = P.shared_rows[b * P.g.blocks() + blk];
    return;
  }
  R.i0 = blk * kBlock;
  R.rows = std::min(kBlock, P.g.T - R.i0);
  R.L = P.g.S;
  R.U = 0;
  for (std::size_t k = 0; k < R.rows; ++k) {
    const std::size_t i = R.i0 + k;
    R.use[k] = false;
    if (!P.row_valid(b, i)) continue;
    R.exact[k] = P.plan->range(b, h, i, R.lo[k], R.hi[k]);
    if (R.lo[k] >= R.hi[k])
      throw VisibilityError(op_message(kOp, where(b, h, i) + " is valid but sees no key; check mask polarity and "
                                                              "causal offset, or mark the query invalid"));
    R.use[k] = true;
    R.L = std::min(R.L, R.lo[k]);
    R.U = std::max(R.U, R.hi[k]);
  }
  if (R.L >= R.U) R.L = R.U = 0;
  std::size_t a = 0, e = P.g.S;
  for (std::size_t k = 0; k < R.rows && a < e; ++k) {
    if (!R.use[k] || !R.exact[k]) {  // (lo and hi are not set for a row not used)
      e = 0;
      break;
    }
    a = std::max(a, R.lo[k]);
    e = std::min(e, R.hi[k]);
  }
  R.full_lo = a < e ? a : 0;
  R.full_hi = a < e ? e : 0;
}

// When no visibility rule depends on the head, every head of a (b, blk) block has the same rows:
// they are planned once per pass into `rows` (in parallel; a row that sees no key is reported
// for head 0, as every head would be) and P's copy points at them.
template <class T> Problem<T> share_block_rows(const Problem<T>& P, std::vector<BlockRows>& rows) {
  Problem<T> out = P;
  if (P.g.Hq < 2 || !P.plan->head_independent()) return out;
  const std::size_t nb = P.g.blocks();
  rows.resize(P.g.B * nb);
  detail::parallel_for(rows.size(), 1, [&](std::size_t begin, std::size_t end, std::size_t) {
    for (std::size_t it = begin; it < end; ++it) plan_block(P, it / nb, 0, it % nb, rows[it]);
  });
  out.shared_rows = rows.data();
  return out;
}

// True when every value is finite: x * 0 is NaN exactly for inf and NaN (a vectorisable sum).
template <class T> bool all_finite(const T* x, std::size_t n) {
  T acc = 0;
  for (std::size_t j = 0; j < n; ++j) acc += x[j] * T(0);
  return acc == T(0);
}

// Algorithm 5.1 step 3 on row k of a block (its scores `row`, key L + j at row[j]), which has a
// non-finite score somewhere in [lo_k, hi_k): throws at the first one at a visible key. Keys of
// the range that the visibility forbids are not checked (their score is never used).
template <class T>
void check_used_scores(const Problem<T>& P, std::size_t b, std::size_t h, const BlockRows& R, std::size_t k,
                       const T* row) {
  const std::size_t a = R.lo[k] - R.L, e = R.hi[k] - R.L;
  std::vector<T> allowed;
  if (!R.exact[k]) {  // which keys of the range are visible: apply() sets the others to -inf
    allowed.assign(e - a, T(0));
    P.plan->apply(b, h, R.i0 + k, R.lo[k], R.hi[k], allowed.data());
  }
  for (std::size_t j = a; j < e; ++j) {
    if (std::isfinite(row[j])) continue;
    if (!R.exact[k] && allowed[j - a] == -std::numeric_limits<T>::infinity()) continue;
    throw ValueError(op_message(kOp, "score U has " + std::to_string(row[j]) + " at " + where(b, h, R.i0 + k) +
                                         ", key " + std::to_string(R.L + j) +
                                         "; a non-finite score is a numerical error (Algorithm 5.1 step 3)"));
  }
}

// buf[k * n + (j - L)] = masked score of row k, key j, for j in [lo_k, hi_k); 0 elsewhere
// after the caller's softmax. Returns n = U - L.
template <class T>
std::size_t block_scores(const Problem<T>& P, std::size_t b, std::size_t h, const BlockRows& R, T* buf) {
  const Geometry& g = P.g;
  const std::size_t n = R.U - R.L, kvh = h / g.r;
  const T* Qb = P.Q + P.lq.at(b, h, R.i0);
  const T* Kr = P.K + P.lk.at(b, kvh, R.L);
  blas::gemm(false, true, R.rows, n, g.dk, P.scale, Qb, P.lq.st, Kr, P.lk.st, T(0), buf, n);
  for (std::size_t k = 0; k < R.rows; ++k) {
    if (!R.use[k]) continue;
    T* row = buf + k * n;
    const std::size_t a = R.lo[k] - R.L, e = R.hi[k] - R.L;
    if (P.check_finite && !all_finite(row + a, e - a)) check_used_scores(P, b, h, R, k, row);
    // Forbidden keys become -inf here whatever their score was (apply() assigns, not adds).
    if (!R.exact[k]) P.plan->apply(b, h, R.i0 + k, R.lo[k], R.hi[k], row + a);
  }
  return n;
}

// Row k of buf over [a, e) -> softmax weights exp((u - m) - log z); zero outside [a, e) within
// [0, n). m (a score, exact) and log z (in [0, log n]) are kept apart: their sum, the row's
// log-sum-exp, rounded to T would be off by up to half an ulp of m (3e-5 in float32 at m ~ 1e3),
// and every weight of the row would be scaled by exp of that error.
template <class T> void weights_row(T* row, std::size_t n, std::size_t a, std::size_t e, T m, T log_z) {
  for (std::size_t j = 0; j < a; ++j) row[j] = 0;
  for (std::size_t j = a; j < e; ++j) row[j] = (row[j] - m) - log_z;
  vmath::exp(row + a, row + a, e - a);
  for (std::size_t j = e; j < n; ++j) row[j] = 0;
}

template <class T> void dropout_row(const Problem<T>& P, std::size_t b, std::size_t h, std::size_t i, std::size_t L,
                                    const T* in, T* out, std::size_t n) {
  const std::uint64_t base = (((P.row_offset + b) * P.g.Hq + h) * P.g.T + i) * P.g.S + L;
  ops::dropout_draw<T>(P.seed, base, P.threshold, P.inv_q, in, out, n);
}

// Thread-local scratch that keeps its memory between calls (no page faults per call).
template <class T> T* scratch(detail::AlignedVector<T>& v, std::size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

template <class T>
void forward_block(const Problem<T>& P, std::size_t b, std::size_t h, std::size_t blk, T* O, T* row_max, T* log_z) {
  thread_local detail::AlignedVector<T> s_buf, d_buf;
  BlockRows R;
  plan_block(P, b, h, blk, R);
  const Geometry& g = P.g;
  const std::size_t row0 = (b * g.Hq + h) * g.T + R.i0;
  if (R.U == R.L) return;  // no row of the block uses any key: O rows stay zero
  const std::size_t n = R.U - R.L;
  T* buf = scratch(s_buf, R.rows * n);
  block_scores(P, b, h, R, buf);
  for (std::size_t k = 0; k < R.rows; ++k) {
    T* row = buf + k * n;
    if (!R.use[k]) {
      std::fill(row, row + n, T(0));
      continue;
    }
    const std::size_t a = R.lo[k] - R.L, e = R.hi[k] - R.L;
    T m = -std::numeric_limits<T>::infinity();
    for (std::size_t j = a; j < e; ++j) m = std::max(m, row[j]);
    if (m == -std::numeric_limits<T>::infinity())
      throw VisibilityError(op_message(kOp, where(b, h, R.i0 + k) + " is valid but sees no key; check mask polarity "
                                                                      "and causal offset, or mark the query invalid"));
    if (!std::isfinite(m))
      throw ValueError(op_message(kOp, "score plus bias is " + std::to_string(m) + " at " + where(b, h, R.i0 + k) +
                                           "; the additive bias overflows the scores (Algorithm 5.1 step 3)"));
    for (std::size_t j = a; j < e; ++j) row[j] -= m;
    vmath::exp(row + a, row + a, e - a);
    T z = 0;
    for (std::size_t j = a; j < e; ++j) z += row[j];
    const T inv = T(1) / z;
    for (std::size_t j = 0; j < a; ++j) row[j] = 0;
    for (std::size_t j = a; j < e; ++j) row[j] *= inv;
    for (std::size_t j = e; j < n; ++j) row[j] = 0;
    row_max[row0 + k] = m;
    log_z[row0 + k] = std::log(z);
  }
  const T* A = buf;
  if (P.dropout) {
    T* d = scratch(d_buf, R.rows * n);
    for (std::size_t k = 0; k < R.rows; ++k) dropout_row(P, b, h, R.i0 + k, R.L, buf + k * n, d + k * n, n);
    A = d;
  }
  const T* Vr = P.V + P.lv.at(b, h / g.r, R.L);
  blas::gemm(false, false, R.rows, g.dv, n, T(1), A, n, Vr, P.lv.st, T(0), O + P.lo.at(b, h, R.i0), P.lo.st);
}

// Gradients of one block of head h; dK, dV point at the (b, h / r) group's [S, d] matrices, rows
// ldk, ldv apart.
template <class T>
void backward_block(const Problem<T>& P, std::size_t b, std::size_t h, std::size_t blk, const T* row_max,
                    const T* log_z, const T* dO, T* dQ, T* dK, std::size_t ldk, T* dV, std::size_t ldv) {
  thread_local detail::AlignedVector<T> p_buf, pd_buf, dp_buf;
  BlockRows R;
  plan_block(P, b, h, blk, R);
  if (R.U == R.L) return;
  const Geometry& g = P.g;
  const std::size_t row0 = (b * g.Hq + h) * g.T + R.i0;
  const std::size_t n = R.U - R.L;
  T* A = scratch(p_buf, R.rows * n);
  block_scores(P, b, h, R, A);
  for (std::size_t k = 0; k < R.rows; ++k) {
    if (!R.use[k]) {
      std::fill(A + k * n, A + (k + 1) * n, T(0));
      continue;
    }
    weights_row(A + k * n, n, R.lo[k] - R.L, R.hi[k] - R.L, row_max[row0 + k], log_z[row0 + k]);
  }
  const T* Ad = A;
  if (P.dropout) {
    T* d = scratch(pd_buf, R.rows * n);
    for (std::size_t k = 0; k < R.rows; ++k) dropout_row(P, b, h, R.i0 + k, R.L, A + k * n, d + k * n, n);
    Ad = d;
  }
  const std::size_t ldo = P.lo.st;
  const T* dOb = dO + P.lo.at(b, h, R.i0);
  const T* Vr = P.V + P.lv.at(b, h / g.r, R.L);
  const T* Kr = P.K + P.lk.at(b, h / g.r, R.L);
  const T* Qb = P.Q + P.lq.at(b, h, R.i0);
  if (dV) blas::gemm(true, false, n, g.dv, R.rows, T(1), Ad, n, dOb, ldo, T(1), dV + R.L * ldv, ldv);
  if (!dQ && !dK) return;
  T* dA = scratch(dp_buf, R.rows * n);
  blas::gemm(false, true, R.rows, n, g.dv, T(1), dOb, ldo, Vr, P.lv.st, T(0), dA, n);  // dA_d = dO V^T
  for (std::size_t k = 0; k < R.rows; ++k) {
    T* da = dA + k * n;
    const T* a = A + k * n;
    if (!R.use[k]) {
      std::fill(da, da + n, T(0));
      continue;
    }
    if (P.dropout) dropout_row(P, b, h, R.i0 + k, R.L, da, da, n);  // dA = dA_d * m / q
    // delta_i = sum_j A_ij dA_ij (= dO_i . O_i, but summed as the softmax VJP (5.25) sums it, so a
    // row with one visible key, A = 1, gets dU = 1 * (dA - dA) = 0 exactly, as on the composed path).
    T D = 0;  // delta_i
    for (std::size_t j = 0; j < n; ++j) D += a[j] * da[j];
    for (std::size_t j = 0; j < n; ++j) da[j] = a[j] * (da[j] - D);  // dU (zero where A is)
  }
  if (dQ)
    blas::gemm(false, false, R.rows, g.dk, n, P.scale, dA, n, Kr, P.lk.st, T(0), dQ + P.lq.at(b, h, R.i0), P.lq.st);
  if (dK) blas::gemm(true, false, n, g.dk, R.rows, P.scale, dA, n, Qb, P.lq.st, T(1), dK + R.L * ldk, ldk);
}


// ---- float32 tile path (nn/detail/flash_tile.hpp): FlashAttention-2 style, the key range of a
// block walked in tiles of kTile keys. Per tile: S = scale Q_blk K_tile^T (K pre-transposed
// into Kt, so the tile kernel runs along the keys), visibility applied to S in place, the
// online softmax (running max m and sum l per row, O rescaled when m grows), and P V added into
// the block's output accumulator; nothing larger than a [kBlock, kTile] tile is formed. The
// backward pass recomputes P per tile from the saved m and log l, and uses delta_i = dO_i . O_i.
// float64 keeps the BLAS path above, bit for bit.
constexpr std::size_t kTile = 64;  // keys per tile

// K (or V) of every (b, kv head) group transposed into panels of kTile keys: panel p of a group
// holds keys [p kTile, (p + 1) kTile) as a [d, kTile] matrix (16 KiB for d = 64), zero beyond S,
// and one more zero panel closes the group. A tile's B operand is then one contiguous block
// (rows kTile apart) instead of d rows S floats apart: the tile products stay inside a few pages
// (on this Intel Xeon the d rows of a long sequence's [d, S] layout each sat on their own page).
std::size_t panels(std::size_t S) { return (S + kTile - 1) / kTile + 1; }
std::size_t group_floats(std::size_t S, std::size_t d) { return panels(S) * d * kTile; }
// Group gi's panels of X (laid out by `l` with Hkv heads) into t (group_floats(S, d) floats);
// the zeros beyond S and the closing panel only when `zeros` (t does not hold them already).
void transpose_group(const tile::Kernels& kz, const float* X, const Layout& l, std::size_t Hkv, std::size_t gi,
                     std::size_t S, std::size_t d, float* t, bool zeros) {
  for (std::size_t p = 0, np = panels(S); p < np; ++p) {
    const std::size_t k0 = p * kTile, nk = k0 < S ? std::min(kTile, S - k0) : 0;
    float* tp = t + p * d * kTile;
    if (nk) kz.transpose(X + l.at(gi / Hkv, gi % Hkv, k0), l.st, nk, d, tp, kTile);
    if (zeros && nk < kTile)
      for (std::size_t c = 0; c < d; ++c) std::fill(tp + c * kTile + nk, tp + (c + 1) * kTile, 0.0f);
  }
}

// Every group's panels, in parallel. `out` keeps its memory between calls (a thread_local of the
// caller): no page faults per call.
void transpose_groups(const tile::Kernels& kz, const float* X, const Layout& l, std::size_t Hkv, std::size_t groups,
                      std::size_t S, std::size_t d, detail::AlignedVector<float>& out) {
  const std::size_t gf = group_floats(S, d);
  if (out.size() < groups * gf) out.resize(groups * gf);
  detail::parallel_for(groups, 1, [&](std::size_t begin, std::size_t end, std::size_t) {
    for (std::size_t gi = begin; gi < end; ++gi) transpose_group(kz, X, l, Hkv, gi, S, d, out.data() + gi * gf, true);
  });
}

// One group's panels at a time, for a chunk that runs whole groups: transposed by the thread that
// then reads them (from its own cache, with no pass over every group and no wait for one before
// the blocks start). A thread's buffer keeps its memory and its zeros between groups and calls;
// they are written again only when the shape (S, d) changes.
class GroupPanels {
 public:
  const float* fill(const tile::Kernels& kz, const float* X, const Layout& l, std::size_t Hkv, std::size_t gi,
                    std::size_t S, std::size_t d) {
    const bool zeros = S != S_ || d != d_;
    if (zeros) {
      buf_.resize(group_floats(S, d));
      S_ = S;
      d_ = d;
    }
    transpose_group(kz, X, l, Hkv, gi, S, d, buf_.data(), zeros);
    return buf_.data();
  }

 private:
  detail::AlignedVector<float> buf_;
  std::size_t S_ = SIZE_MAX, d_ = SIZE_MAX;  // the shape whose zeros buf_ holds (none yet)
};

// The [d, kTile] B operand of keys kb0 .. kb0 + kTile of a group's panels Xt: the panel itself
// when kb0 is a multiple of kTile (always so when a block's key range starts at 0, as causal and
// full visibility do), else those columns of two neighbouring panels copied into `pack` (the same
// values: the products give the same bits either way).
const float* tile_operand(const float* Xt, std::size_t d, std::size_t kb0, float* pack) {
  const std::size_t p = kb0 / kTile, o = kb0 % kTile;
  const float* a = Xt + p * d * kTile;
  if (o == 0) return a;
  const float* b = a + d * kTile;
  for (std::size_t c = 0; c < d; ++c) {
    std::copy(a + c * kTile + o, a + (c + 1) * kTile, pack + c * kTile);
    std::copy(b + c * kTile, b + c * kTile + o, pack + c * kTile + (kTile - o));
  }
  return pack;
}

bool tile_path(const Geometry& g, const tile::Kernels* kz) {
  return kz && g.dk % kz->width == 0 && g.dv % kz->width == 0;
}

// Row k of a block over one tile's scores s (key kb0 + j at s[j], n keys): the visible part
// [ja, je) of the tile for that row (empty: ja == je), from R's range.
void tile_span(const BlockRows& R, std::size_t k, std::size_t kb0, std::size_t n, std::size_t& ja, std::size_t& je) {
  ja = je = 0;
  if (!R.use[k]) return;
  const std::size_t a = std::max(R.lo[k], kb0), e = std::min(R.hi[k], kb0 + n);
  if (a < e) {
    ja = a - kb0;
    je = e - kb0;
  }
}

// Algorithm 5.1 step 3 on the tile part [ja, je) of row k (key kb0 + j at s[j]): throws at the
// first non-finite score at a visible key (check_used_scores for one tile).
void check_tile_scores(const Problem<float>& P, std::size_t b, std::size_t h, const BlockRows& R, std::size_t k,
                       std::size_t kb0, std::size_t ja, std::size_t je, const float* s) {
  std::vector<float> allowed;
  if (!R.exact[k]) {
    allowed.assign(je - ja, 0.0f);
    P.plan->apply(b, h, R.i0 + k, kb0 + ja, kb0 + je, allowed.data());
  }
  for (std::size_t j = ja; j < je; ++j) {
    if (std::isfinite(s[j])) continue;
    if (!R.exact[k] && allowed[j - ja] == -std::numeric_limits<float>::infinity()) continue;
    throw ValueError(op_message(kOp, "score U has " + std::to_string(s[j]) + " at " + where(b, h, R.i0 + k) +
                                         ", key " + std::to_string(kb0 + j) +
                                         "; a non-finite score is a numerical error (Algorithm 5.1 step 3)"));
  }
}

// The rows [r0, r1) of a block that see a key of the tile kb0 .. kb0 + n (r0 == r1: none).
// Returns whether each of them sees all kTile keys of it with nothing to apply (R.exact): then the
// tile's scores need no visibility pass and no zeroed part.
bool tile_rows(const BlockRows& R, std::size_t kb0, std::size_t n, std::size_t& r0, std::size_t& r1) {
  if (n == kTile && R.full_lo <= kb0 && kb0 + kTile <= R.full_hi) {  // what the loops below find
    r0 = 0;
    r1 = R.rows;
    return true;
  }
  r0 = R.rows;
  r1 = 0;
  bool full = n == kTile;
  for (std::size_t k = 0; k < R.rows; ++k) {
    std::size_t ja, je;
    tile_span(R, k, kb0, n, ja, je);
    if (ja == je) continue;
    r0 = std::min(r0, k);
    r1 = k + 1;
    full = full && R.exact[k] && ja == 0 && je == kTile;
  }
  if (r0 >= r1) r0 = r1 = 0;
  // a row between r0 and r1 that sees nothing of the tile (possible with documents) is not full
  for (std::size_t k = r0; full && k < r1; ++k) {
    std::size_t ja, je;
    tile_span(R, k, kb0, n, ja, je);
    full = ja == 0 && je == kTile;
  }
  return full && r0 < r1;
}

std::atomic<std::uint64_t> g_partial_tiles[2];  // by PartialTilePath
std::atomic<bool> g_exact_parts{true};           // set_exact_parts
void count_partial_tile(PartialTilePath path) {
  g_partial_tiles[static_cast<int>(path)].fetch_add(1, std::memory_order_relaxed);
}

// A tile whose rows see different parts of it (the causal diagonal, a window's edges): the parts
// that rows [r0, r1) of block R see (tile_span), planned once per tile for the passes over it.
// By rows (rows()): chunks [a, e) of `chunk` rows, f(a, e, need) with need the end of their
// visible parts (the largest je; 0: none sees a key). A chunk's products stop there: the QK^T
// and dO V^T columns at need rounded up to the vector width, the PV and dS K sums after need
// keys. What they skip are zero weights and zero dS (the callers zero them), so each computed
// entry keeps its value: a sum of the same terms in the same order, less trailing zero terms
// (which change nothing but the sign of an exactly zero sum).
// By keys (keys(), for dV and dK, the sums over rows): chunks [j0, j1) of kChunk keys, f(j0, j1,
// lo, hi) with [lo, hi) the rows from the first to the last whose visible part meets the chunk
// (none: no call). The rows outside hold zero weights and zero dS at those keys: a sum that skips
// them is the same sum less leading and trailing zero terms (an FMA chain from +0 stays +0
// through the leading ones), so again each entry keeps its value.
constexpr std::size_t kChunk = 12;  // two micro-tiles of rows (the float32 kernels)
struct TileParts {
  static constexpr std::size_t kKeyChunks = (kTile + kChunk - 1) / kChunk;
  std::size_t r0 = 0, r1 = 0, n = 0;
  std::size_t ja[kBlock], je[kBlock];          // row k's part [ja[k], je[k]) of the tile, r0 <= k < r1
  std::size_t lo[kKeyChunks], hi[kKeyChunks];  // the rows that meet each chunk of keys

  // with_keys: the rows of each chunk of keys too (keys() needs them)
  void plan(const BlockRows& R, std::size_t kb0, std::size_t n_, std::size_t r0_, std::size_t r1_, bool with_keys) {
    r0 = r0_;
    r1 = r1_;
    n = n_;
    for (std::size_t k = r0; k < r1; ++k) tile_span(R, k, kb0, n, ja[k], je[k]);
    if (!with_keys) return;
    std::fill(lo, lo + kKeyChunks, r1);
    std::fill(hi, hi + kKeyChunks, r0);
    for (std::size_t k = r0; k < r1; ++k)
      for (std::size_t c = ja[k] / kChunk; ja[k] < je[k] && c * kChunk < je[k]; ++c) {
        lo[c] = std::min(lo[c], k);
        hi[c] = k + 1;
      }
  }
  template <class F> void rows(std::size_t chunk, F&& f) const {
    for (std::size_t a = r0; a < r1; a += chunk) {
      const std::size_t e = std::min(r1, a + chunk);
      std::size_t need = 0;
      for (std::size_t k = a; k < e; ++k) need = std::max(need, je[k]);
      f(a, e, need);
    }
  }
  template <class F> void keys(F&& f) const {
    for (std::size_t c = 0; c * kChunk < n; ++c)
      if (lo[c] < hi[c]) f(c * kChunk, std::min(n, (c + 1) * kChunk), lo[c], hi[c]);
  }
};

// Whether every row of [r0, r1) is used and exact (a visible part with nothing to apply in it).
bool exact_rows(const BlockRows& R, std::size_t r0, std::size_t r1) {
  for (std::size_t k = r0; k < r1; ++k)
    if (!R.use[k] || !R.exact[k]) return false;
  return true;
}
std::size_t round_up(std::size_t x, std::size_t w) { return (x + w - 1) / w * w; }

// ---- The products of one block's tiles: float32 kernels, or bfloat16 (AMX or dot products) ----
//
// forward_block_tiles, backward_block_tiles and tile_scores run every product through one of
// these (a template parameter): rows [a, e) of the block against keys kb0 .. kb0 + cols (or
// + need) of the tile. F32Products calls the float32 tile kernels as the op always has (the same
// calls, the same bits). Bf16Products runs them on AMX tiles, or with AVX512_BF16 dot products on the
// same layouts (tile::bf16_choice), with operands rounded to bfloat16:
// K and V of every group once per pass (GroupBf16), Q and dO once per block, and the weights
// and dU of a tile once per product; the score scale rides on the rounding of Q (forward and
// backward then see the same scores) and of dU.

// What both kinds of products read of block R of head h (batch b): its rows of Q and dO (null in
// the forward pass), its group's K and V, and their row strides. Per-row arrays (m, lz, D) are
// indexed by the block's row.
struct BlockOperands {
  const Problem<float>& P;
  const tile::Kernels& kz;  // the float32 kernels (Bf16Products: the passes after its products)
  const float *Qb, *Kg, *Vg, *dOb;
  std::size_t ldq, ldkk, ldv, ldo;
  BlockOperands(const Problem<float>& P_, const tile::Kernels& kz_, std::size_t b, std::size_t h, const BlockRows& R,
                const float* dO)
      : P(P_), kz(kz_), Qb(P.Q + P.lq.at(b, h, R.i0)), Kg(P.K + P.lk.at(b, h / P.g.r, 0)),
        Vg(P.V + P.lv.at(b, h / P.g.r, 0)), dOb(dO ? dO + P.lo.at(b, h, R.i0) : nullptr), ldq(P.lq.st),
        ldkk(P.lk.st), ldv(P.lv.st), ldo(P.lo.st) {}
};

struct F32Products : BlockOperands {
  const float *Kt, *Vt;  // the group's panels (transpose_groups)
  static constexpr std::size_t chunk = kChunk;

  F32Products(const Problem<float>& P_, const tile::Kernels& kz_, const float* Kt_, const float* Vt_, std::size_t b,
              std::size_t h, const BlockRows& R, const float* dO)
      : BlockOperands(P_, kz_, b, h, R, dO), Kt(Kt_), Vt(Vt_) {}
  // S[a..e, 0..cols) = scale Q[a..e] K[kb0 .. kb0 + cols)^T
  void scores(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* S) {
    kz.gemm(e - a, cols, P.g.dk, P.scale, Qb + a * ldq, ldq, 1, Bk(kb0), kTile, S + a * kTile, kTile, false);
  }
  // the same, then S = e^((S - m) - lz) row by row (from the product's registers)
  void scores_exp(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* S, const float* m,
                  const float* lz) {
    kz.gemm_exp(e - a, cols, P.g.dk, P.scale, Qb + a * ldq, ldq, 1, Bk(kb0), kTile, S + a * kTile, kTile, m + a,
                lz + a);
  }
  // scores(a, e, kTile, kb0, S), then the online-softmax step of rows a..e that see the whole
  // tile (Kernels::softmax_rows, with m, l, acc at row a): returns the rows it did
  std::size_t scores_softmax(std::size_t a, std::size_t e, std::size_t kb0, float* S, float* m, float* l, float* acc) {
    return kz.gemm_softmax(e - a, kTile, P.g.dk, P.scale, Qb + a * ldq, ldq, 1, Bk(kb0), kTile, S + a * kTile, kTile,
                           m, l, acc, P.g.dv, P.g.dv);
  }
  // acc[a..e] += S[a..e, 0..need) V[kb0 .. kb0 + need)
  void pv(std::size_t a, std::size_t e, std::size_t need, std::size_t kb0, const float* S, float* acc) {
    kz.gemm(e - a, P.g.dv, need, 1.0f, S + a * kTile, kTile, 1, Vg + kb0 * ldv, ldv, acc + a * P.g.dv, P.g.dv, true);
  }
  // dV[kb0 .. kb0 + n] (rows ld apart) += Sd[r0..r1, 0..n)^T dO[r0..r1]
  void dv(std::size_t r0, std::size_t r1, std::size_t n, std::size_t kb0, const float* Sd, float* dV, std::size_t ld) {
    dv_keys(0, n, r0, r1, kb0, Sd, dV, ld);
  }
  // the same for the tile's keys [j0, j1) only (TileParts::keys)
  static constexpr bool by_keys = true;
  void dv_keys(std::size_t j0, std::size_t j1, std::size_t r0, std::size_t r1, std::size_t kb0, const float* Sd,
               float* dV, std::size_t ld) {
    kz.gemm(j1 - j0, P.g.dv, r1 - r0, 1.0f, Sd + r0 * kTile + j0, 1, kTile, dOb + r0 * ldo, ldo, dV + (kb0 + j0) * ld,
            ld, true);
  }
  // dS[a..e, 0..cols) = dO[a..e] V[kb0 .. kb0 + cols)^T
  void dp(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* dS) {
    kz.gemm(e - a, cols, P.g.dv, 1.0f, dOb + a * ldo, ldo, 1, Bv(kb0), kTile, dS + a * kTile, kTile, false);
  }
  // the same, then dS = S (dS - D) row by row
  void dp_dsoft(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* dS, const float* S,
                const float* D) {
    kz.gemm_dsoft(e - a, cols, P.g.dv, dOb + a * ldo, ldo, 1, Bv(kb0), kTile, dS + a * kTile, kTile, S + a * kTile,
                  kTile, D + a);
  }
  // dQ (row a of the block at dQ, rows ldq apart) += scale dS[a..e, 0..need) K[kb0 .. kb0 + need)
  void dq(std::size_t a, std::size_t e, std::size_t need, std::size_t kb0, const float* dS, float* dQ) {
    kz.gemm(e - a, P.g.dk, need, P.scale, dS + a * kTile, kTile, 1, Kg + kb0 * ldkk, ldkk, dQ, ldq, true);
  }
  // dK[kb0 .. kb0 + n] (rows ld apart) += scale dS[r0..r1, 0..n)^T Q[r0..r1]
  void dk(std::size_t r0, std::size_t r1, std::size_t n, std::size_t kb0, const float* dS, float* dK, std::size_t ld) {
    dk_keys(0, n, r0, r1, kb0, dS, dK, ld);
  }
  // the same for the tile's keys [j0, j1) only (TileParts::keys)
  void dk_keys(std::size_t j0, std::size_t j1, std::size_t r0, std::size_t r1, std::size_t kb0, const float* dS,
               float* dK, std::size_t ld) {
    kz.gemm(j1 - j0, P.g.dk, r1 - r0, P.scale, dS + r0 * kTile + j0, 1, kTile, Qb + r0 * ldq, ldq,
            dK + (kb0 + j0) * ld, ld, true);
  }

 private:
  // a tile's [d, kTile] B operand of the panels, packed once per tile
  const float* panel(const float* Xt, std::size_t d, std::size_t kb0, std::size_t& at, const float*& op,
                     detail::AlignedVector<float>& pack) {
    if (at != kb0) {
      op = tile_operand(Xt, d, kb0, scratch(pack, d * kTile));
      at = kb0;
    }
    return op;
  }
  const float* Bk(std::size_t kb0) {
    thread_local detail::AlignedVector<float> pack;
    return panel(Kt, P.g.dk, kb0, k_at_, k_op_, pack);
  }
  const float* Bv(std::size_t kb0) {
    thread_local detail::AlignedVector<float> pack;
    return panel(Vt, P.g.dv, kb0, v_at_, v_op_, pack);
  }
  std::size_t k_at_ = std::size_t(-1), v_at_ = std::size_t(-1);
  const float *k_op_ = nullptr, *v_op_ = nullptr;
};

// K and V of every (b, kv head) group in the tile layouts of core/detail/amx_gemm.hpp, keys padded
// with zeros to sp (whole tiles and one more, as the panels): K and V in pairs along d (B layout
// of K^T and V^T: d / 2 pair rows of sp words; the scores and dO V^T) and in pairs along keys
// (sp / 2 pair rows of d words; P V and dS K).
struct GroupBf16 {
  std::size_t sp = 0;
  std::vector<std::uint32_t> kd, kk, vd, vk;
  std::size_t words(std::size_t d) const { return d / 2 * sp; }  // of one group, either layout
};

std::size_t padded_keys(std::size_t S) { return (S + kTile - 1) / kTile * kTile + kTile; }

// X [S, d] (rows ld apart) into the layouts asked for (null: not needed), zeros at the keys from
// S to sp.
void round_keys(const float* X, std::size_t ld, std::size_t S, std::size_t d, std::size_t sp, std::uint32_t* by_d,
                std::uint32_t* by_keys) {
  if (by_d) {
    blas::amx::round_b_transposed(d, S, X, ld, by_d, sp);  // words up to S rounded to 16
    const std::size_t s16 = (S + 15) / 16 * 16;
    for (std::size_t p = 0; p < d / 2; ++p) std::fill(by_d + p * sp + s16, by_d + (p + 1) * sp, 0u);
  }
  if (by_keys) {
    blas::amx::round_b(S, d, X, ld, by_keys, d);  // pair rows up to S rounded to 32, halved
    const std::size_t s32 = (S + 31) / 32 * 16;
    std::fill(by_keys + s32 * d, by_keys + sp / 2 * d, 0u);
  }
}

// Which of GroupBf16's layouts a pass reads: the forward K by d and V by keys; the backward K by
// d, and K by keys for dQ and V by d for dU.
struct Layouts {
  bool kd = false, kk = false, vd = false, vk = false;
};

// Rounds every group's K and V for Bf16Products into the layouts `use` asks for, over the pool.
void round_groups(const Problem<float>& P, Layouts use, GroupBf16& G) {
  const Geometry& g = P.g;
  const std::size_t groups = g.B * g.Hkv;
  G.sp = padded_keys(g.S);
  const std::size_t kw = G.words(g.dk), vw = G.words(g.dv);
  const auto fit = [groups](std::vector<std::uint32_t>& v, bool needed, std::size_t words) {
    if (needed && v.size() < groups * words) v.resize(groups * words);
  };
  fit(G.kd, use.kd, kw);
  fit(G.kk, use.kk, kw);
  fit(G.vd, use.vd, vw);
  fit(G.vk, use.vk, vw);
  detail::parallel_for(groups, 1, [&](std::size_t begin, std::size_t end, std::size_t) {
    for (std::size_t gi = begin; gi < end; ++gi) {
      round_keys(P.K + P.lk.at(gi / g.Hkv, gi % g.Hkv, 0), P.lk.st, g.S, g.dk, G.sp,
                 use.kd ? G.kd.data() + gi * kw : nullptr, use.kk ? G.kk.data() + gi * kw : nullptr);
      if (use.vd || use.vk)
        round_keys(P.V + P.lv.at(gi / g.Hkv, gi % g.Hkv, 0), P.lv.st, g.S, g.dv, G.sp,
                   use.vd ? G.vd.data() + gi * vw : nullptr, use.vk ? G.vk.data() + gi * vw : nullptr);
    }
  });
}

// The tile path of bfloat16 products: both head widths whole AMX tile steps (32 values; the dot
// products read the same layouts).
bool bf16_tile_path(const Geometry& g) { return g.dk % 32 == 0 && g.dv % 32 == 0; }

// One thread's buffers of Bf16Products (one block at a time on a thread).
struct Bf16Buffers {
  std::vector<std::uint32_t> qa, qr, oa, orr;  // the block's Q and dO (A layout, pairs along rows)
  std::vector<std::uint32_t> a, b;             // one product's A operand; an odd tile start's B
};
Bf16Buffers& bf16_buffers() {
  thread_local Bf16Buffers buffers;
  return buffers;
}

struct Bf16Products : BlockOperands {
  std::size_t sp;
  const std::uint32_t *kd, *kk, *vd, *vk;  // this group's K and V (GroupBf16)
  static constexpr std::size_t chunk = 32;  // two AMX tiles of rows

  Bf16Products(const Problem<float>& P_, const tile::Kernels& kz_, const GroupBf16& G, std::size_t b, std::size_t h,
               const BlockRows& R, const float* dO)
      : BlockOperands(P_, kz_, b, h, R, dO), sp(G.sp) {
    const Geometry& g = P.g;
    const std::size_t grp = b * g.Hkv + h / g.r;
    const auto at = [&](const std::vector<std::uint32_t>& v, std::size_t d) {  // (a layout the pass has)
      return v.empty() ? nullptr : v.data() + grp * G.words(d);
    };
    kd = at(G.kd, g.dk);
    kk = at(G.kk, g.dk);
    vd = at(G.vd, g.dv);
    vk = at(G.vk, g.dv);
    // The block's Q (scaled: the scores need no pass after the product) and dO. A chunk's tiles
    // read up to 16 rows (A layout) or 32 (B layout) past it: the A rows there only give rows of
    // C that are not stored, the B rows multiply zeros of A and must be finite (zero here).
    qa_.resize((kBlock + 16) * g.dk / 2);
    blas::amx::round_a(R.rows, g.dk, P.scale, Qb, ldq, 1, qa_.data(), g.dk / 2);
    if (dOb) {
      by_rows(R.rows, g.dk, Qb, ldq, qr_);
      oa_.resize((kBlock + 16) * g.dv / 2);
      blas::amx::round_a(R.rows, g.dv, 1.0f, dOb, ldo, 1, oa_.data(), g.dv / 2);
      by_rows(R.rows, g.dv, dOb, ldo, or_);
    }
  }
  void scores(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* S) {
    const std::size_t w = P.g.dk / 2;
    tiles_(e - a, cols, w, qa_.data() + a * w, w, kd + kb0, sp, S + a * kTile, kTile, false);
  }
  void scores_exp(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* S, const float* m,
                  const float* lz) {
    scores(a, e, cols, kb0, S);
    for (std::size_t k = a; k < e; ++k) kz.exp_shift(S + k * kTile, cols, m[k], lz[k]);
  }
  std::size_t scores_softmax(std::size_t a, std::size_t e, std::size_t kb0, float* S, float* m, float* l, float* acc) {
    scores(a, e, kTile, kb0, S);
    return kz.softmax_rows(S + a * kTile, kTile, e - a, kTile, m, l, acc, P.g.dv, P.g.dv);
  }
  void pv(std::size_t a, std::size_t e, std::size_t need, std::size_t kb0, const float* S, float* acc) {
    const std::size_t w = round_a(e - a, need, 1.0f, S + a * kTile, kTile, 1);
    keys_b(e - a, P.g.dv, need, w, vk, Vg, ldv, kb0, acc + a * P.g.dv, P.g.dv);
  }
  static constexpr bool by_keys = false;  // dv and dk over the whole tile (rows_b pairs the rows)
  void dv(std::size_t r0, std::size_t r1, std::size_t n, std::size_t kb0, const float* Sd, float* dV, std::size_t ld) {
    rows_b(r0, r1, n, 1.0f, Sd, or_, P.g.dv, dV + kb0 * ld, ld);
  }
  void dp(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* dS) {
    const std::size_t w = P.g.dv / 2;
    tiles_(e - a, cols, w, oa_.data() + a * w, w, vd + kb0, sp, dS + a * kTile, kTile, false);
  }
  void dp_dsoft(std::size_t a, std::size_t e, std::size_t cols, std::size_t kb0, float* dS, const float* S,
                const float* D) {
    dp(a, e, cols, kb0, dS);
    for (std::size_t k = a; k < e; ++k) {
      float* ds = dS + k * kTile;
      const float* s = S + k * kTile;
      const float Dk = D[k];
      for (std::size_t j = 0; j < cols; ++j) ds[j] = s[j] * (ds[j] - Dk);
    }
  }
  void dq(std::size_t a, std::size_t e, std::size_t need, std::size_t kb0, const float* dS, float* dQ) {
    const std::size_t w = round_a(e - a, need, P.scale, dS + a * kTile, kTile, 1);
    keys_b(e - a, P.g.dk, need, w, kk, Kg, ldkk, kb0, dQ, ldq);
  }
  void dk(std::size_t r0, std::size_t r1, std::size_t n, std::size_t kb0, const float* dS, float* dK, std::size_t ld) {
    rows_b(r0, r1, n, P.scale, dS, qr_, P.g.dk, dK + kb0 * ld, ld);
  }

 private:
  // the engine of tile::bf16_choice(): AMX tiles (one tile configuration for the block's
  // products) or AVX512_BF16 dot products on the same layouts
  using TilesFn = void (*)(std::size_t, std::size_t, std::size_t, const std::uint32_t*, std::size_t,
                           const std::uint32_t*, std::size_t, float*, std::size_t, bool);
  const bool amx_ = tile::bf16_choice().engine == tile::Bf16Engine::amx;
  const TilesFn tiles_ = amx_ ? &blas::amx::tiles : &blas::amx::dot_tiles;
  struct Session {
    std::optional<blas::amx::TileSession> s;
    explicit Session(bool amx) {
      if (amx) s.emplace();
    }
  } session_{amx_};
  Bf16Buffers& buf_ = bf16_buffers();
  std::vector<std::uint32_t>&qa_ = buf_.qa, &qr_ = buf_.qr, &oa_ = buf_.oa, &or_ = buf_.orr, &a_ = buf_.a, &b_ = buf_.b;
  // rows [0, rows) of X (d columns, rows ld apart) in pairs along rows into out, zeros after them
  static void by_rows(std::size_t rows, std::size_t d, const float* X, std::size_t ld,
                      std::vector<std::uint32_t>& out) {
    const std::size_t pairs = (kBlock + 32) / 2, done = (rows + 31) / 32 * 16;
    out.resize(pairs * d);
    blas::amx::round_b(rows, d, X, ld, out.data(), d);
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(done * d), out.end(), 0u);
  }
  // a product's A operand (M rows, K values) in a_: returns its words per row
  std::size_t round_a(std::size_t M, std::size_t K, float alpha, const float* A, std::size_t rs, std::size_t cs) {
    const std::size_t w = (K + 31) / 32 * 16;
    a_.resize((M + 15) / 16 * 16 * w);
    blas::amx::round_a(M, K, alpha, A, rs, cs, a_.data(), w);
    return w;
  }
  // C (+)= a_ times keys kb0 .. kb0 + K of the group's copy in pairs along keys, or of the float32
  // X (rows ldx apart) rounded here where kb0 is odd (the copy's pairs start at even keys)
  void keys_b(std::size_t M, std::size_t N, std::size_t K, std::size_t w, const std::uint32_t* by_keys,
              const float* X, std::size_t ldx, std::size_t kb0, float* C, std::size_t ldc) {
    if (kb0 % 2 == 0) {
      tiles_(M, N, w, a_.data(), w, by_keys + kb0 / 2 * N, N, C, ldc, true);
      return;
    }
    b_.resize(w * N);
    blas::amx::round_b(K, N, X + kb0 * ldx, ldx, b_.data(), N);
    tiles_(M, N, w, a_.data(), w, b_.data(), N, C, ldc, true);
  }
  // C[n, N] += alpha X[r0..r1, 0..n)^T Y[r0..r1] with Y the block's rows in pairs (by_rows). The
  // pairs start at even rows: from an odd r0 the product starts at row r0 - 1 with its X zero.
  void rows_b(std::size_t r0, std::size_t r1, std::size_t n, float alpha, const float* X,
              const std::vector<std::uint32_t>& by_rows, std::size_t N, float* C, std::size_t ldc) {
    const std::size_t a = r0 & ~std::size_t(1);
    const std::size_t w = round_a(n, r1 - a, alpha, X + a * kTile, 1, kTile);
    if (a < r0)
      for (std::size_t i = 0; i < n; ++i) a_[i * w] &= 0xffff0000u;  // row a: the low halves of pair 0
    tiles_(n, N, w, a_.data(), w, by_rows.data() + a / 2 * N, N, C, ldc, true);
  }
};

// S[rows, kTile] = scale Q_blk Kt[:, kb0 .. kb0 + kTile) with the visibility applied to each
// row's visible part (forward: scores checked first, as block_scores does), for the rows
// parts.r0 .. parts.r1 that see a key of the tile; the others are left as they were (the callers
// zero them, and the products skip them: on the causal diagonal that halves the tile).
// The products of tile_scores alone: S = scale Q K^T by row chunks, each up to its rows' parts.
template <class Products>
void part_scores(const tile::Kernels& kz, Products& prod, const TileParts& parts, std::size_t kb0, float* S) {
  parts.rows(Products::chunk, [&](std::size_t a, std::size_t e, std::size_t need) {
    const std::size_t cols = round_up(need, kz.width);
    if (cols) prod.scores(a, e, cols, kb0, S);
  });
}

template <class Products>
void tile_scores(const Problem<float>& P, const tile::Kernels& kz, Products& prod, std::size_t b, std::size_t h,
                 const BlockRows& R, const TileParts& parts, std::size_t kb0, bool check, float* S) {
  part_scores(kz, prod, parts, kb0, S);
  for (std::size_t k = parts.r0; k < parts.r1; ++k) {
    const std::size_t ja = parts.ja[k], je = parts.je[k];
    if (ja == je) continue;
    float* s = S + k * kTile;
    if (check && P.check_finite && !kz.finite(s + ja, je - ja)) check_tile_scores(P, b, h, R, k, kb0, ja, je, s);
    if (!R.exact[k]) P.plan->apply(b, h, R.i0 + k, kb0 + ja, kb0 + je, s + ja);
  }
}

// make(R) gives the block's products (F32Products or Bf16Products).
template <class MakeProducts>
void forward_block_tiles(const Problem<float>& P, const tile::Kernels& kz, MakeProducts&& make, std::size_t b,
                         std::size_t h, std::size_t blk, float* O, float* row_max, float* log_z) {
  thread_local detail::AlignedVector<float> s_buf, o_buf;
  BlockRows R;
  plan_block(P, b, h, blk, R);
  const auto zero_row = [&](std::size_t k) {  // a row that sees no key (an invalid query): O's row is zero
    float* o = O + P.lo.at(b, h, R.i0 + k);
    std::fill(o, o + P.g.dv, 0.0f);
  };
  if (R.U == R.L) {
    for (std::size_t k = 0; k < R.rows; ++k) zero_row(k);
    return;
  }
  auto prod = make(R);
  using Products = decltype(prod);
  const Geometry& g = P.g;
  const std::size_t row0 = (b * g.Hq + h) * g.T + R.i0;
  float* S = scratch(s_buf, kBlock * kTile);
  float* acc = scratch(o_buf, kBlock * g.dv);
  std::fill(acc, acc + R.rows * g.dv, 0.0f);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m[kBlock], l[kBlock];
  std::fill(m, m + R.rows, kNegInf);
  std::fill(l, l + R.rows, 0.0f);
  TileParts parts;
  const bool exact_parts = g_exact_parts.load(std::memory_order_relaxed) && !P.dropout;
  for (std::size_t kb0 = R.L; kb0 < R.U; kb0 += kTile) {
    const std::size_t n = std::min(kTile, R.U - kb0);
    std::size_t r0, r1, k0;
    const bool full = tile_rows(R, kb0, n, r0, r1) && !P.dropout;
    if (!full && r0 == r1) continue;  // no row sees a key of the tile
    if (!full) parts.plan(R, kb0, n, r0, r1, false);
    if (full) {
      // Every row sees the whole tile: no visibility to apply; the scores' check, max, e^x and
      // sum in one kernel call (the loop below, from the first row with a non-finite score).
      k0 = r0 + prod.scores_softmax(r0, r1, kb0, S, m + r0, l + r0, acc + r0 * g.dv);
      if (k0 < r1 && P.check_finite)  // throws at the first non-finite score, as tile_scores does
        check_tile_scores(P, b, h, R, k0, kb0, 0, kTile, S + k0 * kTile);
    } else if (exact_parts && exact_rows(R, r0, r1)) {
      // Rows that see parts of the tile with nothing to apply in them (the causal diagonal, a
      // window's edges): tile_scores' products, then its check and the loop below on each row's
      // part in one kernel call (the loop below from the first row with a non-finite score).
      count_partial_tile(PartialTilePath::exact_parts);
      part_scores(kz, prod, parts, kb0, S);
      k0 = r0 + kz.softmax_parts(S + r0 * kTile, kTile, r1 - r0, parts.ja + r0, parts.je + r0, kTile, m + r0, l + r0,
                                 acc + r0 * g.dv, g.dv, g.dv);
      if (k0 < r1 && P.check_finite)  // throws at the first non-finite visible score, as tile_scores does
        check_tile_scores(P, b, h, R, k0, kb0, parts.ja[k0], parts.je[k0], S + k0 * kTile);
    } else {
      count_partial_tile(PartialTilePath::general);
      tile_scores(P, kz, prod, b, h, R, parts, kb0, true, S);
      k0 = r0;
    }
    for (std::size_t k = k0; k < r1; ++k) {
      float* s = S + k * kTile;
      std::size_t ja, je;
      tile_span(R, k, kb0, n, ja, je);
      const float mx = ja < je ? kz.max(s + ja, je - ja) : kNegInf;
      if (mx == kNegInf) {  // nothing visible in this tile: P row 0
        std::fill(s, s + kTile, 0.0f);
        continue;
      }
      if (!std::isfinite(mx))
        throw ValueError(op_message(kOp, "score plus bias is " + std::to_string(mx) + " at " + where(b, h, R.i0 + k) +
                                             "; the additive bias overflows the scores (Algorithm 5.1 step 3)"));
      if (mx > m[k]) {
        if (m[k] != kNegInf) {  // rescale what the row accumulated so far
          const float f = std::exp(m[k] - mx);
          l[k] *= f;
          float* o = acc + k * g.dv;
          for (std::size_t c = 0; c < g.dv; ++c) o[c] *= f;
        }
        m[k] = mx;
      }
      std::fill(s, s + ja, 0.0f);
      l[k] += kz.exp_shift(s + ja, je - ja, m[k], 0.0f);
      std::fill(s + je, s + kTile, 0.0f);
      if (P.dropout) dropout_row(P, b, h, R.i0 + k, kb0, s, s, n);
    }
    if (full)
      prod.pv(r0, r1, n, kb0, S, acc);
    else
      parts.rows(Products::chunk, [&](std::size_t a, std::size_t e, std::size_t need) {
        if (need) prod.pv(a, e, need, kb0, S, acc);
      });
  }
  for (std::size_t k = 0; k < R.rows; ++k) {
    if (!R.use[k]) {
      zero_row(k);
      continue;
    }
    if (m[k] == kNegInf)
      throw VisibilityError(op_message(kOp, where(b, h, R.i0 + k) + " is valid but sees no key; check mask polarity "
                                                                      "and causal offset, or mark the query invalid"));
    const float inv = 1.0f / l[k];
    const float* a = acc + k * g.dv;
    float* o = O + P.lo.at(b, h, R.i0 + k);
    for (std::size_t c = 0; c < g.dv; ++c) o[c] = a[c] * inv;
    row_max[row0 + k] = m[k];
    log_z[row0 + k] = std::log(l[k]);
  }
}

// Gradients of one block of head h by key tiles; Kt, Vt, dK, dV point at the group's matrices
// (dK's and dV's rows ldk, ldv apart), dQ rows of the block are accumulated (they start at zero).
template <class MakeProducts>
void backward_block_tiles(const Problem<float>& P, const tile::Kernels& kz, MakeProducts&& make, std::size_t b,
                          std::size_t h, std::size_t blk, const float* row_max, const float* log_z, const float* O,
                          const float* dO, float* dQ, float* dK, std::size_t ldk, float* dV, std::size_t ldv) {
  thread_local detail::AlignedVector<float> p_buf, pd_buf, dp_buf;
  BlockRows R;
  plan_block(P, b, h, blk, R);
  if (R.U == R.L) return;
  auto prod = make(R);
  using Products = decltype(prod);
  const Geometry& g = P.g;
  const std::size_t row0 = (b * g.Hq + h) * g.T + R.i0;
  float* S = scratch(p_buf, kBlock * kTile);
  float* Sd = P.dropout ? scratch(pd_buf, kBlock * kTile) : S;
  float* dS = scratch(dp_buf, kBlock * kTile);
  const std::size_t ldo = P.lo.st;
  const float* dOb = dO + P.lo.at(b, h, R.i0);
  const float* Ob = O + P.lo.at(b, h, R.i0);
  float D[kBlock];  // delta_i = dO_i . O_i = sum_j A_ij dA_ij (dropout included)
  for (std::size_t k = 0; k < R.rows; ++k) D[k] = R.use[k] ? kz.dot(dOb + k * ldo, Ob + k * ldo, g.dv) : 0.0f;
  TileParts parts;
  const bool by_keys = Products::by_keys && g_exact_parts.load(std::memory_order_relaxed);
  const bool exact_parts = by_keys && !P.dropout;
  for (std::size_t kb0 = R.L; kb0 < R.U; kb0 += kTile) {
    const std::size_t n = std::min(kTile, R.U - kb0);
    std::size_t r0, r1;
    const bool full = tile_rows(R, kb0, n, r0, r1) && !P.dropout;
    if (!full && r0 == r1) continue;  // no row sees a key of the tile
    if (!full) parts.plan(R, kb0, n, r0, r1, by_keys);
    if (full) {
      // Every row sees the whole tile: the weights A = e^((S - m) - log l) straight from the
      // product's registers (the same bits as tile_scores, then exp_shift below).
      prod.scores_exp(r0, r1, kTile, kb0, S, row_max + row0, log_z + row0);
    } else if (exact_parts && exact_rows(R, r0, r1)) {
      // Rows that see parts of the tile with nothing to apply in them (the causal diagonal, a
      // window's edges): the same from the product's registers by row chunks, each up to its
      // rows' parts, then each row zero outside its part (what the product wrote there is
      // overwritten).
      count_partial_tile(PartialTilePath::exact_parts);
      parts.rows(Products::chunk, [&](std::size_t a, std::size_t e, std::size_t need) {
        const std::size_t cols = round_up(need, kz.width);
        if (cols) prod.scores_exp(a, e, cols, kb0, S, row_max + row0, log_z + row0);
        for (std::size_t k = a; k < e; ++k) {
          float* s = S + k * kTile;
          std::fill(s, s + parts.ja[k], 0.0f);
          std::fill(s + parts.je[k], s + kTile, 0.0f);
        }
      });
    } else {
      count_partial_tile(PartialTilePath::general);
      tile_scores(P, kz, prod, b, h, R, parts, kb0, false, S);
      for (std::size_t k = r0; k < r1; ++k) {
        float* s = S + k * kTile;
        const std::size_t ja = parts.ja[k], je = parts.je[k];
        std::fill(s, s + ja, 0.0f);
        if (ja < je) kz.exp_shift(s + ja, je - ja, row_max[row0 + k], log_z[row0 + k]);
        std::fill(s + je, s + kTile, 0.0f);
        if (P.dropout) dropout_row(P, b, h, R.i0 + k, kb0, s, Sd + k * kTile, n);
      }
    }
    // dV and dK, the sums over the rows: of a tile that rows see in part, by key chunks, each over
    // its rows (part(prod, j0, j1, lo, hi), generic in prod: Bf16Products has no such products);
    // else whole().
    const auto sum_over_rows = [&](auto&& whole, auto&& part) {
      if constexpr (Products::by_keys) {
        if (!full && by_keys) {
          parts.keys([&](std::size_t j0, std::size_t j1, std::size_t lo, std::size_t hi) {
            part(prod, j0, j1, lo, hi);
          });
          return;
        }
      }
      whole();
    };
    if (dV)  // dV += A_d^T dO
      sum_over_rows([&] { prod.dv(r0, r1, n, kb0, Sd, dV, ldv); },
                    [&](auto& p, std::size_t j0, std::size_t j1, std::size_t lo, std::size_t hi) {
                      p.dv_keys(j0, j1, lo, hi, kb0, Sd, dV, ldv);
                    });
    if (!dQ && !dK) continue;
    if (full) {  // dU = A (dO V^T - delta) (float32: from the product's registers; zero where A is)
      prod.dp_dsoft(r0, r1, kTile, kb0, dS, S, D);
    } else if (!P.dropout) {  // the same by row chunks, each up to its rows' parts; zero after them
      parts.rows(Products::chunk, [&](std::size_t a, std::size_t e, std::size_t need) {
        const std::size_t cols = round_up(need, kz.width);
        if (cols) prod.dp_dsoft(a, e, cols, kb0, dS, S, D);
        for (std::size_t k = a; k < e; ++k) std::fill(dS + k * kTile + cols, dS + (k + 1) * kTile, 0.0f);
      });
    } else {
      prod.dp(r0, r1, kTile, kb0, dS);  // dA_d = dO V^T
      for (std::size_t k = r0; k < r1; ++k) {
        float* ds = dS + k * kTile;
        const float* a = S + k * kTile;
        dropout_row(P, b, h, R.i0 + k, kb0, ds, ds, n);  // dA = dA_d * m / q
        const float Dk = D[k];
        for (std::size_t j = 0; j < kTile; ++j) ds[j] = a[j] * (ds[j] - Dk);  // dU (zero where A is)
      }
    }
    if (dQ && (full || P.dropout))
      prod.dq(r0, r1, n, kb0, dS, dQ + P.lq.at(b, h, R.i0 + r0));
    else if (dQ)
      parts.rows(Products::chunk, [&](std::size_t a, std::size_t e, std::size_t need) {
        if (need) prod.dq(a, e, need, kb0, dS, dQ + P.lq.at(b, h, R.i0 + a));
      });
    if (dK)  // dK += scale dU^T Q
      sum_over_rows([&] { prod.dk(r0, r1, n, kb0, dS, dK, ldk); },
                    [&](auto& p, std::size_t j0, std::size_t j1, std::size_t lo, std::size_t hi) {
                      p.dk_keys(j0, j1, lo, hi, kb0, dS, dK, ldk);
                    });
  }
}

// p[r * ld + c] = 0 for r < rows, c < cols: a block's rows of O on the generic path (forward_block
// writes only the rows that see a key) and the double backward's outputs, by the thread that then
// fills that part. The tile path writes every row of O itself; run_backward's gradients arrive
// zeroed.
template <class T> void zero_rows(T* p, std::size_t rows, std::size_t cols, std::size_t ld) {
  for (std::size_t r = 0; r < rows; ++r) std::fill(p + r * ld, p + r * ld + cols, T(0));
}

// Zeroes the O (or dQ) rows of block blk of head h (batch b), laid out by l with `cols` columns.
template <class T>
void zero_block(const Geometry& g, const Layout& l, std::size_t cols, std::size_t b, std::size_t h, std::size_t blk,
                T* X) {
  const std::size_t i0 = blk * kBlock;
  zero_rows(X + l.at(b, h, i0), std::min(kBlock, g.T - i0), cols, l.st);
}

template <class T>
void run_forward(const Problem<T>& P0, T* O, T* row_max, T* log_z) {
  std::vector<BlockRows> shared;
  const Problem<T> P = share_block_rows(P0, shared);
  const Geometry& g = P.g;
  const std::size_t nb = g.blocks(), items = g.B * g.Hq * nb;
  if constexpr (std::is_same<T, float>::value) {
    const tile::Kernels* kz = tile::kernels();
    if (P.bf16 && kz && bf16_tile_path(g)) {
      thread_local GroupBf16 G_buf;  // (the lambda below runs on other threads: use G)
      GroupBf16& G = G_buf;
      round_groups(P, {true, false, false, true}, G);
      detail::parallel_for(items, 1, [&](std::size_t begin, std::size_t end, std::size_t) {
        for (std::size_t it = begin; it < end; ++it) {
          const std::size_t blk = it % nb, b = it / nb / g.Hq, h = it / nb % g.Hq;
          forward_block_tiles(  // (writes every row of O's block: no zeroing first)
              P, *kz, [&](const BlockRows& R) { return Bf16Products(P, *kz, G, b, h, R, nullptr); }, b, h, blk, O,
              row_max, log_z);
        }
      });
      return;
    }
    if (tile_path(g, kz)) {
      // A (b, kv head) group's items are consecutive: a chunk transposes each group it meets once
      // (a group split between two chunks: once in each).
      detail::parallel_for(items, 1, [&](std::size_t begin, std::size_t end, std::size_t) {
        thread_local GroupPanels panels_K;
        std::size_t held = SIZE_MAX;  // the group whose panels Ktg holds
        const float* Ktg = nullptr;
        for (std::size_t it = begin; it < end; ++it) {
          const std::size_t blk = it % nb, bh = it / nb;
          const std::size_t b = bh / g.Hq, h = bh % g.Hq, grp = b * g.Hkv + h / g.r;
          if (grp != held) {
            Ktg = panels_K.fill(*kz, P.K, P.lk, g.Hkv, grp, g.S, g.dk);
            held = grp;
          }
          forward_block_tiles(
              P, *kz, [&](const BlockRows& R) { return F32Products(P, *kz, Ktg, nullptr, b, h, R, nullptr); }, b, h,
              blk, O, row_max, log_z);
        }
      });
      return;
    }
  }
  detail::parallel_for(items, 1, [&](std::size_t begin, std::size_t end, std::size_t) {
    for (std::size_t it = begin; it < end; ++it) {
      const std::size_t blk = it % nb, bh = it / nb;
      zero_block(g, P.lo, g.dv, bh / g.Hq, bh % g.Hq, blk, O);
      forward_block(P, bh / g.Hq, bh % g.Hq, blk, O, row_max, log_z);
    }
  });
}

// y[s * ldy + c] += x[s * d + c] for the rows s of an [S, d] matrix x.
template <class T> void add_rows(const T* x, std::size_t S, std::size_t d, T* y, std::size_t ldy) {
  for (std::size_t s = 0; s < S; ++s)
    for (std::size_t c = 0; c < d; ++c) y[s * ldy + c] += x[s * d + c];
}

// dQ, dK and dV (each null when not wanted) must arrive zeroed: the blocks add into them. Callers
// allocate them with Array::zeros, one contiguous clear over the pool; zeroing a head's rows
// inside the blocks (128 bytes a row at 32-wide heads, rows a packed projection's width apart)
// took a tenth of the packed backward at step M's shape.
template <class T>
void run_backward(const Problem<T>& P0, const T* row_max, const T* log_z, const T* O, const T* dO, T* dQ, T* dK,
                  T* dV) {
  std::vector<BlockRows> shared;
  const Problem<T> P = share_block_rows(P0, shared);
  const Geometry& g = P.g;
  const std::size_t nb = g.blocks(), groups = g.B * g.Hkv;
  const std::size_t threads = static_cast<std::size_t>(detail::pool_threads());
  const std::size_t kd = g.S * g.dk, vd = g.S * g.dv;
  const tile::Kernels* kz = nullptr;
  thread_local detail::AlignedVector<float> Kt_buf, Vt_buf;  // (the lambdas below run on other threads: use Kt, Vt, G)
  thread_local GroupBf16 G_buf;
  GroupBf16& G = G_buf;
  bool bf16 = false;
  const float* Kt = nullptr;
  const float* Vt = nullptr;
  if constexpr (std::is_same<T, float>::value) {
    kz = tile::kernels();
    if (P.bf16 && kz && bf16_tile_path(g)) {
      bf16 = true;
      round_groups(P, {true, dQ != nullptr, dQ || dK, false}, G);
    } else if (tile_path(g, kz)) {
      if (groups < threads) {  // (with whole groups per chunk, each chunk transposes its own: GroupPanels)
        transpose_groups(*kz, P.K, P.lk, g.Hkv, groups, g.S, g.dk, Kt_buf);
        Kt = Kt_buf.data();
        if (dQ || dK) {
          transpose_groups(*kz, P.V, P.lv, g.Hkv, groups, g.S, g.dv, Vt_buf);
          Vt = Vt_buf.data();
        }
      }
    } else {
      kz = nullptr;
    }
  }
  // Block blk of query head h (batch b) into the given dK, dV (a group's or a chunk's part), rows
  // ldk, ldv apart; Ktg, Vtg: the group's panels (float32 tiles; Vtg null when dQ and dK are not
  // wanted).
  const auto block = [&](std::size_t b, std::size_t h, std::size_t blk, T* dKp, std::size_t ldk, T* dVp,
                         std::size_t ldv, const float* Ktg, const float* Vtg) {
    if constexpr (std::is_same<T, float>::value) {
      if (kz && bf16) {
        backward_block_tiles(
            P, *kz, [&](const BlockRows& R) { return Bf16Products(P, *kz, G, b, h, R, dO); }, b, h, blk, row_max,
            log_z, O, dO, dQ, dKp, ldk, dVp, ldv);
        return;
      }
      if (kz) {
        backward_block_tiles(
            P, *kz, [&](const BlockRows& R) { return F32Products(P, *kz, Ktg, Vtg, b, h, R, dO); }, b, h, blk,
            row_max, log_z, O, dO, dQ, dKp, ldk, dVp, ldv);
        return;
      }
    }
    (void)O;
    (void)Ktg;
    (void)Vtg;
    backward_block(P, b, h, blk, row_max, log_z, dO, dQ, dKp, ldk, dVp, ldv);
  };
  // The (b, kv head) group's dK and dV rows (null when not needed).
  const auto group_dK = [&](std::size_t b, std::size_t kvh) { return dK ? dK + P.lk.at(b, kvh, 0) : nullptr; };
  const auto group_dV = [&](std::size_t b, std::size_t kvh) { return dV ? dV + P.lv.at(b, kvh, 0) : nullptr; };
  if (groups >= threads) {  // each chunk owns whole (b, kv head) groups: any split gives the same bits
    detail::parallel_for(groups, 1, [&](std::size_t begin, std::size_t end, std::size_t) {
      thread_local GroupPanels panels_K, panels_V;
      for (std::size_t bg = begin; bg < end; ++bg) {
        const std::size_t b = bg / g.Hkv, kvh = bg % g.Hkv;
        const float* Ktg = nullptr;
        const float* Vtg = nullptr;
        if constexpr (std::is_same<T, float>::value)
          if (kz && !bf16) {
            Ktg = panels_K.fill(*kz, P.K, P.lk, g.Hkv, bg, g.S, g.dk);
            if (dQ || dK) Vtg = panels_V.fill(*kz, P.V, P.lv, g.Hkv, bg, g.S, g.dv);
          }
        for (std::size_t h = kvh * g.r; h < (kvh + 1) * g.r; ++h)
          for (std::size_t blk = 0; blk < nb; ++blk)
            block(b, h, blk, group_dK(b, kvh), P.lk.st, group_dV(b, kvh), P.lv.st, Ktg, Vtg);
      }
    });
    return;
  }
  // Fewer groups than threads: split each group's (head, block) items, one chunk a thread;
  // per-chunk dK/dV ([S, d] each, summed into the group's rows in chunk order).
  const std::size_t items = g.r * nb;
  const std::size_t chunks = detail::parallel_chunks(items, 1, 1);
  detail::AlignedVector<T> part_k(dK ? chunks * kd : 0), part_v(dV ? chunks * vd : 0);
  for (std::size_t bg = 0; bg < groups; ++bg) {
    const std::size_t b = bg / g.Hkv, kvh = bg % g.Hkv;
    std::fill(part_k.begin(), part_k.end(), T(0));
    std::fill(part_v.begin(), part_v.end(), T(0));
    const float* Ktg = Kt ? Kt + bg * group_floats(g.S, g.dk) : nullptr;
    const float* Vtg = Vt ? Vt + bg * group_floats(g.S, g.dv) : nullptr;
    detail::parallel_for(
        items, 1,
        [&](std::size_t begin, std::size_t end, std::size_t c) {
          for (std::size_t it = begin; it < end; ++it)
            block(b, kvh * g.r + it / nb, it % nb, dK ? part_k.data() + c * kd : nullptr, g.dk,
                  dV ? part_v.data() + c * vd : nullptr, g.dv, Ktg, Vtg);
        },
        1);
    for (std::size_t c = 0; c < chunks; ++c) {  // in chunk order: deterministic
      if (dK) add_rows(part_k.data() + c * kd, g.S, g.dk, group_dK(b, kvh), P.lk.st);
      if (dV) add_rows(part_v.data() + c * vd, g.S, g.dv, group_dV(b, kvh), P.lv.st);
    }
  }
}

// One query row of head h (batch b) over keys [0, n) of Kr / Vr: forward_block's arithmetic for
// a block of one row that sees all n keys (block_scores, the softmax, the A V product).
template <class T>
void one_query_row(const T* q, const T* Kr, const T* Vr, std::size_t n, std::size_t dk, std::size_t dv, T scale,
                   bool check_finite, std::size_t b, std::size_t h, std::size_t key0, T* row, T* o) {
  blas::gemm(false, true, 1, n, dk, scale, q, dk, Kr, dk, T(0), row, n);
  if (check_finite && !all_finite(row, n))
    for (std::size_t j = 0; j < n; ++j)
      if (!std::isfinite(row[j]))
        throw ValueError(op_message(kOp, "score U has " + std::to_string(row[j]) + " at " + where(b, h, 0) +
                                             ", key " + std::to_string(key0 + j) +
                                             "; a non-finite score is a numerical error (Algorithm 5.1 step 3)"));
  T m = -std::numeric_limits<T>::infinity();
  for (std::size_t j = 0; j < n; ++j) m = std::max(m, row[j]);
  if (!std::isfinite(m))
    throw ValueError(op_message(kOp, "score plus bias is " + std::to_string(m) + " at " + where(b, h, 0) +
                                         "; the additive bias overflows the scores (Algorithm 5.1 step 3)"));
  for (std::size_t j = 0; j < n; ++j) row[j] -= m;
  vmath::exp(row, row, n);
  T z = 0;
  for (std::size_t j = 0; j < n; ++j) z += row[j];
  const T inv = T(1) / z;
  for (std::size_t j = 0; j < n; ++j) row[j] *= inv;
  blas::gemm(false, false, 1, dv, n, T(1), row, n, Vr, dv, T(0), o, dv);
}


// One query row over keys [0, n) of Kr / Vr (rows dk, dv apart) on the tile kernels:
// forward_block_tiles' arithmetic for a block of one row whose keys start at key0 (tiles from
// there, each tile of K transposed into Kt first), so the same bits as flash_attention() on
// copies of those keys. S holds kTile floats, Kt dk * kTile, acc dv. With `Kc` (the keys already
// transposed tile by tile, KVCache::key_columns(): the tile of keys [t kTile, (t + 1) kTile) is
// the contiguous [dk, kTile] block at Kc + t dk kTile, key j of it at column j) the tiles are
// read from there in place: the same products on the same values.
void one_query_tiles(const tile::Kernels& kz, const float* q, const float* Kr, const float* Kc,
                     const float* Vr, std::size_t n, std::size_t dk, std::size_t dv, float scale, bool check_finite,
                     std::size_t b, std::size_t h, std::size_t key0, float* S, float* Kt, float* acc, float* o) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float m = kNegInf, l = 0.0f;
  std::fill(acc, acc + dv, 0.0f);
  for (std::size_t kb0 = 0; kb0 < n; kb0 += kTile) {
    const std::size_t nk = std::min(kTile, n - kb0);
    if (Kc) {
      // The columns up to nk rounded up to 16 (a whole number of vectors at either ISA's width):
      // the scores past nk are computed from whatever those columns hold and never read, and each
      // score is its own chain over the features, so a partial tile reads fewer lines of its
      // block of K^T (one of the four of each row for up to 16 keys) with the same bits.
      const std::size_t cols = std::min(kTile, (nk + 15) / 16 * 16);
      kz.gemm(1, cols, dk, scale, q, dk, 1, Kc + (kb0 / kTile) * dk * kTile, kTile, S, kTile, false);
    } else {
      kz.transpose(Kr + kb0 * dk, dk, nk, dk, Kt, kTile);
      for (std::size_t c = 0; c < dk; ++c) std::fill(Kt + c * kTile + nk, Kt + (c + 1) * kTile, 0.0f);
      kz.gemm(1, kTile, dk, scale, q, dk, 1, Kt, kTile, S, kTile, false);
    }
    if (check_finite && !kz.finite(S, nk))
      for (std::size_t j = 0; j < nk; ++j)
        if (!std::isfinite(S[j]))
          throw ValueError(op_message(kOp, "score U has " + std::to_string(S[j]) + " at " + where(b, h, 0) + ", key " +
                                               std::to_string(key0 + kb0 + j) +
                                               "; a non-finite score is a numerical error (Algorithm 5.1 step 3)"));
    const float mx = kz.max(S, nk);
    if (mx == kNegInf) continue;
    if (!std::isfinite(mx))
      throw ValueError(op_message(kOp, "score plus bias is " + std::to_string(mx) + " at " + where(b, h, 0) +
                                           "; the additive bias overflows the scores (Algorithm 5.1 step 3)"));
    if (mx > m) {
      if (m != kNegInf) {
        const float f = std::exp(m - mx);
        l *= f;
        for (std::size_t c = 0; c < dv; ++c) acc[c] *= f;
      }
      m = mx;
    }
    l += kz.exp_shift(S, nk, m, 0.0f);
    std::fill(S + nk, S + kTile, 0.0f);
    kz.gemm(1, dv, nk, 1.0f, S, kTile, 1, Vr + kb0 * dv, dv, acc, dv, true);
  }
  if (m == kNegInf)
    throw VisibilityError(op_message(kOp, where(b, h, 0) + " is valid but sees no key; check mask polarity "
                                                             "and causal offset, or mark the query invalid"));
  const float inv = 1.0f / l;
  for (std::size_t c = 0; c < dv; ++c) o[c] = acc[c] * inv;
}

#include "detail/flash_double_backward.inc"

struct Saved {
  Geometry g;
  Layout lq, lk, lv, lo;            // of Q, K, V and O (Problem)
  std::size_t oq = 0, ok = 0, ov = 0;  // offsets of Q, K, V in their arrays (the packed op's columns)
  VisibilityPlan plan;
  FlashOptions opts;
  Array row_max, log_z;  // per query row: m = max score, log z = log sum exp(u - m) (weights_row)
  bool bf16 = false;     // the forward's tile products ran in bfloat16: the backward's do too
};

template <class T> Problem<T> problem(const Saved& s, const Array& Q, const Array& K, const Array& V) {
  Problem<T> P;
  P.g = s.g;
  P.Q = Q.data<T>() + s.oq;
  P.K = K.data<T>() + s.ok;
  P.V = V.data<T>() + s.ov;
  P.lq = s.lq;
  P.lk = s.lk;
  P.lv = s.lv;
  P.lo = s.lo;
  P.scale = static_cast<T>(s.opts.scale);
  P.plan = &s.plan;
  P.valid = s.opts.query_valid.size() ? s.opts.query_valid.data.data() : nullptr;
  P.dropout = s.opts.dropout_p > 0.0;
  P.seed = s.opts.dropout_seed;
  P.row_offset = s.opts.dropout_row_offset;
  P.threshold = dropout_keep_threshold(s.opts.dropout_p);
  P.inv_q = static_cast<T>(1.0 / (1.0 - s.opts.dropout_p));
  P.check_finite = s.opts.check_finite;
  P.bf16 = s.bf16;
  return P;
}

// Runs the forward pass into O (uninitialised on entry: run_forward zeroes it block by block) and
// keeps the row statistics in s.
void forward(Saved& s, const Array& Q, const Array& K, const Array& V, Array& O) {
  const Geometry& g = s.g;
  s.row_max = Array::zeros({g.B, g.Hq, g.T}, Q.dtype());
  s.log_z = Array::zeros({g.B, g.Hq, g.T}, Q.dtype());
  // bfloat16 mixed precision (xg::set_matmul_dtype) as in effect now, like ops::matmul records it
  s.bf16 = Q.dtype() == DType::float32 && effective_matmul_dtype() == MatmulDtype::bfloat16 &&
           tile::bf16_choice().use();
  detail::dispatch(Q.dtype(), [&](auto t) {
    using T = decltype(t);
    const Problem<T> P = problem<T>(s, Q, K, V);
    run_forward(P, O.data<T>(), s.row_max.data<T>(), s.log_z.data<T>());
  });
}

// ---- create_graph: the second-order rule is the composed path's, recomputed (composed_vjp)

// The composed attention of the saved geometry, plan and options (as nn/sdpa.cpp's composed
// path): U = Q K^T scale + M (M from the plan; 0 on invalid queries' rows), A = softmax(U),
// dropout with the same seed's mask, O = A V, invalid queries' rows selected to zero.
// Which queries are valid, as a [B, 1, T, 1] mask (only when the options give validity).
BoolArray validity_keep(const Saved& s) {
  const Geometry& g = s.g;
  BoolArray keep({g.B, 1, g.T, 1}, std::vector<unsigned char>(g.B * g.T));
  for (std::size_t b = 0; b < g.B; ++b)
    for (std::size_t i = 0; i < g.T; ++i) keep.data[b * g.T + i] = s.opts.query_valid.data[b * g.T + i] ? 1 : 0;
  return keep;
}

// The composed weights A = softmax(Q K^T scale + M), [B, H_q, T, S] (before dropout).
Tensor composed_weights(const Tensor& Q, const Tensor& K, const Saved& s) {
  const Geometry& g = s.g;
  const Shape BHTS{g.B, g.Hq, g.T, g.S};
  const DType dt = Q.dtype();
  const bool any_validity = s.opts.query_valid.size() > 0;
  auto valid = [&](std::size_t b, std::size_t i) { return !any_validity || s.opts.query_valid.data[b * g.T + i]; };
  Array M = Array::zeros(BHTS, dt);
  std::vector<double> row(g.S);
  std::vector<float> rowf(g.S);
  bool masked = false;
  for (std::size_t b = 0; b < g.B; ++b)
    for (std::size_t h = 0; h < g.Hq; ++h)
      for (std::size_t i = 0; i < g.T; ++i) {
        if (!valid(b, i)) continue;
        std::size_t lo = 0, hi = 0;
        const bool exact = s.plan.range(b, h, i, lo, hi);
        const std::size_t base = ((b * g.Hq + h) * g.T + i) * g.S;
        for (std::size_t j = 0; j < g.S; ++j)
          if (j < lo || j >= hi) {
            M.set_flat(base + j, -std::numeric_limits<double>::infinity());
            masked = true;
          }
        if (exact || hi <= lo) continue;
        masked = true;
        if (dt == DType::float32) {
          std::fill(rowf.begin(), rowf.begin() + static_cast<long>(hi - lo), 0.0f);
          s.plan.apply(b, h, i, lo, hi, rowf.data());
          for (std::size_t j = lo; j < hi; ++j) M.set_flat(base + j, rowf[j - lo]);
        } else {
          std::fill(row.begin(), row.begin() + static_cast<long>(hi - lo), 0.0);
          s.plan.apply(b, h, i, lo, hi, row.data());
          for (std::size_t j = lo; j < hi; ++j) M.set_flat(base + j, row[j - lo]);
        }
      }
  const auto L = [](std::size_t v) { return static_cast<long>(v); };
  const Tensor Qg = ops::reshape(Q, {L(g.B), L(g.Hkv), L(g.r * g.T), L(g.dk)});
  Tensor U = ops::reshape(ops::matmul(Qg, K, {false, true}), {L(g.B), L(g.Hq), L(g.T), L(g.S)}) * s.opts.scale;
  if (masked) U = ops::add_mask(U, M);
  return ops::softmax(U, -1);
}

Array composed_dropout_mask(const Saved& s, DType dt) {
  const Geometry& g = s.g;
  return attention_dropout_mask({g.B, g.Hq, g.T, g.S}, s.opts.dropout_p, s.opts.dropout_seed, dt,
                                s.opts.dropout_row_offset);
}

// The composed attention of the saved geometry, plan and options (as nn/sdpa.cpp's composed
// path): U = Q K^T scale + M (M from the plan; 0 on invalid queries' rows), A = softmax(U),
// dropout with the same seed's mask, O = A V, invalid queries' rows selected to zero.
Tensor composed_attention(const Tensor& Q, const Tensor& K, const Tensor& V, const Saved& s) {
  const Geometry& g = s.g;
  const auto L = [](std::size_t v) { return static_cast<long>(v); };
  Tensor A = composed_weights(Q, K, s);
  if (s.opts.dropout_p > 0) A = ops::apply_dropout_mask(A, composed_dropout_mask(s, Q.dtype()));
  Tensor O = ops::reshape(ops::matmul(ops::reshape(A, {L(g.B), L(g.Hkv), L(g.r * g.T), L(g.S)}), V),
                          {L(g.B), L(g.Hq), L(g.T), L(g.dv)});
  if (s.opts.query_valid.size() > 0) O = ops::where(validity_keep(s), O, ops::scalar_like(O, 0.0));
  return O;
}

// The composed attention's first-order VJP written with recorded ops: (dQ, dK, dV) at (Q, K, V)
// for the output cotangent dO ([B, H_q, T, d_v]). The fused backward op's second-order rule
// (third derivatives of the attention) differentiates this.
struct ComposedGrads {
  Tensor dQ, dK, dV;
};
ComposedGrads composed_attention_backward(const Tensor& Q, const Tensor& K, const Tensor& V, Tensor dO,
                                          const Saved& s) {
  const Geometry& g = s.g;
  const auto L = [](std::size_t v) { return static_cast<long>(v); };
  const Tensor A = composed_weights(Q, K, s);
  Tensor Ad = A;
  Array mask;
  if (s.opts.dropout_p > 0) {
    mask = composed_dropout_mask(s, Q.dtype());
    Ad = ops::apply_dropout_mask(A, mask);
  }
  if (s.opts.query_valid.size() > 0) dO = ops::where(validity_keep(s), dO, ops::scalar_like(dO, 0.0));
  const Tensor dOg = ops::reshape(dO, {L(g.B), L(g.Hkv), L(g.r * g.T), L(g.dv)});
  Tensor dA = ops::reshape(ops::matmul(dOg, V, {false, true}), {L(g.B), L(g.Hq), L(g.T), L(g.S)});
  if (mask.defined()) dA = ops::apply_dropout_mask(dA, mask);
  const Tensor dU = A * (dA - ops::sum(A * dA, {-1}, true));
  const Tensor dUg = ops::reshape(dU, {L(g.B), L(g.Hkv), L(g.r * g.T), L(g.S)});
  const Tensor Qg = ops::reshape(Q, {L(g.B), L(g.Hkv), L(g.r * g.T), L(g.dk)});
  ComposedGrads out;
  out.dQ = ops::reshape(ops::matmul(dUg, K), {L(g.B), L(g.Hq), L(g.T), L(g.dk)}) * s.opts.scale;
  out.dK = ops::matmul(dUg, Qg, {true, false}) * s.opts.scale;
  out.dV = ops::matmul(ops::reshape(Ad, {L(g.B), L(g.Hkv), L(g.r * g.T), L(g.S)}), dOg, {true, false});
  return out;
}

// The ops' VJPs as named types: the second-order rules read the saved plan and options.
struct FlashVjp {
  std::shared_ptr<Saved> saved;
  Cotangents operator()(const VjpContext& c) const;
};
struct FlashPackedVjp {
  std::shared_ptr<Saved> saved;
  Cotangents operator()(const VjpContext& c) const;
};

// ---- create_graph: the fused second-order rule (nn/detail/flash_double_backward.inc)

std::atomic<int> g_second_order{static_cast<int>(AttentionSecondOrder::fused)};

// P [B, T, (H_q + 2 H_kv) d] -> heads [B, n, T, d] of the n heads whose columns start at off.
Tensor packed_heads(const Tensor& P, const Saved& s, std::size_t off, std::size_t n) {
  const Geometry& g = s.g;
  const auto L = [](std::size_t v) { return static_cast<long>(v); };
  const Tensor cols = ops::slice(P, 2, L(off), L(off + n * g.dk));
  return ops::permute(ops::reshape(cols, {L(g.B), L(g.T), L(n), L(g.dk)}), {0, 2, 1, 3});
}
// heads [B, H, T, d] -> [B, T, H d] (O's layout in the packed op).
Tensor merge_heads(const Tensor& X) {
  const auto L = [](std::size_t v) { return static_cast<long>(v); };
  const Shape& sh = X.shape();
  return ops::reshape(ops::permute(X, {0, 2, 1, 3}), {L(sh[0]), L(sh[2]), L(sh[1] * sh[3])});
}

// The recorded backward pass of a fused attention op: "attention_backward" (inputs Q, K, V,
// dO; output [dQ | dK | dV] flattened, each contiguous) or "attention_packed_backward" (inputs
// P, dO; output dP, P's shape). Its VJP is the double-backward kernel; its own second-order rule
// (third derivatives) differentiates the composed path's backward, composed_attention_backward.
struct AttentionBackwardVjp {
  std::shared_ptr<Saved> saved;
  bool packed = false;
  Cotangents operator()(const VjpContext& c) const;
};

// G(inputs, dO) from recorded ops, the function the backward op computes (for its rule).
Tensor composed_backward_value(const std::vector<Tensor>& in, const Saved& s, bool packed) {
  const auto L = [](std::size_t v) { return static_cast<long>(v); };
  const Geometry& g = s.g;
  if (packed) {
    const Tensor dO = ops::permute(ops::reshape(in[1], {L(g.B), L(g.T), L(g.Hq), L(g.dv)}), {0, 2, 1, 3});
    const ComposedGrads d = composed_attention_backward(packed_heads(in[0], s, s.oq, g.Hq),
                                                        packed_heads(in[0], s, s.ok, g.Hkv),
                                                        packed_heads(in[0], s, s.ov, g.Hkv), dO, s);
    return ops::concat({merge_heads(d.dQ), merge_heads(d.dK), merge_heads(d.dV)}, 2);
  }
  const ComposedGrads d = composed_attention_backward(in[0], in[1], in[2], in[3], s);
  return ops::concat({ops::reshape(d.dQ, {-1}), ops::reshape(d.dK, {-1}), ops::reshape(d.dV, {-1})}, 0);
}

DiffVjpFn backward_op_rule() {
  return second_order([](const DiffVjpContext& c) {
    const AttentionBackwardVjp& v = c.first_order_as<AttentionBackwardVjp>();
    const Saved& s = *v.saved;
    const bool packed = v.packed;
    return composed_vjp(c, [&s, packed](const std::vector<Tensor>& in) { return composed_backward_value(in, s, packed); });
  });
}

// The fused rule of flash_attention: (dQ, dK, dV) as slices of one recorded backward op.
DiffCotangents fused_rule(const DiffVjpContext& c, const std::shared_ptr<Saved>& saved) {
  const Tensor &Q = c.inputs[0], &K = c.inputs[1], &V = c.inputs[2];
  const std::size_t nQ = Q.size(), nK = K.size(), nV = V.size();
  Array flat = Array::zeros({nQ + nK + nV}, Q.dtype());  // run_backward adds into it
  detail::dispatch(Q.dtype(), [&](auto t) {
    using T = decltype(t);
    const Problem<T> P = problem<T>(*saved, Q.value(), K.value(), V.value());
    T* base = flat.data<T>();
    run_backward(P, saved->row_max.data<T>(), saved->log_z.data<T>(), c.output.value().data<T>(),
                 c.grad_output.value().data<T>(), base, base + nQ, base + nQ + nK);
  });
  const Tensor G = record("attention_backward", std::move(flat), {Q, K, V, c.grad_output},
                          AttentionBackwardVjp{saved, false}, backward_op_rule());
  const auto L = [](std::size_t v) { return static_cast<long>(v); };
  const auto part = [&](long from, std::size_t n, const Shape& shape) {
    std::vector<long> dims(shape.begin(), shape.end());
    return ops::reshape(ops::slice(G, 0, from, from + L(n)), dims);
  };
  DiffCotangents cot(3);
  if (c.needs(0)) cot[0] = part(0, nQ, Q.shape());
  if (c.needs(1)) cot[1] = part(L(nQ), nK, K.shape());
  if (c.needs(2)) cot[2] = part(L(nQ + nK), nV, V.shape());
  return cot;
}

// The fused rule of flash_attention_packed: dP is the recorded backward op's output itself.
DiffCotangents fused_packed_rule(const DiffVjpContext& c, const std::shared_ptr<Saved>& saved) {
  const Tensor& P = c.inputs[0];
  const std::vector<Array> values{P.value()};
  const std::vector<bool> needs{true};
  const Cotangents dP = FlashPackedVjp{saved}(VjpContext{values, c.output.value(), c.grad_output.value(), needs});
  return DiffCotangents{record("attention_packed_backward", dP[0], {P, c.grad_output},
                               AttentionBackwardVjp{saved, true}, backward_op_rule())};
}

}  // namespace

void set_attention_second_order(AttentionSecondOrder path) { g_second_order.store(static_cast<int>(path)); }
AttentionSecondOrder attention_second_order() { return static_cast<AttentionSecondOrder>(g_second_order.load()); }

bool attention_dropout_keep(std::uint64_t seed, std::uint64_t flat, double p) {
  return ops::dropout_keep(seed, flat, p);
}

Array attention_dropout_mask(const Shape& BHTS, double p, std::uint64_t seed, DType dtype, std::size_t row_offset) {
  return ops::dropout_mask_from_seed(kOp, "dropout_p", BHTS, p, seed, dtype, row_offset);
}

std::uint64_t partial_tile_calls(PartialTilePath path) {
  return g_partial_tiles[static_cast<int>(path)].load(std::memory_order_relaxed);
}
void set_exact_parts(bool on) { g_exact_parts.store(on, std::memory_order_relaxed); }

Tensor flash_attention(const Tensor& Q, const Tensor& K, const Tensor& V, const VisibilityPlan& plan,
                       const FlashOptions& opts) {
  auto saved = std::make_shared<Saved>();
  Geometry& g = saved->g;
  g.B = Q.shape()[0];
  g.Hq = Q.shape()[1];
  g.T = Q.shape()[2];
  g.dk = Q.shape()[3];
  g.Hkv = K.shape()[1];
  g.S = K.shape()[2];
  g.dv = V.shape()[3];
  g.r = g.Hkv ? g.Hq / g.Hkv : 1;
  saved->lq = contiguous(g.Hq, g.T, g.dk);
  saved->lk = contiguous(g.Hkv, g.S, g.dk);
  saved->lv = contiguous(g.Hkv, g.S, g.dv);
  saved->lo = contiguous(g.Hq, g.T, g.dv);
  saved->plan = plan;
  saved->opts = opts;
  Array O = Array::empty({g.B, g.Hq, g.T, g.dv}, Q.dtype());  // every row written by run_forward
  forward(*saved, Q.value(), K.value(), V.value(), O);
  return record("flash_attention", std::move(O), {Q, K, V}, FlashVjp{saved}, second_order([](const DiffVjpContext& c) {
                  const std::shared_ptr<Saved>& saved = c.first_order_as<FlashVjp>().saved;
                  if (attention_second_order() == AttentionSecondOrder::fused) return fused_rule(c, saved);
                  const Saved& s = *saved;
                  return composed_vjp(c, [&s](const std::vector<Tensor>& in) {
                    return composed_attention(in[0], in[1], in[2], s);
                  });
                }));
}

Cotangents FlashVjp::operator()(const VjpContext& c) const {
  Cotangents cot(3);
  detail::dispatch(c.output.dtype(), [&](auto t) {
    using T = decltype(t);
    const Problem<T> P = problem<T>(*saved, c.inputs[0], c.inputs[1], c.inputs[2]);
    Array dQ, dK, dV;
    // run_backward adds into them
    if (c.needs(0)) dQ = Array::zeros(c.inputs[0].shape(), c.inputs[0].dtype());
    if (c.needs(1)) dK = Array::zeros(c.inputs[1].shape(), c.inputs[1].dtype());
    if (c.needs(2)) dV = Array::zeros(c.inputs[2].shape(), c.inputs[2].dtype());
    run_backward(P, saved->row_max.data<T>(), saved->log_z.data<T>(), c.output.data<T>(), c.grad_output.data<T>(),
                 dQ.defined() ? dQ.data<T>() : nullptr, dK.defined() ? dK.data<T>() : nullptr,
                 dV.defined() ? dV.data<T>() : nullptr);
    cot[0] = dQ;
    cot[1] = dK;
    cot[2] = dV;
  });
  return cot;
}

Tensor flash_attention_packed(const Tensor& P, std::size_t H_q, std::size_t H_kv, const VisibilityPlan& plan,
                              const FlashOptions& opts) {
  auto saved = std::make_shared<Saved>();
  Geometry& g = saved->g;
  const std::size_t W = P.shape()[2], d = W / (H_q + 2 * H_kv);
  g.B = P.shape()[0];
  g.T = g.S = P.shape()[1];
  g.Hq = H_q;
  g.Hkv = H_kv;
  g.r = H_q / H_kv;
  g.dk = g.dv = d;
  saved->lq = saved->lk = saved->lv = Layout{g.T * W, d, W};  // [Q heads | K heads | V heads] per row
  saved->ok = H_q * d;
  saved->ov = (H_q + H_kv) * d;
  saved->lo = Layout{g.T * H_q * d, d, H_q * d};  // O [B, T, H_q d]: the heads merged
  saved->plan = plan;
  saved->opts = opts;
  Array O = Array::empty({g.B, g.T, H_q * d}, P.dtype());  // every row written by run_forward
  forward(*saved, P.value(), P.value(), P.value(), O);
  return record("flash_attention_packed", std::move(O), {P}, FlashPackedVjp{saved},
                second_order([](const DiffVjpContext& c) {
                  const std::shared_ptr<Saved>& saved = c.first_order_as<FlashPackedVjp>().saved;
                  if (attention_second_order() == AttentionSecondOrder::fused) return fused_packed_rule(c, saved);
                  const Saved& s = *saved;
                  return composed_vjp(c, [&s](const std::vector<Tensor>& in) {
                    // P [B, T, (H_q + 2 H_kv) d]: Q, K, V heads as columns; O [B, T, H_q d].
                    const Geometry& g = s.g;
                    return merge_heads(composed_attention(packed_heads(in[0], s, s.oq, g.Hq),
                                                          packed_heads(in[0], s, s.ok, g.Hkv),
                                                          packed_heads(in[0], s, s.ov, g.Hkv), s));
                  });
                }));
}

Cotangents FlashPackedVjp::operator()(const VjpContext& c) const {
  Cotangents cot(1);
  detail::dispatch(c.output.dtype(), [&](auto t) {
    using T = decltype(t);
    const Array& in = c.inputs[0];
    const Problem<T> Pr = problem<T>(*saved, in, in, in);
    // Every column is Q's, K's or V's: run_backward adds into all of them.
    Array dP = Array::zeros(in.shape(), in.dtype());
    T* base = dP.data<T>();
    run_backward(Pr, saved->row_max.data<T>(), saved->log_z.data<T>(), c.output.data<T>(), c.grad_output.data<T>(),
                 base + saved->oq, base + saved->ok, base + saved->ov);
    cot[0] = dP;
  });
  return cot;
}

Cotangents AttentionBackwardVjp::operator()(const VjpContext& c) const {
  const Saved& s = *saved;
  const std::size_t n_in = packed ? 2 : 4, idO = n_in - 1;
  Cotangents cot(n_in);
  detail::dispatch(c.output.dtype(), [&](auto t) {
    using T = decltype(t);
    const Array& dO = c.inputs[idO];
    const T* u = c.grad_output.data<T>();
    DoubleBackwardIo<T> io;
    io.dO = dO.data<T>();
    Problem<T> P;
    if (packed) {
      P = problem<T>(s, c.inputs[0], c.inputs[0], c.inputs[0]);
      io.uQ = u + s.oq;
      io.uK = u + s.ok;
      io.uV = u + s.ov;
      if (c.needs(0)) {  // every column is Q's, K's or V's: run_double_backward fills them all
        cot[0] = Array::empty(c.inputs[0].shape(), c.inputs[0].dtype());
        T* base = cot[0].template data<T>();
        io.Qbar = base + s.oq;
        io.Kbar = base + s.ok;
        io.Vbar = base + s.ov;
      }
    } else {
      P = problem<T>(s, c.inputs[0], c.inputs[1], c.inputs[2]);
      const std::size_t nQ = c.inputs[0].size(), nK = c.inputs[1].size();
      io.uQ = u;
      io.uK = u + nQ;
      io.uV = u + nQ + nK;
      T** outs[3] = {&io.Qbar, &io.Kbar, &io.Vbar};
      for (std::size_t k = 0; k < 3; ++k)
        if (c.needs(k)) {
          cot[k] = Array::empty(c.inputs[k].shape(), c.inputs[k].dtype());
          *outs[k] = cot[k].template data<T>();
        }
    }
    if (c.needs(idO)) {
      cot[idO] = Array::empty(dO.shape(), dO.dtype());
      io.dObar = cot[idO].template data<T>();
    }
    run_double_backward(P, s.row_max.data<T>(), s.log_z.data<T>(), io);
  });
  return cot;
}

Array attention_one_query(const Array& Q, const Array& K, const Array& V, std::size_t lo, std::size_t hi, double scale,
                          bool check_finite, const Array& K_columns) {
  const std::size_t B = Q.shape()[0], Hq = Q.shape()[1], dk = Q.shape()[3];
  const std::size_t Hkv = K.shape()[1], cap = K.shape()[2], dv = V.shape()[3], r = Hq / Hkv, n = hi - lo;
  static_assert(nn::KVCache::kColumnTile == kTile, "the cache's tiles of K^T are the fused path's tiles of keys");
  if (K_columns.defined()) {
    const Shape& kc = K_columns.shape();
    if (kc.size() != 5 || kc[0] != B || kc[1] != Hkv || kc[3] != dk || kc[4] != kTile || kc[2] * kTile < cap ||
        K_columns.dtype() != DType::float32)
      throw ShapeError(op_message("attention_one_query", "K_columns must be the cache's keys transposed tile by tile, "
                                                         "float32 (" + std::to_string(B) + ", " + std::to_string(Hkv) +
                                                         ", tiles, " + std::to_string(dk) + ", " + std::to_string(kTile) +
                                                         ") with tiles * " + std::to_string(kTile) + " >= " +
                                                         std::to_string(cap) + ", got " + dtype_name(K_columns.dtype()) +
                                                         " " + shape_str(kc)));
  }
  const std::size_t tiles = K_columns.defined() ? K_columns.shape()[2] : 0;  // rank 5, checked above
  Array O = Array::empty({B, Hq, 1, dv}, Q.dtype());
  detail::dispatch(Q.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* q = Q.data<T>();
    const T* k = K.data<T>();
    const T* v = V.data<T>();
    T* o = O.data<T>();
    const T sc = static_cast<T>(scale);
    // As flash_attention's forward pass: (batch, head) items split over the pool, unless the
    // whole step is too small to be worth waking it (each row's result is the same either way).
    const std::size_t items = B * Hq;
    const double flops = 2.0 * double(items) * double(n) * double(dk + dv);
    const tile::Kernels* kz = nullptr;
    if constexpr (std::is_same<T, float>::value) {
      Geometry g1;
      g1.dk = dk;
      g1.dv = dv;
      if (tile_path(g1, tile::kernels())) kz = tile::kernels();
    }
    detail::parallel_for(items, flops < 131072.0 ? items : 1, [&](std::size_t begin, std::size_t end, std::size_t) {
      if constexpr (std::is_same<T, float>::value) {
        if (kz) {
          thread_local detail::AlignedVector<float> t_buf;
          float* S = scratch(t_buf, kTile + dk * kTile + dv);
          // The cache's keys transposed tile by tile, where the first key starts a tile.
          const float* kc = tiles > 0 && lo % kTile == 0 ? K_columns.data<float>() : nullptr;
          for (std::size_t it = begin; it < end; ++it) {
            const std::size_t b = it / Hq, h = it % Hq, g = b * Hkv + h / r;
            const float* kc_g = kc ? kc + (g * tiles + lo / kTile) * dk * kTile : nullptr;
            one_query_tiles(*kz, q + it * dk, k + (g * cap + lo) * dk, kc_g,
                            v + (g * cap + lo) * dv, n, dk, dv, sc, check_finite, b, h, lo, S, S + kTile,
                            S + kTile + dk * kTile, o + it * dv);
          }
          return;
        }
      }
      thread_local detail::AlignedVector<T> s_buf;
      T* row = scratch(s_buf, n);
      for (std::size_t it = begin; it < end; ++it) {
        const std::size_t b = it / Hq, h = it % Hq, g = b * Hkv + h / r;
        one_query_row(q + it * dk, k + (g * cap + lo) * dk, v + (g * cap + lo) * dv, n, dk, dv, sc, check_finite, b,
                      h, lo, row, o + it * dv);
      }
    });
  });
  return O;
}

std::string bfloat16_attention_kernels() {
  const tile::Bf16Choice& c = tile::bf16_choice();
  if (!c.use()) return "float32 (" + c.why + ")";
  return (c.engine == tile::Bf16Engine::amx ? "AMX bfloat16 tiles (" : "AVX512_BF16 dot products (") + c.why + ")";
}

}  // namespace xg::nn
