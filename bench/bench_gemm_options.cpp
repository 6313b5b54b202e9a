// The float32 GEMM options of issue 21, side by side in one run (bench/NOTES.md, "libxsmm,
// BLIS and oneDNN's matmul primitive: measured"): xgrad's BLAS doorway (core/detail/blas.hpp,
// oneDNN dnnl_sgemm in xgrad's pool), OpenBLAS (in the pool and on its own threads), oneDNN's
// matmul primitive, BLIS and libxsmm, on the products xgrad's training computes: square n, the
// projections of train steps M and S with both products of their backward pass, and the
// attention tiles and head products. For comparison only: xgrad never uses BLIS or libxsmm, and
// this program is built only where they are found (bench/CMakeLists.txt) and only on request
// (`cmake --build build --target bench_gemm_options`).
//
// Every shape runs each variant in interleaved rounds (the order rotates each round); a sample
// is a batch of calls of about --sample-ms; medians over all samples. GFLOP/s are 2 M N K / time,
// and a share of the fp32 FMA peak measured in the same run (bench/peak.hpp, on xgrad's pool).
// Each variant's C is compared with the doorway's (C filled with NaN first, beta 0): the largest
// |difference| over the largest |C|; above 1e-4 the program fails after printing its tables.
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "bench/common.hpp"
#include "bench/openblas.hpp"
#include "bench/peak.hpp"
#include "bench/xgrad_pool.hpp"
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/parallel.hpp>
#include <xgrad/core/runtime.hpp>

#if XGRAD_BENCH_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif
#if XGRAD_BENCH_HAVE_BLIS
#include <blis.h>
#endif
#if XGRAD_BENCH_HAVE_LIBXSMM
#include <libxsmm.h>
#endif

// libgomp (oneDNN, BLIS and libxsmmext run on OpenMP): the team size of the calling thread.
extern "C" void omp_set_num_threads(int);
extern "C" int omp_get_max_threads(void);

namespace {

using xg::blas::Backend;

struct Shape {
  std::string name;  // what training computes with it
  std::size_t M, K, N;
  bool ta, tb;  // row-major C [M, N] = op(A) op(B); A stored [K, M] when ta, B stored [N, K] when tb
};

std::string dims(const Shape& s) {
  std::string op = s.ta ? (s.tb ? "A^T B^T" : "A^T B") : (s.tb ? "A B^T" : "A B");
  return std::to_string(s.M) + " x " + std::to_string(s.K) + " x " + std::to_string(s.N) + " " + op;
}

// The products of training: C [M, N] = op(A) [M, K] op(B) [K, N].
std::vector<Shape> training_shapes() {
  std::vector<Shape> v;
  for (std::size_t n : {256, 512, 1024}) v.push_back({"square", n, n, n, false, false});
  // A projection Y [R, out] = X [R, in] W [in, out] and its backward: dX = dY W^T, dW = X^T dY.
  const auto projection = [&v](const std::string& step, std::size_t R, std::size_t in, std::size_t out) {
    const std::string what = step + " " + std::to_string(in) + "->" + std::to_string(out);
    v.push_back({what + " fwd", R, in, out, false, false});
    v.push_back({what + " dX", R, out, in, false, true});
    v.push_back({what + " dW", in, R, out, true, false});
  };
  for (auto io : {std::pair<std::size_t, std::size_t>{256, 768}, {256, 256}, {256, 1024}, {1024, 256}})
    projection("M", 2048, io.first, io.second);
  for (auto io : {std::pair<std::size_t, std::size_t>{64, 192}, {64, 64}, {64, 256}, {256, 64}})
    projection("S", 1024, io.first, io.second);
  // Attention: tiles of the fused kernel (128 queries x 128 keys, head width 64) and the
  // per-head products of the composed path of steps M (T 256, d_head 32) and S (T 64, d_head 16).
  v.push_back({"tile S=QK^T", 128, 64, 128, false, true});
  v.push_back({"tile O=PV", 128, 128, 64, false, false});
  v.push_back({"tile dK=dS^T Q", 128, 128, 64, true, false});
  v.push_back({"tile 128x64x64", 128, 64, 64, false, false});
  v.push_back({"tile 64x64x128", 64, 64, 128, false, false});
  v.push_back({"M head QK^T", 256, 32, 256, false, true});
  v.push_back({"M head PV", 256, 256, 32, false, false});
  v.push_back({"S head QK^T", 64, 16, 64, false, true});
  v.push_back({"S head PV", 64, 64, 16, false, false});
  return v;
}

struct Problem {
  Shape s;
  std::vector<float> a, b, c;
  std::size_t lda, ldb, ldc;
  const float* A() const { return a.data(); }
  const float* B() const { return b.data(); }
  float* C() { return c.data(); }
  double flop() const { return 2.0 * double(s.M) * double(s.N) * double(s.K); }
};

Problem make_problem(const Shape& s, std::mt19937& rng) {
  Problem p{s, {}, {}, {}, s.ta ? s.M : s.K, s.tb ? s.K : s.N, s.N};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p.a.resize(s.M * s.K);
  p.b.resize(s.K * s.N);
  p.c.resize(s.M * s.N);
  for (float& x : p.a) x = u(rng);
  for (float& x : p.b) x = u(rng);
  return p;
}

// How the doorway splits a product over the pool (core/blas.cpp split_blocks): below 2^20 flops
// one call; otherwise row blocks (column blocks when C is wider than tall) in multiples of 16.
struct Block {
  std::size_t M, N, a_off, b_off, c_off;
};
std::vector<Block> pool_blocks(const Problem& p, std::size_t threads) {
  const Shape& s = p.s;
  if (p.flop() < double(1 << 20)) threads = 1;
  const bool by_rows = s.M >= s.N;
  const std::size_t extent = by_rows ? s.M : s.N, align = 16;
  const std::size_t blocks = (extent + align - 1) / align, chunks = std::min(threads, blocks);
  if (chunks <= 1) return {{s.M, s.N, 0, 0, 0}};
  std::vector<Block> out;
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t lo = blocks * c / chunks * align, hi = std::min(extent, blocks * (c + 1) / chunks * align);
    if (lo >= hi) continue;
    if (by_rows)
      out.push_back({hi - lo, s.N, s.ta ? lo : lo * p.lda, 0, lo * p.ldc});
    else
      out.push_back({s.M, hi - lo, 0, s.tb ? lo * p.ldb : lo, lo});
  }
  return out;
}
template <class F>
void run_blocks(const std::vector<Block>& blocks, const F& f) {
  if (blocks.size() == 1)
    f(std::size_t{0});
  else
    xg::detail::run_chunks(blocks.size(), [&](std::size_t c) { f(c); });
}
void omp_single_on_this_thread() {
  thread_local bool done = false;
  if (!done) {
    omp_set_num_threads(1);
    done = true;
  }
}

// Before a round in xgrad's pool: every pool thread busy for 0.2 ms at once, so the round starts
// with all of them awake. The pool's threads spin 50 us after a job and then sleep (core/parallel.cpp);
// where waking a sleeping thread takes longer than that (this guest), back-to-back small products
// can stay in a mode where each call waits for two wake-ups (--pool-wake 0 shows it).
bool g_pool_wake = true;
void wake_pool() {
  if (!g_pool_wake) return;
  xg::detail::run_chunks(std::size_t(xg::detail::pool_threads()), [](std::size_t) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    while (std::chrono::steady_clock::now() < until) {
    }
  });
}

// One way of computing the product. prepare() is untimed (a real integration would create
// primitives and kernels once per shape) and returns why the variant cannot run this shape ("" if it
// can); enter() and leave() bracket prepare() and each round (thread settings).
class Variant {
 public:
  virtual ~Variant() = default;
  virtual std::string name() const = 0;
  virtual std::string key() const = 0;  // for --variants
  virtual std::string prepare(Problem& p) = 0;
  virtual void run(Problem& p) = 0;
  virtual void enter() {}
  virtual void leave() {}
  virtual std::string detail() const { return ""; }  // what ran (an implementation name), after prepare
};

class Doorway : public Variant {
 public:
  void enter() override { wake_pool(); }
  std::string key() const override { return "doorway"; }
  std::string name() const override { return "doorway (" + xg::float32_gemm_kernels() + ", pool)"; }
  std::string prepare(Problem&) override { return ""; }
  void run(Problem& p) override {
    const Shape& s = p.s;
    xg::blas::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, p.A(), p.lda, p.B(), p.ldb, 0.0f, p.C(), p.ldc);
  }
};

class OpenBlasPool : public Variant {
 public:
  void enter() override { wake_pool(); }
  std::string key() const override { return "openblas-pool"; }
  std::string name() const override { return "OpenBLAS (pool)"; }
  std::string prepare(Problem&) override { return ""; }
  void run(Problem& p) override {
    const Shape& s = p.s;
    xg::blas::sgemm_on(Backend::openblas, s.ta, s.tb, s.M, s.N, s.K, 1.0f, p.A(), p.lda, p.B(), p.ldb, 0.0f, p.C(),
                       p.ldc);
  }
};

// One cblas_sgemm on OpenBLAS's own threads. Its idle threads keep spinning for a while after a
// call, so leave() gives them time to sleep before the next variant runs.
class OpenBlasOwn : public Variant {
 public:
  std::string key() const override { return "openblas-own"; }
  explicit OpenBlasOwn(int threads) : threads_(threads) {}
  std::string name() const override { return "OpenBLAS (own " + std::to_string(threads_) + " threads)"; }
  std::string prepare(Problem&) override { return ""; }
  void enter() override {
    before_ = bench::openblas_threads();
    bench::set_openblas_threads(threads_);
  }
  void leave() override {
    bench::set_openblas_threads(before_);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  void run(Problem& p) override {
    const Shape& s = p.s;
    bench::raw_sgemm(s.ta, s.tb, s.M, s.N, s.K, p.A(), p.lda, p.B(), p.ldb, p.C(), p.ldc);
  }

 private:
  int threads_, before_ = 1;
};

// After a round on a library's own threads: libgomp's idle team threads spin for a few ms after a
// parallel region and would hold the second core while the next variant (in xgrad's pool) runs.
int g_settle_ms = 20;
void settle() { std::this_thread::sleep_for(std::chrono::milliseconds(g_settle_ms)); }

// Sets the OpenMP team size of the calling (main) thread for a round and puts it back (the
// doorway keeps it at 1 on the threads that call oneDNN), then lets the team settle.
class OmpRound {
 public:
  void set(int n) {
    before_ = omp_get_max_threads();
    omp_set_num_threads(n);
  }
  void restore() {
    omp_set_num_threads(before_);
    settle();
  }

 private:
  int before_ = 1;
};

#if XGRAD_BENCH_HAVE_DNNL
// oneDNN's matmul primitive, created once per shape (and block) and reused. Strided memory
// descriptors express the transposed operands; the primitive reads them in place.
struct DnnlMatmul {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  std::string impl;
};
DnnlMatmul make_matmul(const dnnl::engine& eng, const Problem& p, std::size_t M, std::size_t N, const float* A,
                       const float* B, float* C) {
  using dnnl::memory;
  const auto d = [](std::size_t v) { return static_cast<memory::dim>(v); };
  const Shape& s = p.s;
  const memory::desc a_md({d(M), d(s.K)}, memory::data_type::f32,
                          s.ta ? memory::dims{1, d(p.lda)} : memory::dims{d(p.lda), 1});
  const memory::desc b_md({d(s.K), d(N)}, memory::data_type::f32,
                          s.tb ? memory::dims{1, d(p.ldb)} : memory::dims{d(p.ldb), 1});
  const memory::desc c_md({d(M), d(N)}, memory::data_type::f32, memory::dims{d(p.ldc), 1});
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), eng);
  return {dnnl::matmul(pd), memory(a_md, eng, const_cast<float*>(A)), memory(b_md, eng, const_cast<float*>(B)),
          memory(c_md, eng, C), pd.impl_info_str()};
}

// pool == false: one primitive for the whole product on an OpenMP team of `threads`;
// pool == true: the doorway's blocks, one single-threaded primitive each, in xgrad's pool.
class DnnlPrimitive : public Variant {
 public:
  std::string key() const override { return pool_ ? "dnnl-pool" : "dnnl-omp"; }
  DnnlPrimitive(bool pool, int threads) : pool_(pool), threads_(threads), eng_(dnnl::engine::kind::cpu, 0) {}
  std::string name() const override {
    return pool_ ? "oneDNN matmul primitive (pool)"
                 : "oneDNN matmul primitive (OpenMP " + std::to_string(threads_) + " threads)";
  }
  std::string prepare(Problem& p) override {
    mm_.clear();
    streams_.clear();
    blocks_ = pool_ ? pool_blocks(p, std::size_t(threads_)) : std::vector<Block>{{p.s.M, p.s.N, 0, 0, 0}};
    for (const Block& bl : blocks_) {
      mm_.push_back(make_matmul(eng_, p, bl.M, bl.N, p.A() + bl.a_off, p.B() + bl.b_off, p.C() + bl.c_off));
      streams_.emplace_back(eng_);
    }
    return "";
  }
  void enter() override {
    if (pool_)
      wake_pool();
    else
      omp_.set(threads_);
  }
  void leave() override {
    if (!pool_) omp_.restore();
  }
  void run(Problem&) override {
    run_blocks(blocks_, [&](std::size_t i) {
      if (pool_) omp_single_on_this_thread();
      DnnlMatmul& m = mm_[i];
      m.prim.execute(streams_[i], {{DNNL_ARG_SRC, m.a}, {DNNL_ARG_WEIGHTS, m.b}, {DNNL_ARG_DST, m.c}});
      streams_[i].wait();
    });
  }
  std::string detail() const override { return mm_.empty() ? "" : mm_.front().impl; }

 private:
  bool pool_;
  int threads_;
  dnnl::engine eng_;
  std::vector<Block> blocks_;
  std::vector<DnnlMatmul> mm_;
  std::vector<dnnl::stream> streams_;
  OmpRound omp_;
};
#endif

#if XGRAD_BENCH_HAVE_BLIS
// BLIS is loaded with dlopen(RTLD_LOCAL), not linked: it exports cblas_* and sgemm_ as OpenBLAS
// does, and linked into the program it could take over xgrad's own (float64) BLAS calls. Loaded
// locally, only the bli_* functions taken from it here reach it.
struct BlisApi {
  decltype(&bli_init) init = nullptr;
  decltype(&bli_sgemm_ex) sgemm_ex = nullptr;
  decltype(&bli_arch_query_id) arch_query_id = nullptr;
  decltype(&bli_arch_string) arch_string = nullptr;
  decltype(&bli_info_get_version_str) version = nullptr;
};
// The functions, or the reason BLIS cannot be used.
std::string load_blis(BlisApi& api) {
  void* h = dlopen(XGRAD_BENCH_BLIS_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!h) return std::string("dlopen failed: ") + dlerror();
  const auto get = [h](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    return fn != nullptr;
  };
  if (!get(api.init, "bli_init") || !get(api.sgemm_ex, "bli_sgemm_ex") || !get(api.arch_query_id, "bli_arch_query_id") ||
      !get(api.arch_string, "bli_arch_string") || !get(api.version, "bli_info_get_version_str"))
    return std::string("a bli_ function is missing from ") + XGRAD_BENCH_BLIS_PATH;
  api.init();
  return "";
}

// BLIS's typed expert API: strides express row-major storage and the transposes (no copies);
// the thread count per call through a runtime object (the installed BLIS runs on OpenMP).
class Blis : public Variant {
 public:
  std::string key() const override { return pool_ ? "blis-pool" : "blis-omp"; }
  Blis(const BlisApi& api, bool pool, int threads) : api_(api), pool_(pool), threads_(threads) {}
  std::string name() const override {
    return pool_ ? "BLIS (pool)" : "BLIS (OpenMP " + std::to_string(threads_) + " threads)";
  }
  std::string prepare(Problem& p) override {
    blocks_ = pool_ ? pool_blocks(p, std::size_t(threads_)) : std::vector<Block>{{p.s.M, p.s.N, 0, 0, 0}};
    return "";
  }
  void enter() override {
    if (pool_) wake_pool();
  }
  void leave() override {
    if (!pool_) settle();
  }
  void run(Problem& p) override {
    const Shape& s = p.s;
    const auto i = [](std::size_t v) { return static_cast<inc_t>(v); };
    run_blocks(blocks_, [&](std::size_t c) {
      const Block& bl = blocks_[c];
      rntm_t rntm = BLIS_RNTM_INITIALIZER;
      bli_rntm_set_num_threads(pool_ ? 1 : threads_, &rntm);
      float one = 1.0f, zero = 0.0f;
      api_.sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, dim_t(bl.M), dim_t(bl.N), dim_t(s.K), &one,
                   const_cast<float*>(p.A() + bl.a_off), s.ta ? 1 : i(p.lda), s.ta ? i(p.lda) : 1,
                   const_cast<float*>(p.B() + bl.b_off), s.tb ? 1 : i(p.ldb), s.tb ? i(p.ldb) : 1, &zero,
                   p.C() + bl.c_off, i(p.ldc), 1, nullptr, &rntm);
    });
  }
  std::string detail() const override {
    return std::string("sub-configuration ") + api_.arch_string(api_.arch_query_id());
  }

 private:
  const BlisApi& api_;
  bool pool_;
  int threads_;
  std::vector<Block> blocks_;
};
#endif

#if XGRAD_BENCH_HAVE_LIBXSMM
// libxsmm is column-major: row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, so
// B is libxsmm's first operand and the transposes trade places.
//
// libxsmm_xgemm_omp (libxsmmext): the library's own tiled GEMM on an OpenMP team.
class XsmmOmp : public Variant {
 public:
  std::string key() const override { return "xsmm-omp"; }
  explicit XsmmOmp(int threads) : threads_(threads) {}
  std::string name() const override { return "libxsmm_xgemm_omp (OpenMP " + std::to_string(threads_) + " threads)"; }
  std::string prepare(Problem&) override { return ""; }
  void enter() override { omp_.set(threads_); }
  void leave() override { omp_.restore(); }
  void run(Problem& p) override {
    const Shape& s = p.s;
    const char ta = s.tb ? 'T' : 'N', tb = s.ta ? 'T' : 'N';
    const libxsmm_blasint m = libxsmm_blasint(s.N), n = libxsmm_blasint(s.M), k = libxsmm_blasint(s.K);
    const libxsmm_blasint lda = libxsmm_blasint(p.ldb), ldb = libxsmm_blasint(p.lda), ldc = libxsmm_blasint(p.ldc);
    const float one = 1.0f, zero = 0.0f;
    libxsmm_xgemm_omp(LIBXSMM_GEMM_PRECISION_F32, LIBXSMM_GEMM_PRECISION_F32, &ta, &tb, &m, &n, &k, &one, p.B(), &lda,
                      p.A(), &ldb, &zero, p.C(), &ldc);
  }

 private:
  int threads_;
  OmpRound omp_;
};

// libxsmm's JIT kernels (libxsmm_smmdispatch, its small-matrix interface) over xgrad's pool: the
// doorway's blocks, each cut into tiles of C of at most 64 x 64 with the whole K, one JIT kernel
// per tile size, operands read in place.
class XsmmJit : public Variant {
 public:
  void enter() override { wake_pool(); }
  std::string key() const override { return "xsmm-jit"; }
  explicit XsmmJit(int threads) : threads_(threads) {}
  std::string name() const override { return "libxsmm JIT 64x64 tiles (pool)"; }
  std::string prepare(Problem& p) override {
    const Shape& s = p.s;
    blocks_ = pool_blocks(p, std::size_t(threads_));
    kernels_.clear();
    const int flags = (s.tb ? LIBXSMM_GEMM_FLAG_TRANS_A : 0) | (s.ta ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
    // Every tile size a block can have: full tiles and the edges of each block.
    for (const Block& bl : blocks_)
      for (std::size_t tn : {std::min<std::size_t>(kTile, bl.N), bl.N % kTile})
        for (std::size_t tm : {std::min<std::size_t>(kTile, bl.M), bl.M % kTile}) {
          if (tn == 0 || tm == 0 || kernel(tn, tm)) continue;
          const libxsmm_blasint m = libxsmm_blasint(tn), n = libxsmm_blasint(tm), k = libxsmm_blasint(s.K);
          const libxsmm_blasint lda = libxsmm_blasint(p.ldb), ldb = libxsmm_blasint(p.lda),
                                ldc = libxsmm_blasint(p.ldc);
          const float one = 1.0f, zero = 0.0f;
          const libxsmm_smmfunction f = libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &one, &zero, &flags, nullptr);
          if (!f)
            return std::string("no JIT kernel") + (s.tb ? " (libxsmm 1.17 JITs no transposed first operand: A B^T)" : "");
          kernels_.push_back({tn, tm, f});
        }
    return "";
  }
  void run(Problem& p) override {
    const Shape& s = p.s;
    run_blocks(blocks_, [&](std::size_t c) {
      const Block& bl = blocks_[c];
      const float* A = p.A() + bl.a_off;
      const float* B = p.B() + bl.b_off;
      float* C = p.C() + bl.c_off;
      for (std::size_t i = 0; i < bl.M; i += kTile) {
        const std::size_t tm = std::min(kTile, bl.M - i);
        for (std::size_t j = 0; j < bl.N; j += kTile) {
          const std::size_t tn = std::min(kTile, bl.N - j);
          kernel(tn, tm)(s.tb ? B + j * p.ldb : B + j, s.ta ? A + i : A + i * p.lda, C + i * p.ldc + j);
        }
      }
    });
  }
  std::string detail() const override { return std::string("target ") + libxsmm_get_target_arch(); }

 private:
  static constexpr std::size_t kTile = 64;
  struct Kernel {
    std::size_t tn, tm;
    libxsmm_smmfunction f;
  };
  libxsmm_smmfunction kernel(std::size_t tn, std::size_t tm) const {
    for (const Kernel& k : kernels_)
      if (k.tn == tn && k.tm == tm) return k.f;
    return nullptr;
  }
  int threads_;
  std::vector<Block> blocks_;
  std::vector<Kernel> kernels_;
};
#endif

struct Flags {
  int threads = 2;
  std::size_t rounds = 5, reps = 3;
  double sample_ms = 2.0;
  std::string only;  // run only the shapes whose name contains this
  int settle_ms = 20;
  int pool_wake = 1;
  std::vector<std::string> variants;  // keys; empty: all
};

double max_rel_diff(const std::vector<float>& c, const std::vector<float>& ref) {
  double scale = 0, diff = 0;
  for (float r : ref) scale = std::max(scale, double(std::fabs(r)));
  for (std::size_t i = 0; i < c.size(); ++i) {
    const double d = std::fabs(double(c[i]) - double(ref[i]));
    if (!(d <= diff)) diff = d;  // NaN propagates
  }
  return scale > 0 ? diff / scale : diff;
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Where the BLAS symbols the doorway calls come from: with BLIS in the same process (it exports
// cblas_* and sgemm_ too), they must still be OpenBLAS's.
std::string symbol_library(const char* symbol) {
  void* addr = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (!addr || !dladdr(addr, &info) || !info.dli_fname) return "(not found)";
  return info.dli_fname;
}

void run(const Flags& f) {
  xg::set_num_threads(f.threads);
  g_settle_ms = f.settle_ms;
  g_pool_wake = f.pool_wake != 0;
  const bench::RunThreads pool = bench::xgrad_pool();
  // The doorway first, so XGRAD_ISA fixes oneDNN's ISA before any primitive is made.
  {
    std::vector<float> a(64 * 64, 1.0f), c(64 * 64);
    xg::blas::gemm(false, false, 64, 64, 64, 1.0f, a.data(), 64, a.data(), 64, 0.0f, c.data(), 64);
  }
  const std::string isa = xg::blas::sgemm_isa() == "avx2" ? "avx2" : "";
  bench::print_line("bench_gemm_options: float32 C = op(A) op(B), threads " + std::to_string(f.threads) + ", rounds " +
                    std::to_string(f.rounds) + " x " + std::to_string(f.reps) + " samples of ~" +
                    bench::fmt(f.sample_ms, 1) + " ms per variant and shape, medians; " +
                    std::to_string(f.settle_ms) + " ms pause after a round on OpenMP threads, 100 ms after OpenBLAS's" +
                    (f.pool_wake ? "; pool woken before each round in it" : "; pool not woken (--pool-wake 0)"));
  bench::print_line("CPU: " + xg::blas::cpu_isa() + ", ISA ceiling: " + xg::blas::isa_ceiling() +
                    ", doorway float32 kernels: " + xg::float32_gemm_kernels());
  bench::print_library_lines();

  std::vector<std::unique_ptr<Variant>> variants;
  variants.push_back(std::make_unique<Doorway>());
  variants.push_back(std::make_unique<OpenBlasPool>());
  variants.push_back(std::make_unique<OpenBlasOwn>(f.threads));
#if XGRAD_BENCH_HAVE_DNNL
  variants.push_back(std::make_unique<DnnlPrimitive>(false, f.threads));
  variants.push_back(std::make_unique<DnnlPrimitive>(true, f.threads));
  bench::print_line("oneDNN " + std::to_string(dnnl_version()->major) + "." + std::to_string(dnnl_version()->minor) +
                    "." + std::to_string(dnnl_version()->patch) + " (matmul primitive)");
#else
  bench::print_line("oneDNN's matmul primitive: skipped (xgrad built without oneDNN)");
#endif
#if XGRAD_BENCH_HAVE_BLIS
  static BlisApi blis;
  const std::string blis_error = load_blis(blis);
  if (blis_error.empty()) {
    variants.push_back(std::make_unique<Blis>(blis, false, f.threads));
    variants.push_back(std::make_unique<Blis>(blis, true, f.threads));
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(blis.sgemm_ex), &info);
    bench::print_line(std::string("BLIS ") + blis.version() + " (" + (info.dli_fname ? info.dli_fname : "?") +
                      "), sub-configuration for this CPU: " + blis.arch_string(blis.arch_query_id()));
  } else {
    bench::print_line("BLIS: skipped (" + blis_error + ")");
  }
#else
  bench::print_line("BLIS: skipped (not found at build time)");
#endif
#if XGRAD_BENCH_HAVE_LIBXSMM
  libxsmm_init();
  if (isa == "avx2") libxsmm_set_target_arch("hsw");
  variants.push_back(std::make_unique<XsmmOmp>(f.threads));
  variants.push_back(std::make_unique<XsmmJit>(f.threads));
  bench::print_line(std::string("libxsmm ") + LIBXSMM_VERSION + ", target " + libxsmm_get_target_arch());
#else
  bench::print_line("libxsmm: skipped (not found at build time)");
#endif

  if (!f.variants.empty()) {  // the doorway stays: it is the reference
    std::vector<std::unique_ptr<Variant>> kept;
    for (auto& v : variants)
      if (v->key() == "doorway" || std::find(f.variants.begin(), f.variants.end(), v->key()) != f.variants.end())
        kept.push_back(std::move(v));
    variants = std::move(kept);
  }
  // After loading the other libraries: xgrad's own BLAS calls must still reach OpenBLAS.
  for (const char* sym : {"cblas_sgemm", "cblas_dgemm", "sgemm_"}) {
    const std::string lib = symbol_library(sym);
    bench::print_line(std::string(sym) + " resolves to " + lib);
    if (lib.find("openblas") == std::string::npos)
      throw std::runtime_error(std::string(sym) + " resolves to " + lib + ", not OpenBLAS: another library took it over");
  }
  const bench::Peak peak_before = bench::measure_peak(f.threads, 0.05, pool, isa);
  std::mt19937 rng(0);
  struct Row {
    Shape s;
    std::vector<double> gflops;  // per variant; NaN: not run
    std::vector<double> diff;
    std::vector<std::string> note;
  };
  std::vector<Row> rows;
  std::vector<std::string> mismatches;
  std::vector<double> shape_peaks;
  for (const Shape& s : training_shapes()) {
    if (!f.only.empty() && s.name.find(f.only) == std::string::npos) continue;
    // The peak now, briefly: a shape measured while something else held a core shows here.
    shape_peaks.push_back(bench::measure_peak(f.threads, 0.01, pool, isa).fp32_gflops);
    Problem p = make_problem(s, rng);
    variants[0]->run(p);
    const std::vector<float> ref = p.c;
    Row row{s, {}, {}, {}};
    std::vector<bool> ok;
    for (auto& v : variants) {
      v->enter();  // oneDNN plans a primitive for the thread count at its creation
      const std::string why = v->prepare(p);
      v->leave();
      ok.push_back(why.empty());
      row.note.push_back(why.empty() ? v->detail() : why);
      double d = std::numeric_limits<double>::quiet_NaN();
      if (why.empty()) {
        std::fill(p.c.begin(), p.c.end(), std::numeric_limits<float>::quiet_NaN());
        v->enter();
        v->run(p);
        v->leave();
        d = max_rel_diff(p.c, ref);
        if (!(d <= 1e-4)) mismatches.push_back(v->name() + " on " + s.name + " (" + dims(s) + "): " + bench::fmt(d, 8));
      }
      row.diff.push_back(d);
    }
    // Calls per sample from the doorway's time.
    double t = 1e30;
    for (int i = 0; i < 3; ++i) t = std::min(t, seconds_of([&] { variants[0]->run(p); }));
    const std::size_t calls = std::max<std::size_t>(1, std::size_t(f.sample_ms * 1e-3 / t + 0.5));
    std::vector<std::vector<double>> per_call_s(variants.size());
    for (std::size_t r = 0; r < f.rounds; ++r)
      for (std::size_t j = 0; j < variants.size(); ++j) {
        const std::size_t vi = (j + r) % variants.size();
        if (!ok[vi]) continue;
        Variant& v = *variants[vi];
        v.enter();
        for (std::size_t rep = 0; rep < 1 + f.reps; ++rep) {  // the first sample is a warmup
          const double sec = seconds_of([&] {
            for (std::size_t c = 0; c < calls; ++c) v.run(p);
          });
          if (rep > 0) per_call_s[vi].push_back(sec / double(calls));
        }
        v.leave();
      }
    for (std::size_t vi = 0; vi < variants.size(); ++vi)
      row.gflops.push_back(ok[vi] ? p.flop() * 1e-9 / bench::summarize(per_call_s[vi]).median
                                  : std::numeric_limits<double>::quiet_NaN());
    std::string line = s.name + " [" + dims(s) + "], " + std::to_string(calls) + " calls per sample, peak before it " +
                       bench::fmt(shape_peaks.back(), 1) + " GFLOP/s:";
    for (std::size_t vi = 0; vi < variants.size(); ++vi)
      line += "\n  " + variants[vi]->name() + ": " +
              (ok[vi] ? bench::fmt(row.gflops[vi], 1) + " GFLOP/s, max rel diff " + bench::fmt(row.diff[vi], 8)
                      : std::string("n/a")) +
              (row.note[vi].empty() ? "" : " [" + row.note[vi] + "]");
    bench::print_line(line);
    rows.push_back(std::move(row));
  }
  const bench::Peak peak_after = bench::measure_peak(f.threads, 0.05, pool, isa);
  const double peak = std::max(peak_before.fp32_gflops, peak_after.fp32_gflops);
  bench::print_line("peak (fp32 FMA, " + peak_before.isa + ", " + std::to_string(f.threads) +
                    " threads, measured before and after): " + bench::fmt(peak_before.fp32_gflops, 1) + " and " +
                    bench::fmt(peak_after.fp32_gflops, 1) + " GFLOP/s; shares below are of the higher, " +
                    bench::fmt(peak, 1));
  if (!shape_peaks.empty()) {
    const auto mm = std::minmax_element(shape_peaks.begin(), shape_peaks.end());
    bench::print_line("peak measured briefly before each shape: min " + bench::fmt(*mm.first, 1) + ", max " +
                      bench::fmt(*mm.second, 1) + " GFLOP/s" +
                      (*mm.first < 0.8 * peak ? " (below 80% of the peak: something else ran on these cores; "
                                                "repeat the run on a quiet machine)"
                                              : ""));
  }

  // The table (Markdown): median GFLOP/s and % of peak per shape and variant.
  std::string head = "| product | M x K x N op | peak before it |", rule = "|---|---|---|";
  for (auto& v : variants) {
    head += " " + v->name() + " |";
    rule += "---|";
  }
  bench::print_line(head);
  bench::print_line(rule);
  double log_sum = 0;
  for (std::size_t ri = 0; ri < rows.size(); ++ri) {
    const Row& r = rows[ri];
    std::string line = "| " + r.s.name + " | " + dims(r.s) + " | " + bench::fmt(shape_peaks[ri], 0) + " |";
    for (std::size_t vi = 0; vi < variants.size(); ++vi)
      line += std::isnan(r.gflops[vi]) ? " n/a |"
                                       : " " + bench::fmt(r.gflops[vi], 0) + " (" +
                                             bench::fmt(100.0 * r.gflops[vi] / peak, 0) + "%) |";
    bench::print_line(line);
    log_sum += std::log(r.gflops[0]);
  }
  if (!mismatches.empty()) {
    std::string all;
    for (const std::string& m : mismatches) all += (all.empty() ? "" : "; ") + m;
    throw std::runtime_error("results differ from the doorway's by more than 1e-4: " + all);
  }
  bench::print_line("all results within 1e-4 (relative to the largest |C|) of the doorway's");
  bench::print_result("doorway_geomean_gflops", rows.empty() ? 0.0 : std::exp(log_sum / double(rows.size())),
                      "GFLOP/s");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  return bench::run_program(
      "bench_gemm_options",
      "float32 GEMM: xgrad's doorway beside OpenBLAS, oneDNN's matmul primitive, BLIS and libxsmm on training's "
      "shapes",
      argc, argv,
      [&f](CLI::App& app) {
        app.add_option("--threads", f.threads, "threads (each library's own, or xgrad's pool)")
            ->check(CLI::Range(1, 256))
            ->capture_default_str();
        app.add_option("--rounds", f.rounds, "interleaved rounds per shape")
            ->check(CLI::Range(std::size_t{1}, std::size_t{1000}))
            ->capture_default_str();
        app.add_option("--reps", f.reps, "timed samples per variant and round (after one warmup sample)")
            ->check(CLI::Range(std::size_t{1}, std::size_t{1000}))
            ->capture_default_str();
        app.add_option("--sample-ms", f.sample_ms, "length of a sample: calls per sample from the doorway's time")
            ->check(CLI::Range(0.01, 10000.0))
            ->capture_default_str();
        app.add_option("--variants", f.variants,
                       "only these besides the doorway: openblas-pool openblas-own dnnl-omp dnnl-pool blis-omp "
                       "blis-pool xsmm-omp xsmm-jit (default: all built in)")
            ->delimiter(',')
            ->check(CLI::IsMember({"openblas-pool", "openblas-own", "dnnl-omp", "dnnl-pool", "blis-omp", "blis-pool",
                                   "xsmm-omp", "xsmm-jit"}));
        app.add_option("--settle-ms", f.settle_ms,
                       "pause after each round of a variant on OpenMP threads (their idle threads spin)")
            ->check(CLI::Range(0, 10000))
            ->capture_default_str();
        app.add_option("--pool-wake", f.pool_wake, "1: wake xgrad's pool threads before each round in the pool")
            ->check(CLI::Range(0, 1))
            ->capture_default_str();
        app.add_option("--only", f.only, "only the products whose name contains this (e.g. square, M, tile)");
      },
      [&f] { run(f); });
}
