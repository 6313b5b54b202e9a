#include <xgrad/core/detail/blas.hpp>

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <xgrad/core/detail/aligned_vector.hpp>
#include <xgrad/core/detail/bf16_gemm.hpp>
#include <xgrad/core/detail/calibrate.hpp>
#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/core/detail/dgemm.hpp>
#include <xgrad/core/detail/sgemv.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/detail/profile.hpp>

#ifndef XGRAD_HAVE_ONEDNN
#define XGRAD_HAVE_ONEDNN 0
#endif
#if XGRAD_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
// libgomp's (Debian's oneDNN runs on OpenMP). Declared here rather than through <omp.h>, which
// clang finds only with its own OpenMP headers; the symbol is the one libdnnl itself uses.
extern "C" void omp_set_num_threads(int);
#endif

// OpenBLAS's pthreads build: stops its worker threads (they start again when OpenBLAS is next
// asked to run on more than one thread). Weak: other builds of OpenBLAS lack it.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace xg::blas {

namespace {

// A measured ratio as the kernel choices' reasons print it ("1.15x").
std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

// OpenBLAS starts its worker threads when the library loads, and each spins (sched_yield in a
// loop) for about 2^28 cycles, a tenth of a second, before it first sleeps. xgrad runs OpenBLAS
// on one thread (single_threaded below), so those workers never get work: at startup they only
// compete for the cores with the program's first tenth of a second (every short program, every
// test, a benchmark like bench_op_overhead whose whole run fits in it; on 2 shared cores that was
// a tenth of its time). Stopped here, once, as the program starts; a later OpenBLAS call with more
// threads (bench_matmul's raw cblas_sgemm comparison) starts them again.
struct StopIdleOpenblasWorkers {
  StopIdleOpenblasWorkers() {
    if (blas_thread_shutdown_) blas_thread_shutdown_();
  }
};
const StopIdleOpenblasWorkers g_stop_idle_openblas_workers;
CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }
blasint bi(std::size_t v) { return static_cast<blasint>(v); }
// OpenBLAS runs single-threaded: parallelism comes from xgrad's one pool (core/parallel.hpp),
// which splits large GEMMs itself. Two pools on the same cores spin against each other.
void single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void raw(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
         std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}
void raw(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha, const double* A,
         std::size_t lda, const double* B, std::size_t ldb, double beta, double* C, std::size_t ldc) {
  cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), bi(M), bi(N), bi(K), alpha, A, bi(lda), B, bi(ldb),
              beta, C, bi(ldc));
}

// Products below this many flops run as one call (splitting costs more than it saves).
constexpr double kSplitFlops = 1 << 20;

void raw_gemv(bool trans, std::size_t M, std::size_t N, float alpha, const float* A, std::size_t lda, const float* x,
              std::size_t incx, float beta, float* y, std::size_t incy) {
  cblas_sgemv(CblasRowMajor, tr(trans), bi(M), bi(N), alpha, A, bi(lda), x, bi(incx), beta, y, bi(incy));
}
void raw_gemv(bool trans, std::size_t M, std::size_t N, double alpha, const double* A, std::size_t lda,
              const double* x, std::size_t incx, double beta, double* y, std::size_t incy) {
  cblas_dgemv(CblasRowMajor, tr(trans), bi(M), bi(N), alpha, A, bi(lda), x, bi(incx), beta, y, bi(incy));
}

// y (n entries, stride incy) = alpha * op(A) x + beta * y for A row-major [rows, cols] (op(A) is
// [n, k]), split into blocks of y across the pool when large. A GEMM with one row or one column
// of C is this matrix-vector product (batch-1 decoding: one token's row times each weight):
// OpenBLAS's sgemm would pack the whole matrix on every call, sgemv streams it once. Each
// entry of y is computed by the same kernel call for a given thread count (bit-identical run
// to run). beta 0 never reads y (it is zeroed first: C may hold anything).
constexpr std::size_t kAlignGemv = 64;
// Splitting from the GEMM's threshold (1M flops, a 2 MiB float32 matrix): splitting the
// smaller per-layer products of a stories15M decoding step too (from 64K flops) was not faster
// on 2 cores in alternating runs (each split is a hand-off to a worker, about 30 per token).
constexpr double kSplitGemvFlops = kSplitFlops;

template <class T>
void split_gemv(bool trans, std::size_t rows, std::size_t cols, T alpha, const T* A, std::size_t lda, const T* x,
                std::size_t incx, T beta, T* y, std::size_t incy) {
  const std::size_t n = trans ? cols : rows, k = trans ? rows : cols;
  if (beta == T(0))
    for (std::size_t i = 0; i < n; ++i) y[i * incy] = T(0);
  const double flops = 2.0 * double(n) * double(k);
  const std::size_t threads = flops < kSplitGemvFlops ? 1 : static_cast<std::size_t>(detail::pool_threads());
  const std::size_t blocks = (n + kAlignGemv - 1) / kAlignGemv;
  const std::size_t chunks = std::min(threads, blocks);
  if (chunks <= 1) {
    raw_gemv(trans, rows, cols, alpha, A, lda, x, incx, beta, y, incy);
    return;
  }
  detail::run_chunks(chunks, [&](std::size_t c) {
    const std::size_t lo = blocks * c / chunks * kAlignGemv, hi = std::min(n, blocks * (c + 1) / chunks * kAlignGemv);
    if (lo >= hi) return;
    if (trans)  // entries lo..hi of y: columns lo..hi of A
      raw_gemv(true, rows, hi - lo, alpha, A + lo, lda, x, incx, beta, y + lo * incy, incy);
    else  // rows lo..hi of A
      raw_gemv(false, hi - lo, cols, alpha, A + lo * lda, lda, x, incx, beta, y + lo * incy, incy);
  });
}

// Splits C into row blocks (or column blocks when C is wide and short) across the pool, each
// one single-threaded GEMM. Each block of C is computed by exactly the same BLAS call for a
// given thread count: bit-identical run to run. Small products and calls from inside a pool
// chunk (the fused attention blocks) run as one call.
constexpr std::size_t kAlignRows = 16;

std::atomic<std::uint64_t> g_calls[2];
std::atomic<std::uint64_t> g_bf16_calls{0};
void count(Backend b) { g_calls[static_cast<int>(b)].fetch_add(1, std::memory_order_relaxed); }

#if XGRAD_HAVE_ONEDNN
// oneDNN runs single-threaded too: its OpenMP thread count is set to 1 on each thread that calls
// it (an OpenMP setting is per calling thread), so no OpenMP team ever spins beside the pool.
void raw_onednn(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  thread_local bool omp_single = false;
  if (!omp_single) {
    omp_set_num_threads(1);
    omp_single = true;
  }
  const auto d = [](std::size_t v) { return static_cast<dnnl_dim_t>(v); };
  if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', d(M), d(N), d(K), alpha, A, d(lda), B, d(ldb), beta, C, d(ldc)) ==
      dnnl_success) {
    count(Backend::onednn);
    return;
  }
  // Arguments oneDNN refuses (a leading dimension below its minimum for an empty or one-row
  // operand, which BLAS accepts): OpenBLAS computes the same product.
  count(Backend::openblas);
  raw(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif

struct OpenBlasKernel {
  template <class T>
  void operator()(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha, const T* A,
                  std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) const {
    if (std::is_same<T, float>::value) count(Backend::openblas);
    raw(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
};

template <class T, class Kernel>
void split_blocks(const Kernel& kernel, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha,
                  const T* A, std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc);

// A float32 product whose C is small beside its reduction (K at least kSplitKRatio times both M
// and N: the weight gradient A^T B of a small layer over a batch of rows) splits K instead of C:
// blocks of a 64 x 256 C would give each thread a sliver of C that still streams all of K.
// Chunk c multiplies its range of K, chunk 0 into C (with beta), the others into partial
// buffers added to C in chunk order afterwards: bit-identical run to run for a thread count;
// like every split reduction, the last bits change with the count (docs/performance.md).
// float64 and bfloat16 products keep C's row or column blocks (bits independent of the count;
// bfloat16 weight gradients split K in two fixed halves instead, bf16_k_halves, as independent).
constexpr std::size_t kSplitKRatio = 4;
std::atomic<std::uint64_t> g_k_split_calls{0};

template <class T, class Kernel>
void split_k(const Kernel& kernel, std::size_t chunks, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K,
             T alpha, const T* A, std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  g_k_split_calls.fetch_add(1, std::memory_order_relaxed);
  thread_local detail::AlignedVector<T> part_buf;  // reused: a fresh block per call would fault its pages every step
  part_buf.resize((chunks - 1) * M * N);
  T* part = part_buf.data();
  detail::run_chunks(chunks, [&](std::size_t c) {
    const std::size_t k0 = K * c / chunks, k1 = K * (c + 1) / chunks;
    const T* Ak = ta ? A + k0 * lda : A + k0;  // op(A)'s columns k0..k1
    const T* Bk = tb ? B + k0 : B + k0 * ldb;  // op(B)'s rows k0..k1
    if (c == 0)
      kernel(ta, tb, M, N, k1 - k0, alpha, Ak, lda, Bk, ldb, beta, C, ldc);
    else
      kernel(ta, tb, M, N, k1 - k0, alpha, Ak, lda, Bk, ldb, T(0), part + (c - 1) * M * N, N);
  });
  for (std::size_t c = 1; c < chunks; ++c)
    for (std::size_t i = 0; i < M; ++i) {
      const T* p = part + ((c - 1) * M + i) * N;
      T* row = C + i * ldc;
      for (std::size_t j = 0; j < N; ++j) row[j] += p[j];
    }
}

// A float32 weight gradient op(A) = A^T whose C has at least kTallRatio times as many rows as
// columns, over a long reduction (K at least 2 M): oneDNN's AVX-512 sgemm runs it 1.1-1.6x
// slower than the same product with the operands swapped, whose C is wide (measured on Intel
// Xeon model 207 at 1 and 2 threads, C [1024, 256] with K 2048: nn::Linear's weight gradient
// x^T dY of a layer that narrows, fc2's; bench/NOTES.md's library table shows the same on AMD
// Zen 5). Its AVX2 sgemm runs both forms alike (model 207 under XGRAD_ISA=avx2), so there the
// product stays as it is. So oneDNN computes C^T = B^T A into a buffer (the doorway's blocks,
// as any product) and the pool writes its transpose into C: C = C^T^T + beta C (beta 0 reads
// nothing of C). Bits: those of the swapped product, the same run to run.
constexpr std::size_t kTallRatio = 2;
std::atomic<std::uint64_t> g_transposed_calls{0};
std::atomic<bool> g_onednn_avx512{false};  // set by setup(): oneDNN runs its AVX-512 kernels

template <class Kernel>
void transposed_product(const Kernel& kernel, std::size_t M, std::size_t N, std::size_t K, float alpha,
                        const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
                        std::size_t ldc) {
  g_transposed_calls.fetch_add(1, std::memory_order_relaxed);
  thread_local detail::AlignedVector<float> ct_buf;  // reused: a fresh block per call would fault its pages every step
  ct_buf.resize(N * M);
  float* Ct = ct_buf.data();
  // C^T [N, M] = alpha B^T A: B is [K, N] (op = transpose), A [K, M] (as it is).
  split_blocks<float>(kernel, true, false, N, M, K, alpha, B, ldb, A, lda, 0.0f, Ct, M);
  constexpr std::size_t kB = 16;
  detail::parallel_for((M + kB - 1) / kB, 4, [&](std::size_t b0, std::size_t b1, std::size_t) {
    for (std::size_t i0 = b0 * kB; i0 < std::min(M, b1 * kB); i0 += kB) {
      const std::size_t i1 = std::min(M, i0 + kB);
      for (std::size_t j0 = 0; j0 < N; j0 += kB) {
        const std::size_t j1 = std::min(N, j0 + kB);
        for (std::size_t i = i0; i < i1; ++i) {
          float* row = C + i * ldc;
          if (beta == 0.0f)
            for (std::size_t j = j0; j < j1; ++j) row[j] = Ct[j * M + i];
          else if (beta == 1.0f)
            for (std::size_t j = j0; j < j1; ++j) row[j] = Ct[j * M + i] + row[j];
          else
            for (std::size_t j = j0; j < j1; ++j) row[j] = Ct[j * M + i] + beta * row[j];
        }
      }
    }
  });
}

// `kernel` computes each block (OpenBlasKernel, or raw_onednn for float32).
template <class T, class Kernel>
void split_gemm(const Kernel& kernel, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha,
                const T* A, std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  single_threaded();
  if (std::is_same<T, float>::value && ((M == 1 && N > 1 && K > 0) || (N == 1 && M > 1 && K > 0)))
    count(Backend::openblas);  // matrix-vector products: OpenBLAS's sgemv
  if (M == 1 && N > 1 && K > 0) {  // C [1, N] = row x of op(A) times op(B) [K, N]
    const std::size_t incx = ta ? lda : 1;
    if (tb)  // B is [N, K]: C^T = B x
      split_gemv(false, N, K, alpha, B, ldb, A, incx, beta, C, 1);
    else  // B is [K, N]: C^T = B^T x
      split_gemv(true, K, N, alpha, B, ldb, A, incx, beta, C, 1);
    return;
  }
  if (N == 1 && M > 1 && K > 0) {  // C [M, 1] = op(A) [M, K] times the column op(B)
    const std::size_t incx = tb ? 1 : ldb;
    if (ta)  // A is [K, M]
      split_gemv(true, K, M, alpha, A, lda, B, incx, beta, C, ldc);
    else
      split_gemv(false, M, K, alpha, A, lda, B, incx, beta, C, ldc);
    return;
  }
  if constexpr (std::is_same<T, float>::value) {
    const double flops = 2.0 * double(M) * double(N) * double(K);
    const std::size_t threads = flops < kSplitFlops ? 1 : static_cast<std::size_t>(detail::pool_threads());
    const std::size_t k_chunks = std::min(threads, K / kAlignRows);
    if (k_chunks > 1 && K >= kSplitKRatio * std::max(M, N)) {
      split_k(kernel, k_chunks, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
    if (!std::is_same<Kernel, OpenBlasKernel>::value && g_onednn_avx512.load(std::memory_order_relaxed) && ta &&
        !tb && M >= kTallRatio * N && K >= 2 * M && flops >= kSplitFlops) {
      transposed_product(kernel, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
      return;
    }
  }
  split_blocks(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// The blocks of split_gemm (every product, matrix-vector ones included, through `kernel`).
template <class T, class Kernel>
void split_blocks(const Kernel& kernel, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, T alpha,
                  const T* A, std::size_t lda, const T* B, std::size_t ldb, T beta, T* C, std::size_t ldc) {
  const double flops = 2.0 * double(M) * double(N) * double(K);
  const std::size_t threads = flops < kSplitFlops ? 1 : static_cast<std::size_t>(detail::pool_threads());
  const bool by_rows = M >= N;
  const std::size_t extent = by_rows ? M : N;
  const std::size_t blocks = (extent + kAlignRows - 1) / kAlignRows;
  const std::size_t chunks = std::min(threads, blocks);
  if (chunks <= 1) {
    kernel(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  detail::run_chunks(chunks, [&](std::size_t c) {
    const std::size_t b0 = blocks * c / chunks, b1 = blocks * (c + 1) / chunks;
    const std::size_t lo = b0 * kAlignRows, hi = std::min(extent, b1 * kAlignRows);
    if (lo >= hi) return;
    if (by_rows)  // rows lo..hi of C = rows of op(A)
      kernel(ta, tb, hi - lo, N, K, alpha, ta ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    else  // columns lo..hi of C = columns of op(B)
      kernel(ta, tb, M, hi - lo, K, alpha, A, lda, tb ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
  });
}

// --- which float32 kernels: chosen once, at the first float32 GEMM ---

std::mutex g_setup_mutex;
std::atomic<bool> g_ready{false};
std::string g_requested;  // set_max_isa's ceiling ("" = none)
std::string g_ceiling;    // the ceiling in effect once ready (the request, at most the CPU's)
Backend g_backend = Backend::openblas;
std::string g_isa = "openblas";

void check_isa_name(const std::string& isa, const std::string& where) {
  if (isa != "avx2" && isa != "avx512")
    throw ValueError(op_message(where, "unknown ISA '" + isa + "' (avx2 or avx512)"));
}

// The ceiling `requested` resolves to on this CPU (a ceiling above the CPU's widest is the CPU's).
std::string resolve_ceiling(const std::string& requested) {
  const std::string cpu = cpu_isa();
  if (requested.empty() || cpu == "none" || (requested == "avx512" && cpu != "avx512")) return cpu;
  return requested;
}

void setup() {
  if (g_ready.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lk(g_setup_mutex);
  if (g_ready.load(std::memory_order_relaxed)) return;
  std::string requested = g_requested;
  if (requested.empty()) {
    const char* env = std::getenv("XGRAD_ISA");
    if (env && *env) {
      requested = env;
      check_isa_name(requested, "XGRAD_ISA");
    }
  }
  g_ceiling = resolve_ceiling(requested);
#if XGRAD_HAVE_ONEDNN
  if (g_ceiling != "none") {
    // Fails only if the process's oneDNN already ran (another user of it): its ISA is then
    // whatever it chose, read back below.
    dnnl_set_max_cpu_isa(g_ceiling == "avx2" ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_all);
    const unsigned eff = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    const auto has = [eff](dnnl_cpu_isa_t isa) { return (eff & unsigned(isa)) == unsigned(isa); };
    if (has(dnnl_cpu_isa_avx512_core)) {
      g_backend = Backend::onednn;
      g_isa = "avx512";
      g_onednn_avx512.store(true, std::memory_order_relaxed);
    } else if (has(dnnl_cpu_isa_avx2)) {
      g_backend = Backend::onednn;
      g_isa = "avx2";
    }
  }
#endif
  g_ready.store(true, std::memory_order_release);
}

// bench_train_step --profile (core/detail/profile.hpp): the time of the calls made outside the pool.
struct ProfileTimer {
  bool on = detail::profiling() && !detail::in_parallel_region();
  std::chrono::steady_clock::time_point t0 = on ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  ProfileTimer() = default;
  ProfileTimer(const ProfileTimer&) = delete;
  ProfileTimer& operator=(const ProfileTimer&) = delete;
  ~ProfileTimer() {
    if (on)
      detail::add_gemm_time(static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count()));
  }
};

template <class F>
void on_backend(Backend b, F&& f) {
  if (b == Backend::onednn) {
#if XGRAD_HAVE_ONEDNN
    setup();
    f(raw_onednn);
    return;
#else
    throw Error(op_message("blas::sgemm_on", "xgrad was built without oneDNN (XGRAD_WITH_ONEDNN)"));
#endif
  }
  f(OpenBlasKernel{});
}

}  // namespace

namespace {
// A matrix-vector product: one row or one column of C (not both), something to sum.
bool is_gemv(std::size_t M, std::size_t N, std::size_t K) { return K > 0 && ((M == 1 && N > 1) || (N == 1 && M > 1)); }
}  // namespace

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
          const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
          std::size_t ldc) {
  const ProfileTimer timer;
  if (is_gemv(M, N, K)) {
    sgemv_on(sgemv_kernel(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  sgemm_on(sgemm_backend(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void sgemm_on(Backend b, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
              std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  if (M == 0 || N == 0 || K == 0) b = Backend::openblas;  // nothing to multiply: C = beta C as BLAS does it
  on_backend(b, [&](const auto& kernel) { split_gemm(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); });
}

Backend sgemm_backend() {
  setup();
  return g_backend;
}

const char* backend_name(Backend b) { return b == Backend::onednn ? "oneDNN" : "OpenBLAS"; }

bool onednn_available() { return XGRAD_HAVE_ONEDNN != 0; }

std::string sgemm_isa() {
  setup();
  return g_isa;
}

std::string cpu_isa() {
#if defined(__x86_64__)
  // oneDNN's AVX-512 kernels (avx512_core) need the F, BW, VL and DQ subsets.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "avx512";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#endif
  return "none";
}

void set_max_isa(const std::string& isa) {
  check_isa_name(isa, "set_max_isa");
  std::lock_guard<std::mutex> lk(g_setup_mutex);
  if (!g_ready.load(std::memory_order_relaxed)) {
    g_requested = isa;
    return;
  }
  if (resolve_ceiling(isa) != g_ceiling && g_backend == Backend::onednn)
    throw Error(op_message("set_max_isa", "the float32 GEMM kernels are already fixed at " + g_ceiling +
                                              " (oneDNN fixes its ISA at the first float32 GEMM); call set_max_isa('" +
                                              isa + "') before the first matmul"));
  g_requested = isa;
}

std::string isa_ceiling() {
  if (g_ready.load(std::memory_order_acquire)) return g_ceiling;
  std::lock_guard<std::mutex> lk(g_setup_mutex);
  if (!g_requested.empty()) return resolve_ceiling(g_requested);
  const char* env = std::getenv("XGRAD_ISA");
  if (env && *env) {
    check_isa_name(env, "XGRAD_ISA");
    return resolve_ceiling(env);
  }
  return resolve_ceiling("");
}

std::uint64_t sgemm_calls(Backend b) { return g_calls[static_cast<int>(b)].load(std::memory_order_relaxed); }
std::uint64_t k_split_calls() { return g_k_split_calls.load(std::memory_order_relaxed); }
std::uint64_t transposed_calls() { return g_transposed_calls.load(std::memory_order_relaxed); }

void gemm(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha,
          const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta,
          double* C, std::size_t ldc) {
  const ProfileTimer timer;
  dgemm_on(dgemm_kernel(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// --- which float64 kernel: chosen once, at the first float64 GEMM (core/detail/blas.hpp) ---

namespace {

std::atomic<std::uint64_t> g_f64_calls[3];

struct F64Choice {
  F64Kernel kernel = F64Kernel::openblas;
  std::string reason;
  double speedup = 0.0;  // the measured ratio where the choice took one (f64_calibrated_speedup)
};

// OpenBLAS's cores (openblas_get_corename, DYNAMIC_ARCH) whose dgemm kernels use AVX2 + FMA or
// AVX-512. On any other core -- Prescott (SSE3), its fallback for a CPU model it does not know,
// Nehalem, Sandybridge (AVX without FMA)... -- OpenBLAS's dgemm runs well below what the CPU can.
// So does an AVX2 core on an AVX-512 CPU: AMD Zen 5 under OPENBLAS_CORETYPE=Haswell, 45% of the
// float64 peak against xgrad's AVX-512 kernel's 85% (bench_matmul --dtype float64 --n 1024).
std::string lowercase(const std::string& s) {
  std::string c;
  for (char ch : s) c += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return c;
}

bool openblas_core_is_vector(const std::string& core) {
  const std::string c = lowercase(core);
  for (const char* v : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"})
    if (c == v) return true;
  return false;
}

// The cores of the matrix-vector rule that keep OpenBLAS's sgemv: its AVX2 ones (AMD Zen 5 runs
// OPENBLAS_CORETYPE=Haswell, measured there with OpenBLAS). On its AVX-512 cores (SkylakeX ...)
// xgrad's kernel measured faster (Xeon model 167, stories15M decoding: 1.04x on one thread,
// 1.5-1.65x on two, its products split over the pool from 64K flops).
bool openblas_core_is_avx2_only(const std::string& core) {
  const std::string c = lowercase(core);
  return c == "haswell" || c == "zen";
}

F64Kernel own_kernel(const std::string& ceiling) {
  return ceiling == "avx512" ? F64Kernel::xgrad_avx512 : F64Kernel::xgrad_avx2;
}

}  // namespace

ForcedKernel forced_kernel(const char* variable, const char* name) {
  static const char* const kNames[] = {"float64_gemm", "float32_gemv", "bf16_gemm", "bf16_attention"};
  static const std::string kNameList = "float64_gemm, float32_gemv, bf16_gemm or bf16_attention";
  const char* own = std::getenv(variable);
  ForcedKernel f{own ? own : "", variable};
  const char* all = std::getenv("XGRAD_KERNELS");
  if (!all || !*all) return f;
  const std::string text = all;
  std::string found;
  bool seen = false;
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string entry = text.substr(start, end - start);
    start = end + 1;
    const std::size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ValueError(op_message("XGRAD_KERNELS", "entry '" + entry + "' of '" + text + "' is not name=value (names: " +
                                                       kNameList + ")"));
    const std::string key = entry.substr(0, eq);
    if (std::find(std::begin(kNames), std::end(kNames), key) == std::end(kNames))
      throw ValueError(op_message("XGRAD_KERNELS", "unknown kernel '" + key + "' (" + kNameList + ")"));
    if (key != name) continue;
    if (seen) throw ValueError(op_message("XGRAD_KERNELS", "'" + key + "' is set twice in '" + text + "'"));
    seen = true;
    found = entry.substr(eq + 1);
  }
  if (!seen) return f;
  if (own && found != own)
    throw ValueError(op_message("XGRAD_KERNELS", std::string(name) + "=" + found + " conflicts with " + variable +
                                                     "=" + own));
  return {found, std::string("XGRAD_KERNELS ") + name};
}

namespace {

F64Choice choose_f64() {
  const std::string ceiling = isa_ceiling();  // cpuid, capped by set_max_isa / XGRAD_ISA
  const ForcedKernel f = forced_kernel("XGRAD_FLOAT64_GEMM", "float64_gemm");
  const std::string& force = f.value;
  if (force == "openblas") return {F64Kernel::openblas, f.setting()};
  if (force == "xgrad") {
    if (ceiling == "none")
      throw Error(op_message(f.source, "xgrad's float64 kernel needs AVX2 + FMA, which this CPU lacks"));
    return {own_kernel(ceiling), f.setting()};
  }
  if (!force.empty() && force != "auto")
    throw ValueError(op_message(f.source, "unknown value '" + force + "' (xgrad, openblas or auto)"));
  const std::string core = openblas_corename();
  if (ceiling == "none") return {F64Kernel::openblas, "the CPU has no AVX2 + FMA"};
  if (ceiling == "avx512" && openblas_core_is_avx2_only(core))
    return {own_kernel(ceiling), "OpenBLAS core " + core + " has AVX2 dgemm kernels, this CPU AVX-512"};
  if (openblas_core_is_vector(core) && ceiling != "avx512")
    return {F64Kernel::openblas, "OpenBLAS core " + core + " has AVX2/AVX-512 dgemm kernels"};
  if (openblas_core_is_vector(core)) {  // AVX-512 kernels on both sides: the faster one, measured
    const detail::Calibration c = detail::calibrated("float64_gemm_xgrad_avx512", f64_measured_speedup);
    const std::string how = "xgrad's kernel measured at " + ratio_text(c.value) + " OpenBLAS core " + core +
                            "'s dgemm" + (c.cached ? detail::kReadFromCache : "");
    return {c.value >= kF64MinSpeedup ? F64Kernel::xgrad_avx512 : F64Kernel::openblas, how, c.value};
  }
  return {own_kernel(ceiling), "OpenBLAS core " + core + " has no AVX2 or AVX-512 dgemm kernels"};
}

const F64Choice& f64_choice() {
  static const F64Choice choice = choose_f64();  // a throw leaves it unset: the next call throws again
  return choice;
}

}  // namespace

double f64_measured_speedup() {
  if (!f64::cpu_supported(f64::Isa::avx512)) return 0.0;
  single_threaded();
  constexpr std::size_t n = 256;
  std::vector<double> a(n * n), b(n * n), c(n * n);
  for (std::size_t i = 0; i < n * n; ++i) {
    a[i] = 1.0 / double(1 + i % 13);
    b[i] = 1.0 / double(1 + i % 7);
  }
  const auto openblas = [&] { raw(false, false, n, n, n, 1.0, a.data(), n, b.data(), n, 0.0, c.data(), n); };
  const auto own = [&] {
    f64::gemm_block(f64::Isa::avx512, false, false, n, n, n, 1.0, a.data(), n, b.data(), n, 0.0, c.data(), n);
  };
  return detail::measured_speedup(openblas, own, 3);
}

double f64_calibrated_speedup() { return f64_choice().speedup; }

namespace {

// One block of the own kernel (split_blocks' kernel argument).
struct OwnF64Kernel {
  f64::Isa isa;
  void operator()(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha, const double* A,
                  std::size_t lda, const double* B, std::size_t ldb, double beta, double* C, std::size_t ldc) const {
    f64::gemm_block(isa, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
};

}  // namespace

F64Kernel dgemm_kernel() { return f64_choice().kernel; }

std::string dgemm_reason() { return f64_choice().reason; }

const char* f64_kernel_name(F64Kernel k) {
  switch (k) {
    case F64Kernel::xgrad_avx512:
      return "xgrad avx512";
    case F64Kernel::xgrad_avx2:
      return "xgrad avx2";
    default:
      return "OpenBLAS";
  }
}

bool f64_kernel_available(F64Kernel k) {
  if (k == F64Kernel::openblas) return true;
  return f64::cpu_supported(k == F64Kernel::xgrad_avx512 ? f64::Isa::avx512 : f64::Isa::avx2);
}

void dgemm_on(F64Kernel k, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, double alpha,
              const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta, double* C,
              std::size_t ldc) {
  if (!f64_kernel_available(k))
    throw Error(op_message("blas::dgemm_on", std::string(f64_kernel_name(k)) + " needs instructions this CPU lacks"));
  g_f64_calls[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed);
  if (k == F64Kernel::openblas) {
    split_gemm(OpenBlasKernel{}, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (M == 0 || N == 0) return;
  // Every shape, matrix-vector products included, as blocks of C over the pool: the bits of each
  // entry depend on K alone (core/detail/dgemm.hpp), so not on the thread count.
  const OwnF64Kernel kernel{k == F64Kernel::xgrad_avx512 ? f64::Isa::avx512 : f64::Isa::avx2};
  split_blocks(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

std::uint64_t dgemm_calls(F64Kernel k) { return g_f64_calls[static_cast<int>(k)].load(std::memory_order_relaxed); }

std::string openblas_corename() {
  const char* c = openblas_get_corename();
  return c ? c : "unknown";
}

std::string openblas_config() {
  const char* c = openblas_get_config();
  return c ? c : "unknown";
}

// --- which float32 matrix-vector kernel: chosen once, at the first one-row product ---

namespace {

std::atomic<std::uint64_t> g_gemv_calls[4];

struct GemvChoice {
  GemvKernel kernel = GemvKernel::openblas;
  std::string reason;
};

GemvKernel own_gemv(const std::string& ceiling) {
  return ceiling == "avx512" ? GemvKernel::xgrad_avx512
         : ceiling == "avx2" ? GemvKernel::xgrad_avx2
                             : GemvKernel::xgrad_scalar;
}

GemvChoice choose_gemv() {
  const std::string ceiling = isa_ceiling();  // cpuid, capped by set_max_isa / XGRAD_ISA
  const ForcedKernel f = forced_kernel("XGRAD_FLOAT32_GEMV", "float32_gemv");
  const std::string& force = f.value;
  if (force == "openblas") return {GemvKernel::openblas, f.setting()};
  if (force == "xgrad") return {own_gemv(ceiling), f.setting()};
  if (!force.empty() && force != "auto")
    throw ValueError(op_message(f.source, "unknown value '" + force + "' (xgrad, openblas or auto)"));
  const std::string core = openblas_corename();
  if (ceiling == "none") return {GemvKernel::openblas, "the CPU has no AVX2 + FMA"};
  if (openblas_core_is_avx2_only(core) && ceiling == "avx512")
    return {GemvKernel::openblas, "OpenBLAS core " + core + " has AVX2 sgemv kernels"};
  if (openblas_core_is_avx2_only(core))
    return {own_gemv(ceiling), "OpenBLAS core " + core + ": xgrad's streamed kernel decodes faster on AVX2 CPUs"};
  if (openblas_core_is_vector(core))
    return {own_gemv(ceiling), "OpenBLAS core " + core + ": xgrad's kernel decodes faster on AVX-512 cores"};
  return {own_gemv(ceiling), "OpenBLAS core " + core + " has no AVX2 or AVX-512 sgemv kernels"};
}

const GemvChoice& gemv_choice() {
  static const GemvChoice choice = choose_gemv();  // a throw leaves it unset: the next call throws again
  return choice;
}

f32v::Isa gemv_isa(GemvKernel k) {
  return k == GemvKernel::xgrad_avx512 ? f32v::Isa::avx512
         : k == GemvKernel::xgrad_avx2 ? f32v::Isa::avx2
                                       : f32v::Isa::scalar;
}

// Own-kernel products are split over the pool from this many flops (a stories15M layer's
// smallest product, 288 x 288, is 166K): each chunk streams its own columns of W once, and the
// bits of an entry do not depend on the split (core/detail/sgemv.hpp).
constexpr double kSplitOwnGemvFlops = 1 << 16;
// Outputs per block of the split: one cache line of y (chunks never share a line of y), small
// enough that 288 outputs (a stories15M projection) split evenly over two threads.
constexpr std::size_t kAlignOwnGemv = 16;

// x as a contiguous vector: x itself when incx is 1, else a copy into `buf`.
const float* contiguous(const float* x, std::size_t K, std::size_t incx, detail::AlignedVector<float>& buf) {
  if (incx == 1) return x;
  buf.resize(K);
  for (std::size_t k = 0; k < K; ++k) buf[k] = x[k * incx];
  return buf.data();
}

// One product of the own kernel: outputs [0, n) of form rows (W [K, n]) or dots (W [n, K]).
struct OwnGemv {
  bool rows;
  std::size_t K, n;
  const float* x;
  const float* W;
  std::size_t ldw;
  float alpha, beta;
  float* y;
  std::size_t incy;
  void run(f32v::Isa isa, std::size_t lo, std::size_t hi) const {
    if (rows)
      f32v::rows(isa, K, lo, hi, alpha, x, W, ldw, beta, y, incy);
    else
      f32v::dots(isa, K, lo, hi, alpha, x, W, ldw, beta, y, incy);
  }
};

// Calls f(i, j0, j1) for the outputs [j0, j1) of each product i that the global block range
// [b0, b1) covers: the blocks of kAlignOwnGemv outputs of all products, numbered product after
// product (one chunk's share, in both splits below).
template <class F> void for_each_block(const OwnGemv* ps, std::size_t count, std::size_t b0, std::size_t b1, F f) {
  std::size_t first = 0;  // product i's first block
  for (std::size_t i = 0; i < count && first < b1; ++i) {
    const std::size_t nb = (ps[i].n + kAlignOwnGemv - 1) / kAlignOwnGemv;
    const std::size_t lo = std::max(b0, first), hi = std::min(b1, first + nb);
    if (lo < hi) f(i, (lo - first) * kAlignOwnGemv, std::min(ps[i].n, (hi - first) * kAlignOwnGemv));
    first += nb;
  }
}

// Chunks per pool thread of the own AVX-512 kernel's split products, claimed one at a time
// (detail::run_chunks): with one chunk per thread, the two halves of a decoding step's
// products finished apart (a thread descheduled, or slowed by the other's memory traffic) and the
// other thread waited; with eight, the thread ahead takes more of them. stories15M decoding at 2
// threads on the Xeon model 167: 1.04-1.10x in four alternating runs, 1.00-1.04x on a busier host
// (4 a thread 1.04x, 16 a thread 1.03x; bench/NOTES.md). Each output is still computed by one chunk from the same inputs in the same
// order, so the bits do not change. The AVX2 kernel keeps one chunk a thread, as measured on AMD
// Zen 1 (below).
constexpr std::size_t kBalanceGemv = 8;
std::size_t chunks_per_thread(f32v::Isa isa) { return isa == f32v::Isa::avx512 ? kBalanceGemv : 1; }

// Rows products (all of ps) on `chunks` >= 2 pool threads, chunks_per_thread(isa) chunks a thread
// (at most two a block): chunk c computes the half c % 2 of K (f32v::rows_part) for group c / 2's
// blocks of kAlignOwnGemv outputs, across all products, into partial sums; the caller then adds
// the halves and finishes y. The halves are those of f32v::rows, so the bits do not depend on the
// thread count. Split by columns instead, each thread reads a part of every row of W, and two
// threads stream W no faster than one on AMD Zen 1; split by halves, each reads a contiguous half
// (docs/performance.md, "Generation").
std::atomic<std::uint64_t> g_gemv_rows_halves{0};

void run_own_rows_halves(f32v::Isa isa, const OwnGemv* ps, std::size_t count, std::size_t chunks) {
  g_gemv_rows_halves.fetch_add(1, std::memory_order_relaxed);
  thread_local detail::AlignedVector<float> part;
  std::vector<std::size_t> offset(count + 1, 0);
  std::size_t blocks = 0;
  for (std::size_t i = 0; i < count; ++i) {
    offset[i + 1] = offset[i] + 2 * ps[i].n;
    blocks += (ps[i].n + kAlignOwnGemv - 1) / kAlignOwnGemv;
  }
  part.resize(offset[count]);
  float* const sums = part.data();
  const std::size_t groups = std::min(chunks_per_thread(isa) * chunks / 2, blocks);
  detail::run_chunks(2 * groups, [&](std::size_t c) {
    const std::size_t half = c % 2, g = c / 2;
    for_each_block(ps, count, blocks * g / groups, blocks * (g + 1) / groups,
                   [&](std::size_t i, std::size_t j0, std::size_t j1) {
                     const OwnGemv& p = ps[i];
                     const std::size_t h = p.K / 2;
                     f32v::rows_part(isa, half ? h : 0, half ? p.K : h, j0, j1, p.x, p.W, p.ldw,
                                     sums + offset[i] + half * p.n + j0);
                   });
  });
  for (std::size_t i = 0; i < count; ++i) {
    const OwnGemv& p = ps[i];
    const float* a = sums + offset[i];
    const float* b = a + p.n;
    for (std::size_t j = 0; j < p.n; ++j) {
      float* yj = p.y + j * p.incy;
      const float s = a[j] + b[j];
      *yj = p.beta == 0.0f ? p.alpha * s : std::fma(p.beta, *yj, p.alpha * s);  // f32v's finish
    }
  }
}

// Runs `count` products sharing a pool hand-off: rows products as two halves of K
// (run_own_rows_halves); otherwise their outputs are cut into blocks of kAlignOwnGemv, the
// blocks of all products dealt to chunks_per_thread(isa) chunks a thread in one
// run_chunks.
void run_own(f32v::Isa isa, const OwnGemv* ps, std::size_t count) {
  double flops = 0;
  std::size_t blocks = 0;
  bool all_rows = true;
  for (std::size_t i = 0; i < count; ++i) {
    flops += 2.0 * double(ps[i].n) * double(ps[i].K);
    blocks += (ps[i].n + kAlignOwnGemv - 1) / kAlignOwnGemv;
    all_rows = all_rows && ps[i].rows;
  }
  const std::size_t threads = flops < kSplitOwnGemvFlops ? 1 : static_cast<std::size_t>(detail::pool_threads());
  if (all_rows && threads >= 2 && blocks >= 1) {
    run_own_rows_halves(isa, ps, count, threads);
    return;
  }
  const std::size_t chunks = threads <= 1 ? 1 : std::min(chunks_per_thread(isa) * threads, blocks);
  if (chunks <= 1) {
    for (std::size_t i = 0; i < count; ++i) ps[i].run(isa, 0, ps[i].n);
    return;
  }
  detail::run_chunks(chunks, [&](std::size_t c) {
    for_each_block(ps, count, blocks * c / chunks, blocks * (c + 1) / chunks,
                   [&](std::size_t i, std::size_t j0, std::size_t j1) { ps[i].run(isa, j0, j1); });
  });
}

void check_gemv_kernel(GemvKernel k) {
  if (!gemv_kernel_available(k))
    throw Error(op_message("blas::sgemv_on", std::string(gemv_kernel_name(k)) + " needs instructions this CPU lacks"));
}

}  // namespace

GemvKernel sgemv_kernel() { return gemv_choice().kernel; }

std::uint64_t gemv_rows_halves_calls() { return g_gemv_rows_halves.load(std::memory_order_relaxed); }

std::string sgemv_reason() { return gemv_choice().reason; }

const char* gemv_kernel_name(GemvKernel k) {
  switch (k) {
    case GemvKernel::xgrad_avx512: return "xgrad avx512";
    case GemvKernel::xgrad_avx2: return "xgrad avx2";
    case GemvKernel::xgrad_scalar: return "xgrad scalar";
    default: return "OpenBLAS";
  }
}

bool gemv_kernel_available(GemvKernel k) { return k == GemvKernel::openblas || f32v::cpu_supported(gemv_isa(k)); }

void sgemv_on(GemvKernel k, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
              std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  if (!is_gemv(M, N, K))
    throw ValueError(op_message("blas::sgemv_on", "a matrix-vector product has M = 1 or N = 1 (not both) and K > 0, got M " +
                                                      std::to_string(M) + ", N " + std::to_string(N) + ", K " +
                                                      std::to_string(K)));
  check_gemv_kernel(k);
  g_gemv_calls[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed);
  if (k == GemvKernel::openblas) {
    sgemm_on(Backend::openblas, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  thread_local detail::AlignedVector<float> xbuf;
  OwnGemv p{};
  p.K = K;
  p.alpha = alpha;
  p.beta = beta;
  p.y = C;
  if (M == 1) {  // C [1, N] = row x of op(A) times op(B) [K, N]
    p.x = contiguous(A, K, ta ? lda : 1, xbuf);
    p.rows = !tb;  // B [K, N]: rows of B; B [N, K]: a dot product per row of B
    p.n = N;
    p.W = B;
    p.ldw = ldb;
    p.incy = 1;
  } else {  // C [M, 1] = op(A) [M, K] times the column op(B)
    p.x = contiguous(B, K, tb ? 1 : ldb, xbuf);
    p.rows = ta;  // A [K, M]: rows of A; A [M, K]: a dot product per row of A
    p.n = M;
    p.W = A;
    p.ldw = lda;
    p.incy = ldc;
  }
  run_own(gemv_isa(k), &p, 1);
}

namespace {
std::atomic<std::uint64_t> g_row_products_calls{0};
}  // namespace

std::uint64_t row_products_calls() { return g_row_products_calls.load(std::memory_order_relaxed); }

void row_products(const float* x, std::size_t K, const RowProduct* ps, std::size_t count) {
  const ProfileTimer timer;
  g_row_products_calls.fetch_add(1, std::memory_order_relaxed);
  const GemvKernel k = sgemv_kernel();
  if (k == GemvKernel::openblas || K == 0) {  // one product after the other, as gemm would
    for (std::size_t i = 0; i < count; ++i) {
      const RowProduct& p = ps[i];
      if (is_gemv(1, p.N, K))
        sgemv_on(k, false, false, 1, p.N, K, 1.0f, x, K, p.W, p.N, 0.0f, p.y, p.N);
      else
        sgemm_on(sgemm_backend(), false, false, 1, p.N, K, 1.0f, x, K, p.W, p.N, 0.0f, p.y, p.N);
    }
    return;
  }
  std::vector<OwnGemv> own(count);
  for (std::size_t i = 0; i < count; ++i) {
    own[i] = OwnGemv{true, K, ps[i].N, x, ps[i].W, ps[i].N, 1.0f, 0.0f, ps[i].y, 1};
    g_gemv_calls[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed);
  }
  run_own(gemv_isa(k), own.data(), count);
}

std::uint64_t sgemv_calls(GemvKernel k) { return g_gemv_calls[static_cast<int>(k)].load(std::memory_order_relaxed); }

// --- bfloat16 products (core/detail/bf16_gemm.hpp, xg::set_matmul_dtype) ---

namespace {
std::atomic<std::uint64_t> g_bf16_kernel_calls[2];
}  // namespace

Bf16Choice bf16_decision(bool amx, double onednn_speedup, double dot_speedup) {
  std::string measured;
  if (amx) {
    if (onednn_speedup >= bf16::kMinSpeedup)
      return {"", Bf16Kernel::onednn, "AMX products measured at " + ratio_text(onednn_speedup) + " float32"};
    measured = "oneDNN's AMX products measured at " + ratio_text(onednn_speedup) + " the float32 product rate, ";
  }
  if (dot_speedup >= bf16::kMinSpeedup)
    return {"", Bf16Kernel::xgrad, "bfloat16 dot products measured at " + ratio_text(dot_speedup) + " float32 FMAs"};
  return {measured + "bfloat16 dot products measured at " + ratio_text(dot_speedup) +
              " the float32 FMA rate on this CPU (bfloat16 products need " + ratio_text(bf16::kMinSpeedup) +
              "): float32 products are faster",
          Bf16Kernel::xgrad, ""};
}

namespace {

// XGRAD_BF16_GEMM (or bf16_gemm in XGRAD_KERNELS): a value it does not know is a ValueError.
ForcedKernel bf16_force() {
  ForcedKernel f = forced_kernel("XGRAD_BF16_GEMM", "bf16_gemm");
  const std::string& v = f.value;
  if (!v.empty() && v != "auto" && v != "on" && v != "off" && v != "xgrad" && v != "onednn")
    throw ValueError(op_message(f.source, "unknown value '" + v + "' (auto, on, off, xgrad or onednn)"));
  return f;
}

// The bfloat16 decision, made once per process (XGRAD_BF16_GEMM, then the calibrations).
Bf16Choice choose_bf16() {
  setup();  // oneDNN's ISA ceiling before any oneDNN call
  const ForcedKernel f = bf16_force();
  const std::string& force = f.value;
  if (force == "off") return {f.setting(), Bf16Kernel::xgrad, ""};
  if (force == "xgrad") return {"", Bf16Kernel::xgrad, f.setting()};
  if (force == "onednn") {
    if (!bf16::onednn_supported())
      throw Error(op_message(f.source, "oneDNN's bfloat16 products are unavailable: " +
                                           bf16::onednn_unavailable_reason()));
    return {"", Bf16Kernel::onednn, f.setting()};
  }
  const bool amx = bf16::onednn_supported() && bf16::onednn_uses_amx();
  if (force == "on")
    return {"", amx ? Bf16Kernel::onednn : Bf16Kernel::xgrad, f.setting() + (amx ? ", oneDNN runs on AMX" : "")};
  // oneDNN's calibration first where it has AMX; the dot products' only where that one fell short.
  // Each ratio measured once per CPU and build (the calibration cache): every process on this
  // machine decides the same way, also where a ratio sits near the threshold.
  bool cached = false;
  const auto ratio = [&cached](const char* name, double (*measure)()) {
    const detail::Calibration c = detail::calibrated(name, measure);
    cached = cached || c.cached;
    return c.value;
  };
  const double ro = amx ? ratio("bf16_gemm_onednn_amx", bf16::onednn_measured_speedup) : 0.0;
  Bf16Choice c = bf16_decision(
      amx, ro, amx && ro >= bf16::kMinSpeedup ? 0.0 : ratio("bf16_gemm_dot", bf16::measured_speedup));
  if (cached) (c.unavailable.empty() ? c.reason : c.unavailable) += detail::kReadFromCache;
  return c;
}

const Bf16Choice& bf16_choice() {
  static const Bf16Choice choice = choose_bf16();  // a throw leaves it unset: the next call throws again
  return choice;
}
}  // namespace

std::string bf16_unavailable_reason() {
  // The variable's spelling is checked on every CPU, also where no bfloat16 product can run
  // (once: a throw leaves it unchecked, so the next call throws again).
  static const bool checked = (bf16_force(), true);
  (void)checked;
  if (!bf16::cpu_supported()) return "this CPU has no AVX512_BF16 instructions";
  setup();
  if (g_ceiling != "avx512")
    return "the float32 kernels are capped at " + g_ceiling + " (XGRAD_ISA or set_max_isa)";
  return bf16_choice().unavailable;
}

bool bf16_available() { return bf16_unavailable_reason().empty(); }

Bf16Kernel bf16_kernel() { return bf16_choice().kernel; }

std::string bf16_kernel_reason() { return bf16_choice().reason; }

const char* bf16_kernel_name(Bf16Kernel k) { return k == Bf16Kernel::onednn ? "oneDNN" : "xgrad avx512_bf16"; }

void gemm_bf16(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
               std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  gemm_bf16_on(bf16_kernel(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

namespace {

// A bfloat16 product on xgrad's kernel whose K is at least 512 and twice both M and N (a weight
// gradient, x^T dY over the batch's rows), and large enough to split at all (kSplitFlops), runs
// as two halves of K: the first into C (with
// beta), the second into a partial buffer added to C afterwards, each half split over half the
// pool by C's blocks. Split by C's blocks alone, every thread packed the whole of the operand
// the blocks share (x^T for x^T dY's column blocks); by halves of K each packs half of each.
// The halves do not depend on the thread count (nor does the partition of C: its blocks are
// independent), so neither do the bits. (The float32 split_k's chunks, one per thread, do.)
constexpr std::size_t kBf16HalvesRatio = 2;
constexpr std::size_t kBf16HalvesMinK = 512;  // two of the kernel's K blocks
std::atomic<std::uint64_t> g_bf16_k_halves{0};

bool bf16_k_halves_apply(std::size_t M, std::size_t N, std::size_t K) {
  return K >= kBf16HalvesMinK && K >= kBf16HalvesRatio * std::max(M, N) &&
         2.0 * double(M) * double(N) * double(K) >= kSplitFlops;
}

void bf16_k_halves(bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                   std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc) {
  g_bf16_k_halves.fetch_add(1, std::memory_order_relaxed);
  thread_local detail::AlignedVector<float> part_buf;  // reused, as split_k's
  part_buf.resize(M * N);
  float* part = part_buf.data();
  const std::size_t half = (K / 2) & ~std::size_t(1);  // the second half starts on a pair
  const bool by_rows = M >= N;
  const std::size_t extent = by_rows ? M : N, blocks = (extent + kAlignRows - 1) / kAlignRows;
  const std::size_t per_half =
      std::min(blocks, std::max<std::size_t>(1, static_cast<std::size_t>(detail::pool_threads()) / 2));
  detail::run_chunks(2 * per_half, [&](std::size_t c) {
    const std::size_t h = c / per_half, b = c % per_half;
    const std::size_t lo = blocks * b / per_half * kAlignRows;
    const std::size_t hi = std::min(extent, blocks * (b + 1) / per_half * kAlignRows);
    if (lo >= hi) return;
    const std::size_t k0 = h ? half : 0, kk = h ? K - half : half;
    const float* Ak = ta ? A + k0 * lda : A + k0;  // op(A)'s columns k0 .. k0 + kk
    const float* Bk = tb ? B + k0 : B + k0 * ldb;  // op(B)'s rows k0 .. k0 + kk
    float* Ch = h ? part : C;
    const std::size_t ldh = h ? N : ldc;
    const float bh = h ? 0.0f : beta;
    if (by_rows)
      bf16::gemm_block(ta, tb, hi - lo, N, kk, alpha, ta ? Ak + lo : Ak + lo * lda, lda, Bk, ldb, bh, Ch + lo * ldh,
                       ldh);
    else
      bf16::gemm_block(ta, tb, M, hi - lo, kk, alpha, Ak, lda, tb ? Bk + lo * ldb : Bk + lo, ldb, bh, Ch + lo, ldh);
  });
  detail::parallel_for(M, std::max<std::size_t>(1, (std::size_t{1} << 14) / std::max<std::size_t>(N, 1)),
                       [&](std::size_t r0, std::size_t r1, std::size_t) {
                         for (std::size_t i = r0; i < r1; ++i) {
                           float* row = C + i * ldc;
                           const float* p = part + i * N;
                           for (std::size_t j = 0; j < N; ++j) row[j] += p[j];
                         }
                       });
}

}  // namespace

std::uint64_t bf16_k_halves_calls() { return g_bf16_k_halves.load(std::memory_order_relaxed); }

void gemm_bf16_on(Bf16Kernel k, bool ta, bool tb, std::size_t M, std::size_t N, std::size_t K, float alpha,
                  const float* A, std::size_t lda, const float* B, std::size_t ldb, float beta, float* C,
                  std::size_t ldc) {
  g_bf16_calls.fetch_add(1, std::memory_order_relaxed);
  g_bf16_kernel_calls[static_cast<int>(k)].fetch_add(1, std::memory_order_relaxed);
  const ProfileTimer timer;  // the bfloat16 products count inside the GEMM doorway too
  if (k == Bf16Kernel::onednn) {
    setup();  // oneDNN's ISA ceiling first
    bf16::onednn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (bf16_k_halves_apply(M, N, K)) {
    bf16_k_halves(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  split_blocks(bf16::gemm_block, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

std::uint64_t bf16_calls() { return g_bf16_calls.load(std::memory_order_relaxed); }

std::uint64_t bf16_calls(Bf16Kernel k) {
  return g_bf16_kernel_calls[static_cast<int>(k)].load(std::memory_order_relaxed);
}

int num_threads() {
  single_threaded();
  return openblas_get_num_threads();
}

}  // namespace xg::blas
