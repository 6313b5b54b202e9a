#include <xgrad/core/parallel.hpp>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define XG_PAUSE() _mm_pause()
#else
#define XG_PAUSE() std::this_thread::yield()
#endif

namespace xg::detail {

namespace {

constexpr auto kSpin = std::chrono::microseconds(50);  // busy-wait before sleeping

thread_local bool tl_in_pool = false;  // inside a chunk: nested parallel_for runs serially

class Pool {
 public:
  explicit Pool(int threads) : ranges_(static_cast<std::size_t>(threads)) {
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { work(static_cast<std::size_t>(w)); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_.store(true, std::memory_order_release);
      gen_.store(gen_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }
    cv_work_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // false if the pool is busy (another user thread holds it): the caller runs serially.
  //
  // The chunks are cut into one contiguous range per thread: the caller owns the first (never
  // empty: chunk 0 runs on the caller, always first), worker w the (w + 1)-th. Each thread runs
  // its own range from the front, then takes chunks not yet started from the back of the others'
  // ranges (chunk 0 is never taken). So with the same partition from one job to the next, a
  // thread meets the data it wrote itself in the job before (both halves of a product and the
  // elementwise pass after it), and a worker that is slow to start (asleep after kSpin idle, or
  // descheduled on a busy host) or slow to finish never makes the caller wait for work it could
  // do itself. Which thread runs a chunk does not change what the chunk computes (the partition
  // depends only on n, grain and the thread count): results stay bit-identical run to run.
  bool try_run(std::size_t chunks, const std::function<void(std::size_t)>& job) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock() || chunks > kIndexMask) return false;
    errors_.assign(chunks, nullptr);
    job_ = &job;
    remaining_.store(chunks, std::memory_order_relaxed);
    const std::uint64_t gen = (gen_.load(std::memory_order_relaxed) + 1) & kGenMask;  // wraps
    const std::size_t nt = ranges_.size();
    // Range r is [bound(r), bound(r + 1)), range 0 [0, bound(1)): the caller's, never empty. Its
    // chunk 0 the caller runs itself first, so its word starts at 1.
    const auto bound = [&](std::size_t r) { return std::max<std::size_t>(1, chunks * r / nt); };  // r >= 1
    for (std::size_t r = 0; r < nt; ++r)
      ranges_[r].word.store(pack(gen, r == 0 ? 1 : bound(r), bound(r + 1)), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(m_);
      gen_.store(gen, std::memory_order_release);  // publishes the ranges (stored before it)
    }
    cv_work_.notify_all();
    run_one(0);
    remaining_.fetch_sub(1, std::memory_order_acq_rel);
    run_all(gen, 0);
    const auto until = std::chrono::steady_clock::now() + kSpin;
    for (unsigned k = 0; remaining_.load(std::memory_order_acquire) != 0; ++k) {
      XG_PAUSE();
      if ((k & 63) == 0 && std::chrono::steady_clock::now() > until) {
        std::unique_lock<std::mutex> lk(m_);
        cv_done_.wait(lk, [&] { return remaining_.load(std::memory_order_acquire) == 0; });
        break;
      }
    }
    job_ = nullptr;
    for (auto& e : errors_)
      if (e) std::rethrow_exception(e);
    return true;
  }

 private:
  static constexpr unsigned kIndexBits = 16, kGenShift = 32;
  static constexpr std::uint64_t kIndexMask = (std::uint64_t{1} << kIndexBits) - 1;
  static constexpr std::uint64_t kGenMask = 0xffffffffu;

  // A range's word: generation << 32 | next chunk (front) << 16 | end (back, exclusive). A claim
  // is valid only for the job it read, so a worker late for one job never takes a chunk of the
  // next, and never reads job_ of a job that has ended.
  static std::uint64_t pack(std::uint64_t gen, std::size_t lo, std::size_t hi) {
    return (gen << kGenShift) | (std::uint64_t{lo} << kIndexBits) | std::uint64_t{hi};
  }
  struct alignas(64) Range {  // one cache line each: the owner's claims do not slow the others'
    std::atomic<std::uint64_t> word{0};
  };

  // Claims a chunk of range r for job `gen`: the front one (the owner) or the back one (a thief).
  bool claim(std::uint64_t gen, std::size_t r, bool front, std::size_t& c) {
    std::atomic<std::uint64_t>& w = ranges_[r].word;
    std::uint64_t s = w.load(std::memory_order_acquire);
    for (;;) {
      if ((s >> kGenShift) != gen) return false;
      const std::size_t lo = static_cast<std::size_t>((s >> kIndexBits) & kIndexMask);
      const std::size_t hi = static_cast<std::size_t>(s & kIndexMask);
      if (lo >= hi) return false;
      c = front ? lo : hi - 1;
      const std::uint64_t next = front ? pack(gen, lo + 1, hi) : pack(gen, lo, hi - 1);
      if (w.compare_exchange_weak(s, next, std::memory_order_acq_rel, std::memory_order_acquire)) return true;
    }
  }

  // Thread `self` runs its own range, then the chunks left at the back of the others'.
  void run_all(std::uint64_t gen, std::size_t self) {
    const std::size_t nt = ranges_.size();
    for (std::size_t k = 0; k < nt; ++k) {
      const std::size_t r = (self + k) % nt;
      for (std::size_t c; claim(gen, r, k == 0, c);) {
        run_one(c);
        if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1 && self != 0) {  // the last: wake a sleeping caller
          std::lock_guard<std::mutex> lk(m_);
          cv_done_.notify_one();
        }
      }
    }
  }

  // A worker takes no asynchronous signal (SIGINT, SIGTERM, ...): the kernel delivers a signal for
  // the process to a thread that does not block it, and a handler run here could interrupt
  // oneDNN's float32 GEMM kernel, which points the stack pointer at a heap workspace while it runs
  // (oneDNN 2.6: whenever K > 84); the signal frame pushed below it then overwrites the heap.
  // Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP) stay deliverable.
  static void block_async_signals() {
    sigset_t s;
    sigfillset(&s);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&s, sig);
    pthread_sigmask(SIG_BLOCK, &s, nullptr);
  }

  void run_one(std::size_t c) {
    tl_in_pool = true;
    try {
      (*job_)(c);
    } catch (...) {
      errors_[c] = std::current_exception();
    }
    tl_in_pool = false;
  }

  void work(std::size_t self) {
    block_async_signals();
    std::uint64_t seen = 0;
    for (;;) {
      std::uint64_t g = gen_.load(std::memory_order_acquire);
      const auto until = std::chrono::steady_clock::now() + kSpin;
      for (unsigned k = 0; g == seen; ++k) {
        XG_PAUSE();
        g = gen_.load(std::memory_order_acquire);
        if (g == seen && (k & 63) == 0 && std::chrono::steady_clock::now() > until) {
          std::unique_lock<std::mutex> lk(m_);
          cv_work_.wait(lk, [&] { return gen_.load(std::memory_order_acquire) != seen; });
          g = gen_.load(std::memory_order_acquire);
        }
      }
      seen = g;
      if (stop_.load(std::memory_order_acquire)) return;
      run_all(g, self);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex m_;
  std::condition_variable cv_work_, cv_done_;
  std::atomic<std::uint64_t> gen_{0};  // the current job's generation (workers wait for it to change)
  std::vector<Range> ranges_;          // one per thread: the chunks of the current job it owns
  std::atomic<std::size_t> remaining_{0};  // chunks not yet finished
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  std::atomic<bool> stop_{false};
};

std::mutex g_pool_mutex;
std::shared_ptr<Pool> g_pool;
int g_threads = 0;  // 0: not set, one per core

std::shared_ptr<Pool> pool() {
  std::lock_guard<std::mutex> lk(g_pool_mutex);
  if (!g_pool) {
    int n = g_threads;
    if (n <= 0) n = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    g_pool = std::make_shared<Pool>(n);
  }
  return g_pool;
}

}  // namespace

void set_pool_threads(int n) {
  std::lock_guard<std::mutex> lk(g_pool_mutex);
  g_threads = n;
  g_pool.reset();  // rebuilt on next use (a running job keeps its own reference)
}

int configured_pool_threads() { return pool()->threads(); }

int pool_threads() { return tl_in_pool ? 1 : pool()->threads(); }

bool in_parallel_region() { return tl_in_pool; }

std::size_t parallel_chunks(std::size_t n, std::size_t grain, std::size_t per_thread) {
  if (grain == 0 || n < 2 * grain) return 1;  // before touching the pool: tiny ops stay cheap
  const std::size_t nt = static_cast<std::size_t>(pool_threads());
  if (nt <= 1) return 1;
  return std::min(std::max<std::size_t>(per_thread, 1) * nt, n / grain);
}

void run_chunks(std::size_t chunks, const std::function<void(std::size_t)>& job) {
  if (chunks > 1 && !tl_in_pool) {
    const auto p = pool();
    if (p->threads() > 1 && p->try_run(chunks, job)) return;
  }
  for (std::size_t c = 0; c < chunks; ++c) job(c);  // serial fallback, same partition
}

}  // namespace xg::detail
