// The bfloat16 GEMM kernel (core/detail/bf16_gemm.hpp) and the matmul precision switch
// (core/matmul_dtype.hpp).
//
// Layout. op(B) is packed, one K block at a time, into panels of 32 columns: for each pair of
// rows (k, k+1) of the block, 32 32-bit words, word j holding the bfloat16 pair
// (op(B)[k][j], op(B)[k+1][j]) -- the operand layout of VDPBF16PS, which adds a[2i] b[2i] +
// a[2i+1] b[2i+1] to float32 lane i. op(A) is packed in groups of kMR rows of words
// (op(A)[i][k], op(A)[i][k+1]), pair-major or row-major, whichever is a plain conversion of
// A's memory (pack_a). The micro-kernel keeps a kMR x 32
// tile of C in 2 kMR zmm accumulators and, per pair of k, broadcasts one word of A against the
// two zmm of B. Odd K and the edges are zero-padded in the packed copies; C's edges are
// written with masked stores.
#include <xgrad/core/detail/bf16_gemm.hpp>
#include <xgrad/core/matmul_dtype.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/transpose16.hpp>
#include <xgrad/core/error.hpp>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define XGRAD_BF16_X86 1
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector that
// -Wuninitialized then reports inside the header (GCC bug 105593; as in nn/flash_tile.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#else
#define XGRAD_BF16_X86 0
#endif

namespace xg::blas::bf16 {

namespace {
bool detect() {
#if XGRAD_BF16_X86
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl"))
    return false;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1u;  // CPUID.(EAX=7,ECX=1):EAX[5] AVX512_BF16
#else
  return false;
#endif
}
}  // namespace

bool cpu_supported() {
  static const bool supported = detect();  // cpuid once (it traps to the hypervisor in a VM)
  return supported;
}

std::uint16_t round_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN: quiet, sign kept
  if (mag < 0x00800000u) return static_cast<std::uint16_t>((u >> 16) & 0x8000u);  // zero, denormal: signed 0
  u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even (overflow carries into infinity)
  return static_cast<std::uint16_t>(u >> 16);
}

float widen(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

#if XGRAD_BF16_X86
namespace {

#define XGRAD_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr std::size_t kMR = 8;    // rows of the micro-tile
constexpr std::size_t kNR = 32;   // columns of the micro-tile (two zmm of float32)
constexpr std::size_t kKC = 256;  // K block (even: blocks start on a pair)
constexpr std::size_t kMC = 96;   // rows of A packed at once (a multiple of kMR)

inline __mmask16 lanes(std::size_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// 32 bfloat16 values v[0..15] = lo, v[16..31] = hi, reordered to the pairs (lo[j], hi[j]).
XGRAD_BF16_TARGET inline __m512i interleave(__m512 lo, __m512 hi) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
  __m512i bits;
  std::memcpy(&bits, &v, sizeof bits);
  return _mm512_permutexvar_epi16(idx, bits);
}

// 32 consecutive floats x[0..n) (zeros beyond n, n <= 32) as words of pairs (x[2q], x[2q+1]):
// the first ceil(n / 2) of the 16 are stored.
XGRAD_BF16_TARGET inline void pairs_of_row(const float* x, std::size_t n, std::uint32_t* out) {
  const __m512 lo = _mm512_maskz_loadu_ps(lanes(n), x);
  const __m512 hi = _mm512_maskz_loadu_ps(lanes(n > 16 ? n - 16 : 0), x + 16);
  const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);  // bf16 of x[0..32) in order
  __m512i w;
  std::memcpy(&w, &v, sizeof w);
  _mm512_mask_storeu_epi32(out, lanes((n + 1) / 2), w);
}

// Rows (2p, 2p+1) of a row-major block where the pairs run down the columns: words
// (r0[j], r1[j]) for j < n (n <= 16), zeros beyond; r1 may be null (odd K: a zero row).
XGRAD_BF16_TARGET inline void pairs_of_rows(const float* r0, const float* r1, std::size_t n, std::uint32_t* out) {
  const __m512 a = _mm512_maskz_loadu_ps(lanes(n), r0);
  const __m512 b = r1 ? _mm512_maskz_loadu_ps(lanes(n), r1) : _mm512_setzero_ps();
  _mm512_storeu_si512(out, interleave(a, b));
}

// op(B)[k0 .. k0+kc) x [0, N) into panels (layout above), kc2 = ceil(kc / 2) pairs each.
XGRAD_BF16_TARGET void pack_b(bool tb, const float* B, std::size_t ldb, std::size_t k0, std::size_t kc,
                              std::size_t N, std::uint32_t* out) {
  const std::size_t kc2 = (kc + 1) / 2, panels = (N + kNR - 1) / kNR;
  if (!tb) {  // op(B)[k][j] = B[k ldb + j]: rows k and k+1 side by side
    // Pairs of rows outermost: each row is read from start to end. (Panels outermost read 128
    // bytes of every row of the block in turn: too many streams for the prefetchers.)
    for (std::size_t p = 0; p < kc2; ++p) {
      const std::size_t k = k0 + 2 * p;
      const float* r0 = B + k * ldb;
      const float* r1 = 2 * p + 1 < kc ? r0 + ldb : nullptr;
      for (std::size_t q = 0; q < panels; ++q) {
        const std::size_t j0 = q * kNR, nq = std::min(kNR, N - j0);
        std::uint32_t* dst = out + q * kc2 * kNR + p * kNR;
        pairs_of_rows(r0 + j0, r1 ? r1 + j0 : nullptr, std::min<std::size_t>(nq, 16), dst);
        if (nq > 16)
          pairs_of_rows(r0 + j0 + 16, r1 ? r1 + j0 + 16 : nullptr, nq - 16, dst + 16);
        else
          _mm512_storeu_si512(dst + 16, _mm512_setzero_si512());
      }
    }
    return;
  }
  // op(B)[k][j] = B[j ldb + k]: column j of op(B) is contiguous. Sixteen columns at a time, 32
  // values of k each: each column's 16 words of pairs (k, k+1) in a row of w, columns past N
  // zero, then a 16 x 16 word transpose puts each pair row's 16 words side by side in the panel
  // (straight into it where 16 pair rows remain, else through t).
  alignas(64) std::uint32_t w[16 * 16], t[16 * 16];
  for (std::size_t q = 0; q < panels; ++q) {
    const std::size_t j0 = q * kNR, nq = std::min(kNR, N - j0);
    std::uint32_t* panel = out + q * kc2 * kNR;
    for (std::size_t c0 = 0; c0 < kNR; c0 += 16) {
      const std::size_t nc = nq > c0 ? std::min<std::size_t>(16, nq - c0) : 0;
      for (std::size_t p = 0; p < kc2; p += 16) {
        const std::size_t n = std::min<std::size_t>(32, kc - 2 * p), np = std::min<std::size_t>(16, kc2 - p);
        for (std::size_t c = 0; c < 16; ++c) {
          if (c >= nc) {
            _mm512_store_si512(w + 16 * c, _mm512_setzero_si512());
            continue;
          }
          const float* x = B + (j0 + c0 + c) * ldb + k0 + 2 * p;
          const __m512 lo = _mm512_maskz_loadu_ps(lanes(n), x);
          const __m512 hi = _mm512_maskz_loadu_ps(lanes(n > 16 ? n - 16 : 0), x + 16);
          const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);  // bf16 of x[0..32) in order: the pairs
          __m512i words;
          std::memcpy(&words, &v, sizeof words);
          _mm512_store_si512(w + 16 * c, words);
        }
        if (np == 16) {
          xg::detail::transpose16_words(w, 16, panel + p * kNR + c0, kNR);
          continue;
        }
        xg::detail::transpose16_words(w, 16, t, 16);
        for (std::size_t r = 0; r < np; ++r)
          std::memcpy(panel + (p + r) * kNR + c0, t + 16 * r, 16 * sizeof(std::uint32_t));
      }
    }
  }
}

// op(A)[i0 .. i0+mc) x [k0 .. k0+kc) into groups of kMR rows, rows past mc zero. Word (ii, p) of
// a group, the pair (op(A)[ii][k0+2p], op(A)[ii][k0+2p+1]), is at ii * a_row + p * a_pair:
// ta: (a_row, a_pair) = (1, kMR), a row of A gives kMR rows' pairs side by side; otherwise
// (kc2, 1), each row of op(A) converted in place. The micro-kernel reads either.
XGRAD_BF16_TARGET void pack_a(bool ta, const float* A, std::size_t lda, std::size_t i0, std::size_t mc,
                              std::size_t k0, std::size_t kc, std::uint32_t* out) {
  const std::size_t kc2 = (kc + 1) / 2, groups = (mc + kMR - 1) / kMR;
  if (ta) {  // op(A)[i][k] = A[k lda + i]: a group's kMR rows are contiguous in each row of A
    // Two groups at a time: 16 consecutive floats of rows k and k+1 (whole cache lines rather
    // than halves read twice), words 0..7 to the first group, 8..15 to the second.
    // Pairs of rows outermost, as in pack_b: rows k and k+1 read from i0 to i0 + mc in turn.
    alignas(64) std::uint32_t w[16];
    for (std::size_t p = 0; p < kc2; ++p) {
      const float* x0 = A + (k0 + 2 * p) * lda + i0;
      const float* x1 = 2 * p + 1 < kc ? x0 + lda : nullptr;
      for (std::size_t g = 0; g < groups; g += 2) {
        const std::size_t r0 = g * kMR, n = std::min(2 * kMR, mc - r0);
        std::uint32_t* grp = out + g * kc2 * kMR;
        pairs_of_rows(x0 + r0, x1 ? x1 + r0 : nullptr, n, w);
        std::memcpy(grp + p * kMR, w, kMR * sizeof(std::uint32_t));
        if (g + 1 < groups) std::memcpy(grp + (kc2 + p) * kMR, w + kMR, kMR * sizeof(std::uint32_t));
      }
    }
    return;
  }
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t r0 = g * kMR, ng = std::min(kMR, mc - r0);
    std::uint32_t* grp = out + g * kc2 * kMR;
    for (std::size_t ii = 0; ii < kMR; ++ii) {  // op(A)[i][k] = A[i lda + k]: row i of op(A) is contiguous
      std::uint32_t* dst = grp + ii * kc2;
      if (ii >= ng) {
        std::memset(dst, 0, kc2 * sizeof(std::uint32_t));
        continue;
      }
      const float* row = A + (i0 + r0 + ii) * lda + k0;
      for (std::size_t p = 0; p < kc2; p += 16) pairs_of_row(row + 2 * p, std::min<std::size_t>(32, kc - 2 * p), dst + p);
    }
  }
}

// C[0..m) x [0..n) (m <= kMR, n <= kNR) = alpha * (packed A group) (packed B panel) + beta C on
// the first K block (`first`; beta 0 never reads C), += alpha * (...) on later blocks.
XGRAD_BF16_TARGET void micro(const std::uint32_t* ap, std::size_t a_row, std::size_t a_pair, const std::uint32_t* bp,
                             std::size_t kc2, float* C, std::size_t ldc, std::size_t m, std::size_t n, float alpha,
                             float beta, bool first) {
  // C's rows are fetched for writing while the products run: a tile of a large C is rarely in
  // cache (a fresh activation), and waiting for its lines at the stores cost as much as the
  // products on a 2048 x 1024 C with K 256.
  for (std::size_t i = 0; i < m; ++i) {
    __builtin_prefetch(C + i * ldc, 1, 3);
    if (n > 16) __builtin_prefetch(C + i * ldc + 16, 1, 3);
  }
  __m512 c0[kMR], c1[kMR];
  for (std::size_t i = 0; i < kMR; ++i) c0[i] = c1[i] = _mm512_setzero_ps();
  for (std::size_t p = 0; p < kc2; ++p) {
    __m512bh b0, b1;
    const __m512i w0 = _mm512_loadu_si512(bp), w1 = _mm512_loadu_si512(bp + 16);
    std::memcpy(&b0, &w0, 64);
    std::memcpy(&b1, &w1, 64);
    for (std::size_t i = 0; i < kMR; ++i) {
      const __m512i wa = _mm512_set1_epi32(static_cast<int>(ap[i * a_row]));
      __m512bh a;
      std::memcpy(&a, &wa, 64);
      c0[i] = _mm512_dpbf16_ps(c0[i], a, b0);
      c1[i] = _mm512_dpbf16_ps(c1[i], a, b1);
    }
    ap += a_pair;
    bp += kNR;
  }
  const __mmask16 m0 = lanes(n), m1 = lanes(n > 16 ? n - 16 : 0);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (std::size_t i = 0; i < m; ++i) {
    float* c = C + i * ldc;
    __m512 r0 = _mm512_mul_ps(c0[i], va), r1 = _mm512_mul_ps(c1[i], va);
    if (!first) {
      r0 = _mm512_add_ps(r0, _mm512_maskz_loadu_ps(m0, c));
      r1 = _mm512_add_ps(r1, _mm512_maskz_loadu_ps(m1, c + 16));
    } else if (beta != 0.0f) {
      r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, c), r0);
      r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, c + 16), r1);
    }
    _mm512_mask_storeu_ps(c, m0, r0);
    _mm512_mask_storeu_ps(c + 16, m1, r1);
  }
}

// The float32 source of a future pack of op(A): `segs` segments of `len` floats, `stride` floats
// apart (rows of A as they lie in memory).
struct Source {
  const float* p = nullptr;
  std::size_t segs = 0, stride = 0, len = 0;
};
Source a_source(bool ta, const float* A, std::size_t lda, std::size_t i0, std::size_t mc, std::size_t k0,
                std::size_t kc) {
  return ta ? Source{A + k0 * lda + i0, kc, lda, mc} : Source{A + i0 * lda + k0, mc, lda, kc};
}

// Walks a Source's cache lines, a few at a time, prefetching them into L2 while the micro-kernel
// runs on the block before, so that the next pack_a converts from L2 instead of waiting on
// memory. Only op(A): its segments are short (a row block's 96 floats of each row of A where A
// is transposed, the weight gradients' case), which the hardware prefetchers follow poorly;
// op(B)'s long rows they follow well, and prefetching those too measured slower (it crowds C's
// rows out of L2). Prefetches change no value.
class Ahead {
 public:
  Ahead() = default;
  explicit Ahead(Source s) : s_(s) {
    if (s_.segs == 0 || s_.len == 0) {
      s_ = Source{};
      return;
    }
    lines_ = s_.segs * ((s_.len * sizeof(float) + 63) / 64 + 1);  // at most a segment's lines each
    start();
  }
  std::size_t lines() const { return lines_; }
  // Prefetches the next n lines (fewer at the end); returns how many it prefetched.
  std::size_t issue(std::size_t n) {
    std::size_t done = 0;
    for (; done < n && seg_ < s_.segs; ++done) {
      _mm_prefetch(line_, _MM_HINT_T1);
      line_ += 64;
      if (line_ >= end_) {
        ++seg_;
        start();
      }
    }
    return done;
  }

 private:
  void start() {
    if (seg_ >= s_.segs) return;
    const float* a = s_.p + seg_ * s_.stride;
    line_ = reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(a) & ~std::uintptr_t(63));
    end_ = reinterpret_cast<const char*>(a + s_.len);
  }
  Source s_;
  std::size_t lines_ = 0, seg_ = 0;
  const char *line_ = nullptr, *end_ = nullptr;
};

// The calibration: `iters` rounds of 16 independent VDPBF16PS (or VFMADD231PS) chains on one
// thread, enough chains to cover either instruction's latency at full throughput. Returns the
// seconds taken; the sum of the accumulators goes to `sink` so that nothing is optimised away.
constexpr int kChains = 16;

XGRAD_BF16_TARGET double time_dot_bf16(std::size_t iters, float& sink) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi32(0x3f803f80);  // the bf16 pair (1, 1)
  __m512bh x;
  std::memcpy(&x, &ones, sizeof x);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t n = 0; n < iters; ++n)
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, x);
  const auto t1 = std::chrono::steady_clock::now();
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  sink += _mm512_reduce_add_ps(s);
  return std::chrono::duration<double>(t1 - t0).count();
}

XGRAD_BF16_TARGET double time_fma_f32(std::size_t iters, float& sink) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512 x = _mm512_set1_ps(1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t n = 0; n < iters; ++n)
    for (auto& a : acc) a = _mm512_fmadd_ps(x, x, a);
  const auto t1 = std::chrono::steady_clock::now();
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  sink += _mm512_reduce_add_ps(s);
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace
#endif

double measured_speedup() {
#if XGRAD_BF16_X86
  if (!cpu_supported()) return 0.0;
  // Three alternating rounds of about a millisecond each; the fastest round of each instruction
  // counts (a busy machine only slows a round down). VDPBF16PS does 32 multiply-adds per
  // instruction (64 flops), VFMADD231PS on zmm 16 (32 flops).
  constexpr std::size_t iters = 1 << 14;
  float sink = 0.0f;
  double best_dp = 1e30, best_fma = 1e30;
  time_dot_bf16(iters / 4, sink);  // warm-up: the vector units' clock
  time_fma_f32(iters / 4, sink);
  for (int round = 0; round < 3; ++round) {
    best_dp = std::min(best_dp, time_dot_bf16(iters, sink));
    best_fma = std::min(best_fma, time_fma_f32(iters, sink));
  }
  volatile float keep = sink;
  (void)keep;
  const double dp_rate = 64.0 * kChains * double(iters) / best_dp;
  const double fma_rate = 32.0 * kChains * double(iters) / best_fma;
  return dp_rate / fma_rate;
#else
  return 0.0;
#endif
}

namespace {
std::atomic<bool> g_prefetch_ahead{true};
std::atomic<std::uint64_t> g_ahead_lines{0};
}  // namespace
void set_prefetch_ahead(bool on) { g_prefetch_ahead.store(on, std::memory_order_relaxed); }
bool prefetch_ahead() { return g_prefetch_ahead.load(std::memory_order_relaxed); }
std::uint64_t prefetch_ahead_lines() { return g_ahead_lines.load(std::memory_order_relaxed); }

void gemm_block(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta C (beta 0: zeros, C never read)
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
#if XGRAD_BF16_X86
  if (!cpu_supported())
    throw Error(op_message("blas::gemm_bf16", "this CPU has no AVX512_BF16 instructions"));
  thread_local std::vector<std::uint32_t> bbuf, abuf;
  const std::size_t panels = (N + kNR - 1) / kNR;
  const bool ahead = ta && prefetch_ahead();  // (Ahead: only op(A)'s short segments of a transposed A)
  std::size_t ahead_lines = 0;
  for (std::size_t k0 = 0; k0 < K; k0 += kKC) {
    const std::size_t kc = std::min(kKC, K - k0), kc2 = (kc + 1) / 2;
    const std::size_t k1 = k0 + kc, kc_next = k1 < K ? std::min(kKC, K - k1) : 0;
    bbuf.resize(panels * kc2 * kNR);
    pack_b(tb, B, ldb, k0, kc, N, bbuf.data());
    for (std::size_t i0 = 0; i0 < M; i0 += kMC) {
      const std::size_t mc = std::min(kMC, M - i0), groups = (mc + kMR - 1) / kMR;
      abuf.resize(groups * kc2 * kMR);
      pack_a(ta, A, lda, i0, mc, k0, kc, abuf.data());
      // While this block's products run: op(A) of the next pack_a (the next row block, or the
      // next K block's first), spread evenly over the micro-kernel's calls.
      Ahead next = !ahead          ? Ahead()
                   : i0 + kMC < M ? Ahead(a_source(ta, A, lda, i0 + kMC, std::min(kMC, M - i0 - kMC), k0, kc))
                   : kc_next      ? Ahead(a_source(ta, A, lda, 0, std::min(kMC, M), k1, kc_next))
                                  : Ahead();
      const std::size_t per_call = (next.lines() + panels * groups - 1) / (panels * groups);
      for (std::size_t q = 0; q < panels; ++q)
        for (std::size_t g = 0; g < groups; ++g) {
          micro(abuf.data() + g * kc2 * kMR, ta ? 1 : kc2, ta ? kMR : 1, bbuf.data() + q * kc2 * kNR, kc2,
                C + (i0 + g * kMR) * ldc + q * kNR,
                ldc, std::min(kMR, mc - g * kMR), std::min(kNR, N - q * kNR), alpha, beta, k0 == 0);
          ahead_lines += next.issue(per_call);
        }
    }
  }
  if (ahead_lines) g_ahead_lines.fetch_add(ahead_lines, std::memory_order_relaxed);
#else
  (void)ta, (void)tb, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
  throw Error(op_message("blas::gemm_bf16", "bfloat16 products need an x86-64 CPU with AVX512_BF16"));
#endif
}

}  // namespace xg::blas::bf16

namespace xg {

namespace {
std::atomic<int> g_matmul_dtype{static_cast<int>(MatmulDtype::float32)};
}

std::string matmul_dtype_name(MatmulDtype d) { return d == MatmulDtype::bfloat16 ? "bfloat16" : "float32"; }

void set_matmul_dtype(MatmulDtype d) {
  if (d != MatmulDtype::float32 && d != MatmulDtype::bfloat16)
    throw ValueError(op_message("set_matmul_dtype", "unknown matmul dtype " + std::to_string(static_cast<int>(d))));
  g_matmul_dtype.store(static_cast<int>(d), std::memory_order_relaxed);
}

MatmulDtype matmul_dtype() { return static_cast<MatmulDtype>(g_matmul_dtype.load(std::memory_order_relaxed)); }

MatmulDtype effective_matmul_dtype() {
  return matmul_dtype() == MatmulDtype::bfloat16 && blas::bf16_available() ? MatmulDtype::bfloat16
                                                                           : MatmulDtype::float32;
}

std::string bfloat16_matmul_unavailable_reason() { return blas::bf16_unavailable_reason(); }

MatmulDtypeScope::MatmulDtypeScope(MatmulDtype d) : previous_(matmul_dtype()) { set_matmul_dtype(d); }
MatmulDtypeScope::~MatmulDtypeScope() { set_matmul_dtype(previous_); }

}  // namespace xg
