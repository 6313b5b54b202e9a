// bfloat16 products on oneDNN's matmul primitive (core/detail/bf16_gemm.hpp): the inputs are
// rounded here, as xgrad's own kernel rounds them, into dense bfloat16 copies, and oneDNN
// multiplies them with float32 accumulation on the best kernel it has for this CPU: AMX tiles
// (TDPBF16PS) where the CPU has them and the OS grants them, else AVX512_BF16 dot products.
// Everything runs on xgrad's pool: oneDNN's OpenMP count is 1 on every thread that calls it.
#include <xgrad/core/detail/bf16_gemm.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/calibrate.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/parallel.hpp>

#ifndef XGRAD_HAVE_ONEDNN
#define XGRAD_HAVE_ONEDNN 0
#endif
#if XGRAD_HAVE_ONEDNN && defined(__x86_64__)
#define XGRAD_BF16_ONEDNN 1
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.hpp>
extern "C" void omp_set_num_threads(int);  // libgomp's, as in core/blas.cpp
#else
#define XGRAD_BF16_ONEDNN 0
#endif

namespace xg::blas::bf16 {

#if XGRAD_BF16_ONEDNN
namespace {

#define XGRAD_BF16_CVT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

inline __mmask16 lanes16(std::size_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1u); }

// dst[0..n) = x[0..n) rounded to bfloat16 (VCVTNE2PS2BF16: to nearest even, the bits of round_bits).
XGRAD_BF16_CVT_TARGET void round_row(const float* x, std::size_t n, std::uint16_t* dst) {
  std::size_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16), _mm512_loadu_ps(x + j));
    __m512i w;
    std::memcpy(&w, &v, sizeof w);
    _mm512_storeu_si512(dst + j, w);
  }
  if (j < n) {
    const std::size_t r = n - j;
    const __m512 lo = _mm512_maskz_loadu_ps(lanes16(r), x + j);
    const __m512 hi = _mm512_maskz_loadu_ps(lanes16(r > 16 ? r - 16 : 0), x + j + 16);
    const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
    __m512i w;
    std::memcpy(&w, &v, sizeof w);
    _mm512_mask_storeu_epi16(dst + j, r >= 32 ? ~__mmask32(0) : (__mmask32(1) << r) - 1u, w);
  }
}

// rows x cols of x (row stride ld) into dense dst (row stride cols).
void round_rows(const float* x, std::size_t ld, std::size_t rows, std::size_t cols, std::uint16_t* dst) {
  for (std::size_t r = 0; r < rows; ++r) round_row(x + r * ld, cols, dst + r * cols);
}

const dnnl::engine& cpu_engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

void omp_single() {
  thread_local bool done = false;
  if (!done) {
    omp_set_num_threads(1);
    done = true;
  }
}

// One primitive per shape, layout, alpha and beta, on each thread that runs it.
using Key = std::tuple<std::size_t, std::size_t, std::size_t, bool, bool, float, float>;
struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc src, wei, dst;
  std::size_t scratch = 0;
  std::string impl;
};
constexpr std::size_t kMaxEntries = 128;

// C [m, N] (dense) = alpha op(A) op(B) + beta C, op(A) dense [m, K] (ta: stored [K, m]), op(B)
// dense [K, N] (tb: stored [N, K]).
const Entry& entry(std::size_t m, std::size_t N, std::size_t K, bool ta, bool tb, float alpha, float beta) {
  thread_local std::map<Key, Entry> cache;
  const Key key{m, N, K, ta, tb, alpha, beta};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kMaxEntries) cache.clear();
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  const auto d = [](std::size_t v) { return static_cast<dnnl::memory::dim>(v); };
  Entry e;
  e.src = ta ? md({d(m), d(K)}, dt::bf16, {1, d(m)}) : md({d(m), d(K)}, dt::bf16, {d(K), 1});
  e.wei = tb ? md({d(K), d(N)}, dt::bf16, {1, d(K)}) : md({d(K), d(N)}, dt::bf16, {d(N), 1});
  e.dst = md({d(m), d(N)}, dt::f32, {d(N), 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.src, e.wei, e.dst), attr, cpu_engine());
  e.scratch = pd.scratchpad_desc().get_size();
  e.impl = pd.impl_info_str();
  e.prim = dnnl::matmul(pd);
  return cache.emplace(key, std::move(e)).first->second;
}

std::string& last_impl_slot() {
  thread_local std::string s;
  return s;
}

// One block of rows of C, single-threaded: op(A)'s rows lo..lo+m rounded into a dense copy, the
// product with the already rounded op(B). C's rows are dense (ldc == N) or go through a dense
// copy (oneDNN's AMX kernels want dense operands: a padded layout falls back to slower ones).
void rows_block(bool ta, bool tb, std::size_t lo, std::size_t m, std::size_t N, std::size_t K, float alpha,
                const float* A, std::size_t lda, const std::uint16_t* Bb, float beta, float* C, std::size_t ldc) {
  omp_single();
  thread_local std::vector<std::uint16_t> abuf;
  thread_local std::vector<char> scratch;
  thread_local std::vector<float> cbuf;
  abuf.resize(m * K);
  if (ta)  // op(A)[i][k] = A[k lda + lo + i]: K rows of m, stored [K, m]
    round_rows(A + lo, lda, K, m, abuf.data());
  else
    round_rows(A + lo * lda, lda, m, K, abuf.data());
  const bool dense = ldc == N;
  const Entry& e = entry(m, N, K, ta, tb, alpha, dense ? beta : 0.0f);
  if (scratch.size() < e.scratch) scratch.resize(e.scratch);
  float* out = C + lo * ldc;
  if (!dense) {
    cbuf.resize(m * N);
    out = cbuf.data();
  }
  const dnnl::engine& eng = cpu_engine();
  thread_local dnnl::stream strm(cpu_engine());
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, dnnl::memory(e.src, eng, abuf.data())},
                                             {DNNL_ARG_WEIGHTS, dnnl::memory(e.wei, eng, const_cast<std::uint16_t*>(Bb))},
                                             {DNNL_ARG_DST, dnnl::memory(e.dst, eng, out)}};
  if (e.scratch > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory(dnnl::memory::desc({static_cast<dnnl::memory::dim>(e.scratch)}, dnnl::memory::data_type::u8,
                                                 dnnl::memory::format_tag::a),
                              eng, scratch.data()));
  e.prim.execute(strm, args);
  strm.wait();
  last_impl_slot() = e.impl;
  if (!dense)
    for (std::size_t i = 0; i < m; ++i) {
      float* c = C + (lo + i) * ldc;
      const float* t = cbuf.data() + i * N;
      if (beta == 0.0f)
        std::memcpy(c, t, N * sizeof(float));
      else
        for (std::size_t j = 0; j < N; ++j) c[j] = t[j] + beta * c[j];
    }
}

constexpr std::size_t kAlign = 16;  // rows per block of the split, as core/blas.cpp's
constexpr double kSplit = 1 << 20;  // flops from which a product is split over the pool

void product(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
             std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc, bool split) {
  // op(B) rounded once, dense in its stored layout ([K, N], or [N, K] when transposed).
  thread_local std::vector<std::uint16_t> bbuf;
  bbuf.resize(K * N);
  const std::size_t b_rows = tb ? N : K, b_cols = tb ? K : N;
  const double flops = 2.0 * double(M) * double(N) * double(K);
  const std::size_t threads = split && flops >= kSplit ? static_cast<std::size_t>(detail::pool_threads()) : 1;
  std::uint16_t* bb = bbuf.data();
  const std::size_t bchunks = std::min(threads, b_rows);
  if (bchunks <= 1)
    round_rows(B, ldb, b_rows, b_cols, bb);
  else
    detail::run_chunks(bchunks, [&](std::size_t c) {
      const std::size_t r0 = b_rows * c / bchunks, r1 = b_rows * (c + 1) / bchunks;
      round_rows(B + r0 * ldb, ldb, r1 - r0, b_cols, bb + r0 * b_cols);
    });
  // Row blocks of C (oneDNN wants dense blocks: columns would not be).
  const std::size_t blocks = (M + kAlign - 1) / kAlign;
  const std::size_t chunks = std::min(threads, blocks);
  if (chunks <= 1) {
    rows_block(ta, tb, 0, M, N, K, alpha, A, lda, bb, beta, C, ldc);
    return;
  }
  detail::run_chunks(chunks, [&](std::size_t c) {
    const std::size_t lo = blocks * c / chunks * kAlign, hi = std::min(M, blocks * (c + 1) / chunks * kAlign);
    if (lo < hi) rows_block(ta, tb, lo, hi - lo, N, K, alpha, A, lda, bb, beta, C, ldc);
  });
}

std::string dnnl_message(const dnnl::error& e) {
  return std::string("oneDNN refused a bfloat16 matmul: ") + e.what();
}

}  // namespace

// oneDNN has no bfloat16 matmul under an AVX2 ceiling (dnnl_set_max_cpu_isa, core/blas.cpp).
bool onednn_supported() { return cpu_supported() && isa_ceiling() == "avx512"; }

std::string onednn_unavailable_reason() {
  if (!cpu_supported()) return "this CPU has no AVX512_BF16 instructions";
  const std::string ceiling = isa_ceiling();
  if (ceiling != "avx512") return "the kernels are capped at " + ceiling + " (XGRAD_ISA or set_max_isa)";
  return std::string();
}

void onednn_gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                 std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  if (!onednn_supported())
    throw Error(
        op_message("blas::gemm_bf16", "oneDNN's bfloat16 products are unavailable: " + onednn_unavailable_reason()));
  if (M == 0 || N == 0) return;
  if (K == 0) {
    gemm_block(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);  // C = beta C
    return;
  }
  try {
    product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, true);
  } catch (const dnnl::error& e) {
    throw Error(op_message("blas::gemm_bf16", dnnl_message(e)));
  }
}

std::string onednn_last_impl() { return last_impl_slot(); }

std::string onednn_impl() {
  if (!onednn_supported()) return std::string();
  static const std::string impl = [] {
    try {
      return entry(512, 768, 256, false, false, 1.0f, 0.0f).impl;
    } catch (const dnnl::error& e) {
      return std::string("none (") + dnnl_message(e) + ")";
    }
  }();
  return impl;
}

double onednn_measured_speedup() {
  if (!onednn_supported()) return 0.0;
  // One thread, a product of the size of a small model's layers (M 256, N 512, K 256: 67
  // MFLOP, a third of a millisecond in float32 at 200 GFLOP/s), rounding included; three
  // alternating rounds after a warm-up, the fastest of each.
  constexpr std::size_t M = 256, N = 512, K = 256;
  std::vector<float> A(M * K), B(K * N), C(M * N);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = float(int(i * 7919 % 255) - 127) / 128.0f;
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = float(int(i * 104729 % 251) - 125) / 128.0f;
  const auto f32 = [&] {
    omp_single();
    dnnl_sgemm('N', 'N', M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  };
  const auto b16 = [&] { product(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N, false); };
  try {
    return detail::measured_speedup(f32, b16, 1);
  } catch (const dnnl::error&) {
    return 0.0;
  }
}

#else  // built without oneDNN (or not x86-64)

bool onednn_supported() { return false; }

std::string onednn_unavailable_reason() {
  return XGRAD_HAVE_ONEDNN ? "this CPU has no AVX512_BF16 instructions"  // oneDNN, but not x86-64
                           : "xgrad was built without oneDNN (XGRAD_WITH_ONEDNN)";
}

void onednn_gemm(bool, bool, std::size_t, std::size_t, std::size_t, float, const float*, std::size_t, const float*,
                 std::size_t, float, float*, std::size_t) {
  throw Error(
      op_message("blas::gemm_bf16", "oneDNN's bfloat16 products are unavailable: " + onednn_unavailable_reason()));
}

std::string onednn_last_impl() { return std::string(); }
std::string onednn_impl() { return std::string(); }
double onednn_measured_speedup() { return 0.0; }

#endif

}  // namespace xg::blas::bf16
