// Small bfloat16 products on AMX tiles (core/detail/amx_gemm.hpp).
//
// Layout. A is rounded into row-major bfloat16 rows of Kp values (Kp = K rounded up to 32, zeros
// beyond K; rows up to Mp = M rounded up to 16 are zero): a 16-row slice of it, 32 values wide,
// is one A tile. B is rounded into pairs: word (p, j) holds b(2p, j) and b(2p + 1, j), rows of Np
// words (Np = N rounded up to 16): 16 of those rows, 16 words wide, are one B tile (the layout
// TDPBF16PS reads). C tiles are 16 x 16 float32. Eight tile registers: C in 0..3 (two by two),
// A in 4 and 5, B in 6 and 7.
#include <xgrad/core/detail/amx_gemm.hpp>
#include <xgrad/core/detail/transpose16.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include <xgrad/core/detail/bf16_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/error.hpp>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define XGRAD_AMX_X86 1
// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector that
// -Wmaybe-uninitialized then reports inside the header (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#else
#define XGRAD_AMX_X86 0
#endif

namespace xg::blas::amx {

namespace {
std::atomic<std::uint64_t> g_calls{0};

#if XGRAD_AMX_X86
// The CPU and OS part of the decision, made once (cpuid traps to the hypervisor in a VM, and the
// permission is asked once per process).
std::string detect() {
  if (!bf16::cpu_supported()) return "this CPU has no AVX512_BF16 instructions";
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return "cpuid has no leaf 7";
  if (!((d >> 24) & 1u) || !((d >> 22) & 1u)) return "this CPU has no AMX-TILE and AMX-BF16";
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return "the OS has not enabled XSAVE";
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3u) != 3u) return "the OS does not save the AMX tile state (XCR0)";
  constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM (Linux 5.16)
  constexpr long kXtiledata = 18;         // XFEATURE_XTILEDATA
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) != 0)
    return std::string("the kernel refused the AMX tile state (arch_prctl: ") + std::strerror(errno) + ")";
  return "";
}
#endif

const std::string& cpu_reason() {
#if XGRAD_AMX_X86
  static const std::string r = detect();
#else
  static const std::string r = "AMX is an x86-64 Linux feature";
#endif
  return r;
}

std::size_t round_up(std::size_t x, std::size_t w) { return (x + w - 1) / w * w; }

// The CPU's reason, else the ISA ceiling's (both kinds of products need the avx512 one).
std::string under_ceiling(const std::string& cpu) {
  if (!cpu.empty()) return cpu;
  const std::string ceiling = isa_ceiling();
  if (ceiling != "avx512") return "the float32 kernels are capped at " + ceiling + " (XGRAD_ISA or set_max_isa)";
  return "";
}
}  // namespace

std::string unavailable_reason() { return under_ceiling(cpu_reason()); }

std::uint64_t calls() { return g_calls.load(std::memory_order_relaxed); }

#if XGRAD_AMX_X86
namespace {

#define XGRAD_AMX_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
// GCC's tile intrinsics are asm statements without a memory clobber: this keeps the compiler from
// moving the packing stores after a tile load, or the reads of C before a tile store.
#define XGRAD_AMX_FENCE() __asm__ __volatile__("" ::: "memory")

// Every tile 16 rows of 64 bytes (palette 1).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  std::uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

thread_local int t_session = 0;  // TileSession depth on this thread

XGRAD_AMX_TARGET void configure() {
  static const TileConfig cfg;
  XGRAD_AMX_FENCE();
  _tile_loadconfig(&cfg);
}
XGRAD_AMX_TARGET void release() {
  _tile_release();
  XGRAD_AMX_FENCE();
}

inline __mmask16 lanes(std::size_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// bfloat16 of alpha lo (the low 16 halves) and alpha hi (the high 16) as 16 words.
XGRAD_AMX_TARGET inline __m512i to_bf16(__m512 lo, __m512 hi, float alpha) {
  if (alpha != 1.0f) {
    const __m512 s = _mm512_set1_ps(alpha);
    lo = _mm512_mul_ps(lo, s);
    hi = _mm512_mul_ps(hi, s);
  }
  const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
  __m512i w;
  std::memcpy(&w, &v, sizeof w);
  return w;
}

// bfloat16 of alpha x[0..n) (zeros up to 32; n <= 32) as 16 words, in order.
XGRAD_AMX_TARGET inline __m512i round32(const float* x, std::size_t n, float alpha) {
  return to_bf16(_mm512_maskz_loadu_ps(lanes(n), x), _mm512_maskz_loadu_ps(lanes(n > 16 ? n - 16 : 0), x + 16), alpha);
}

// Words (alpha r0[j], alpha r1[j]) for j < n (n <= 16), zeros beyond; r1 null: zero high halves.
XGRAD_AMX_TARGET inline __m512i pairs(const float* r0, const float* r1, std::size_t n, float alpha) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512 b = r1 ? _mm512_maskz_loadu_ps(lanes(n), r1) : _mm512_setzero_ps();
  return _mm512_permutexvar_epi16(idx, to_bf16(_mm512_maskz_loadu_ps(lanes(n), r0), b, alpha));
}

// round_a (header); tmp holds the word transpose of a column-contiguous A.
XGRAD_AMX_TARGET void round_a_impl(std::size_t M, std::size_t K, float alpha, const float* A, std::size_t a_rs,
                                   std::size_t a_cs, std::uint32_t* out, std::size_t ldo,
                                   std::vector<std::uint32_t>& tmp) {
  const std::size_t Mp = round_up(M, 16), kw = round_up(K, 32) / 2;
  if (a_cs == 1) {  // rows of A are contiguous
    for (std::size_t i = 0; i < M; ++i)
      for (std::size_t p = 0; p < kw; p += 16) {
        const std::size_t k0 = 2 * p;
        _mm512_storeu_si512(out + i * ldo + p,
                            round32(A + i * a_rs + k0, K > k0 ? std::min<std::size_t>(32, K - k0) : 0, alpha));
      }
    for (std::size_t i = M; i < Mp; ++i) std::fill(out + i * ldo, out + i * ldo + kw, 0u);
    return;
  }
  if (a_rs == 1) {  // columns of A are contiguous: pairs down the columns, then a word transpose
    tmp.resize(kw * Mp);
    for (std::size_t p = 0; p < kw; ++p) {
      const std::size_t k0 = 2 * p;
      const float* r0 = k0 < K ? A + k0 * a_cs : nullptr;
      const float* r1 = k0 + 1 < K ? A + (k0 + 1) * a_cs : nullptr;
      for (std::size_t i = 0; i < Mp; i += 16) {
        const std::size_t n = i < M ? std::min<std::size_t>(16, M - i) : 0;
        _mm512_storeu_si512(tmp.data() + p * Mp + i,
                            r0 ? pairs(r0 + i, r1 ? r1 + i : nullptr, n, alpha) : _mm512_setzero_si512());
      }
    }
    for (std::size_t p = 0; p < kw; p += 16)
      for (std::size_t i = 0; i < Mp; i += 16)
        xg::detail::transpose16_words(tmp.data() + p * Mp + i, Mp, out + i * ldo + p, ldo);
    return;
  }
  for (std::size_t i = 0; i < Mp; ++i)  // any other strides: one value at a time
    for (std::size_t p = 0; p < kw; ++p) {
      const std::size_t k0 = 2 * p;
      const std::uint32_t lo = i < M && k0 < K ? bf16::round_bits(alpha * A[i * a_rs + k0 * a_cs]) : 0u;
      const std::uint32_t hi = i < M && k0 + 1 < K ? bf16::round_bits(alpha * A[i * a_rs + (k0 + 1) * a_cs]) : 0u;
      out[i * ldo + p] = lo | (hi << 16);
    }
}

XGRAD_AMX_TARGET void round_b_impl(std::size_t K, std::size_t N, const float* B, std::size_t ldb, std::uint32_t* out,
                                   std::size_t ldo) {
  const std::size_t Np = round_up(N, 16), kw = round_up(K, 32) / 2;
  for (std::size_t p = 0; p < kw; ++p) {
    const std::size_t k0 = 2 * p;
    std::uint32_t* row = out + p * ldo;
    if (k0 >= K) {
      std::fill(row, row + Np, 0u);
      continue;
    }
    const float* r0 = B + k0 * ldb;
    const float* r1 = k0 + 1 < K ? B + (k0 + 1) * ldb : nullptr;
    for (std::size_t j = 0; j < Np; j += 16) {
      const std::size_t n = j < N ? std::min<std::size_t>(16, N - j) : 0;
      _mm512_storeu_si512(row + j, pairs(r0 + j, r1 ? r1 + j : nullptr, n, 1.0f));
    }
  }
}

// One block of MT x NT C tiles: the sums over `steps` K steps of 16 words, added to c where
// accumulate, stored at c (rows ldc floats apart).
template <int MT, int NT>
XGRAD_AMX_TARGET void block(const std::uint32_t* a, std::size_t lda, const std::uint32_t* b, std::size_t ldb,
                            std::size_t steps, float* c, std::size_t ldc, bool accumulate) {
  const std::size_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;
  if (accumulate) {
    _tile_loadd(0, c, sc);
    if constexpr (NT == 2) _tile_loadd(1, c + 16, sc);
    if constexpr (MT == 2) _tile_loadd(2, c + 16 * ldc, sc);
    if constexpr (MT == 2 && NT == 2) _tile_loadd(3, c + 16 * ldc + 16, sc);
  } else {
    _tile_zero(0);
    if constexpr (NT == 2) _tile_zero(1);
    if constexpr (MT == 2) _tile_zero(2);
    if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  }
  for (std::size_t t = 0; t < steps; ++t) {
    const std::uint32_t* at = a + 16 * t;
    const std::uint32_t* bt = b + 16 * t * ldb;
    _tile_loadd(4, at, sa);
    _tile_loadd(6, bt, sb);
    if constexpr (NT == 2) _tile_loadd(7, bt + 16, sb);
    if constexpr (MT == 2) _tile_loadd(5, at + 16 * lda, sa);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT == 2 && NT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, sc);
  if constexpr (NT == 2) _tile_stored(1, c + 16, sc);
  if constexpr (MT == 2) _tile_stored(2, c + 16 * ldc, sc);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, c + 16 * ldc + 16, sc);
}

XGRAD_AMX_TARGET void tiles_impl(std::size_t M, std::size_t N, std::size_t kw, const std::uint32_t* A,
                                 std::size_t lda, const std::uint32_t* B, std::size_t ldb, float* C, std::size_t ldc,
                                 bool accumulate) {
  thread_local std::vector<float> c_buf;
  const std::size_t Mp = round_up(M, 16), Np = round_up(N, 16);
  const bool direct = M == Mp && N == Np;  // the tiles fit C: loaded and stored in place
  float* out = C;
  std::size_t ldo = ldc;
  if (!direct) {
    c_buf.assign(Mp * Np, 0.0f);
    out = c_buf.data();
    ldo = Np;
    if (accumulate)
      for (std::size_t i = 0; i < M; ++i) std::copy(C + i * ldc, C + i * ldc + N, out + i * Np);
  }
  if (t_session == 0) configure();  // else the session did (oneDNN's kernels load their own)
  const std::size_t steps = kw / 16;
  for (std::size_t m0 = 0; m0 < Mp; m0 += 32) {
    const bool two_m = m0 + 32 <= Mp;
    for (std::size_t n0 = 0; n0 < Np; n0 += 32) {
      const bool two_n = n0 + 32 <= Np;
      const std::uint32_t* a = A + m0 * lda;
      const std::uint32_t* b = B + n0;
      float* c = out + m0 * ldo + n0;
      if (two_m && two_n)
        block<2, 2>(a, lda, b, ldb, steps, c, ldo, accumulate);
      else if (two_m)
        block<2, 1>(a, lda, b, ldb, steps, c, ldo, accumulate);
      else if (two_n)
        block<1, 2>(a, lda, b, ldb, steps, c, ldo, accumulate);
      else
        block<1, 1>(a, lda, b, ldb, steps, c, ldo, accumulate);
    }
  }
  if (t_session == 0) release();
  XGRAD_AMX_FENCE();
  if (!direct)
    for (std::size_t i = 0; i < M; ++i) std::copy(out + i * Np, out + i * Np + N, C + i * ldc);
}

// --- The same products with VDPBF16PS (AVX512_BF16, no AMX): dot_tiles ---
// A word of A (a pair along k) is broadcast to 16 lanes and multiplied with one pair row of B
// (16 words, 16 columns of C): each lane adds a(i, 2p) b(2p, j) + a(i, 2p + 1) b(2p + 1, j) to
// its float32 sum, in order of p, so an entry's bits depend on its row of A, its column of B and
// kw only. MR rows by NV vectors of C in registers: NV 4 by 4 rows, 3 and 2 by 8, 1 by 16 (every
// MR divides 16: a block never reads A past round_up(M, 16) rows).
#define XGRAD_DP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

template <int MR, int NV>
XGRAD_DP_TARGET void dot_block(std::size_t kw, const std::uint32_t* a, std::size_t lda, const std::uint32_t* b,
                               std::size_t ldb, float* c, std::size_t ldc, std::size_t rows, __mmask16 last,
                               bool accumulate) {
  __m512 acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xffff);
      acc[r][v] = accumulate && std::size_t(r) < rows ? _mm512_maskz_loadu_ps(m, c + r * ldc + 16 * v)
                                                      : _mm512_setzero_ps();
    }
  for (std::size_t p = 0; p < kw; ++p) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) {
      const __m512i w = _mm512_loadu_si512(b + p * ldb + 16 * v);
      std::memcpy(&bv[v], &w, sizeof w);
    }
    for (int r = 0; r < MR; ++r) {
      const __m512i w = _mm512_set1_epi32(static_cast<int>(a[r * lda + p]));
      __m512bh av;
      std::memcpy(&av, &w, sizeof w);
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    if (std::size_t(r) >= rows) break;
    for (int v = 0; v < NV; ++v) {
      const __mmask16 m = v == NV - 1 ? last : __mmask16(0xffff);
      _mm512_mask_storeu_ps(c + r * ldc + 16 * v, m, acc[r][v]);
    }
  }
}

template <int MR, int NV>
XGRAD_DP_TARGET void dot_strip(std::size_t M, std::size_t kw, const std::uint32_t* A, std::size_t lda,
                               const std::uint32_t* b, std::size_t ldb, float* c, std::size_t ldc, __mmask16 last,
                               bool accumulate) {
  for (std::size_t m0 = 0; m0 < M; m0 += MR)
    dot_block<MR, NV>(kw, A + m0 * lda, lda, b, ldb, c + m0 * ldc, ldc, std::min<std::size_t>(MR, M - m0), last,
                      accumulate);
}

XGRAD_DP_TARGET void dot_tiles_impl(std::size_t M, std::size_t N, std::size_t kw, const std::uint32_t* A,
                                    std::size_t lda, const std::uint32_t* B, std::size_t ldb, float* C,
                                    std::size_t ldc, bool accumulate) {
  for (std::size_t n0 = 0; n0 < N; n0 += 64) {
    const std::size_t n = std::min<std::size_t>(64, N - n0), nv = (n + 15) / 16;
    const __mmask16 last = lanes(n - 16 * (nv - 1));
    const std::uint32_t* b = B + n0;
    float* c = C + n0;
    switch (nv) {
      case 4: dot_strip<4, 4>(M, kw, A, lda, b, ldb, c, ldc, last, accumulate); break;
      case 3: dot_strip<8, 3>(M, kw, A, lda, b, ldb, c, ldc, last, accumulate); break;
      case 2: dot_strip<8, 2>(M, kw, A, lda, b, ldb, c, ldc, last, accumulate); break;
      default: dot_strip<16, 1>(M, kw, A, lda, b, ldb, c, ldc, last, accumulate); break;
    }
  }
}

thread_local std::vector<std::uint32_t> t_tmp;  // round_a's transpose, round_b_transposed's rows

}  // namespace
#endif

namespace {
void require_cpu(const char* op) {
  // (the CPU and OS part only: callers chose these products under the ISA ceiling, see available())
  static const bool ok = cpu_reason().empty();
  if (!ok)
    throw Error(op_message(op, std::string("AMX bfloat16 tiles are unavailable: ") + cpu_reason()));
}
// The rounding and dot_tiles need AVX512_BF16 only.
const std::string& bf16_reason() {
#if XGRAD_AMX_X86
  static const std::string r = bf16::cpu_supported() ? "" : "this CPU has no AVX512_BF16 instructions";
#else
  static const std::string r = "AVX512_BF16 is an x86-64 feature";
#endif
  return r;
}
void require_bf16(const char* op) {
  static const bool ok = bf16_reason().empty();
  if (!ok) throw Error(op_message(op, std::string("bfloat16 dot products are unavailable: ") + bf16_reason()));
}
}  // namespace

std::string dot_unavailable_reason() { return under_ceiling(bf16_reason()); }

void round_a(std::size_t M, std::size_t K, float alpha, const float* A, std::size_t a_rs, std::size_t a_cs,
             std::uint32_t* out, std::size_t ldo) {
  require_bf16("amx::round_a");
#if XGRAD_AMX_X86
  round_a_impl(M, K, alpha, A, a_rs, a_cs, out, ldo, t_tmp);
#else
  (void)M, (void)K, (void)alpha, (void)A, (void)a_rs, (void)a_cs, (void)out, (void)ldo;
#endif
}

void round_b(std::size_t K, std::size_t N, const float* B, std::size_t ldb, std::uint32_t* out, std::size_t ldo) {
  require_bf16("amx::round_b");
#if XGRAD_AMX_X86
  round_b_impl(K, N, B, ldb, out, ldo);
#else
  (void)K, (void)N, (void)B, (void)ldb, (void)out, (void)ldo;
#endif
}

void round_b_transposed(std::size_t K, std::size_t N, const float* Bt, std::size_t ldt, std::uint32_t* out,
                        std::size_t ldo) {
  require_bf16("amx::round_b_transposed");
#if XGRAD_AMX_X86
  // the rows of Bt in A layout ([round_up(N, 16), kw] words), then a word transpose
  const std::size_t Np = round_up(N, 16), kw = round_up(K, 32) / 2;
  thread_local std::vector<std::uint32_t> rows, scratch;
  rows.resize(Np * kw);
  round_a_impl(N, K, 1.0f, Bt, ldt, 1, rows.data(), kw, scratch);
  for (std::size_t p = 0; p < kw; p += 16)
    for (std::size_t j = 0; j < Np; j += 16)
      xg::detail::transpose16_words(rows.data() + j * kw + p, kw, out + p * ldo + j, ldo);
#else
  (void)K, (void)N, (void)Bt, (void)ldt, (void)out, (void)ldo;
#endif
}

void tiles(std::size_t M, std::size_t N, std::size_t kw, const std::uint32_t* A, std::size_t lda,
           const std::uint32_t* B, std::size_t ldb, float* C, std::size_t ldc, bool accumulate) {
  require_cpu("amx::tiles");
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (M == 0 || N == 0) return;
  if (kw == 0) {
    if (!accumulate)
      for (std::size_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  if (kw % 16 != 0)
    throw ValueError(op_message("amx::tiles", "kw " + std::to_string(kw) + " words is not a multiple of 16"));
#if XGRAD_AMX_X86
  tiles_impl(M, N, kw, A, lda, B, ldb, C, ldc, accumulate);
#else
  (void)A, (void)lda, (void)B, (void)ldb;
#endif
}

void dot_tiles(std::size_t M, std::size_t N, std::size_t kw, const std::uint32_t* A, std::size_t lda,
               const std::uint32_t* B, std::size_t ldb, float* C, std::size_t ldc, bool accumulate) {
  require_bf16("amx::dot_tiles");
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (M == 0 || N == 0) return;
#if XGRAD_AMX_X86
  dot_tiles_impl(M, N, kw, A, lda, B, ldb, C, ldc, accumulate);
#else
  (void)kw, (void)A, (void)lda, (void)B, (void)ldb, (void)C, (void)ldc, (void)accumulate;
#endif
}

TileSession::TileSession() {
#if XGRAD_AMX_X86
  if (!cpu_reason().empty()) return;
  if (t_session++ == 0) configure();
#endif
}

TileSession::~TileSession() {
#if XGRAD_AMX_X86
  if (!cpu_reason().empty()) return;
  if (--t_session == 0) release();
#endif
}

void product(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t a_rs, std::size_t a_cs,
             const float* B, std::size_t ldb, float* C, std::size_t ldc) {
  require_cpu("amx::product");
  if (M == 0 || N == 0) {  // nothing to compute: A and B are not read (their shapes may be empty)
    g_calls.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const std::size_t Mp = round_up(M, 16), Np = round_up(N, 16), kw = round_up(K, 32) / 2;
  thread_local std::vector<std::uint32_t> a_buf, b_buf;
  a_buf.resize(Mp * kw);
  b_buf.resize(kw * Np);
  round_a(M, K, 1.0f, A, a_rs, a_cs, a_buf.data(), kw);
  round_b(K, N, B, ldb, b_buf.data(), Np);
  tiles(M, N, kw, a_buf.data(), kw, b_buf.data(), Np, C, ldc, false);
}

}  // namespace xg::blas::amx
