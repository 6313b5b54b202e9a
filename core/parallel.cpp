#include <xgrad/core/parallel.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
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
  explicit Pool(int threads) {
    for (int w = 1; w < threads; ++w) workers_.emplace_back([this, w] { work(static_cast<std::size_t>(w)); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      gen_.fetch_add(1);
    }
    cv_work_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // false if the pool is busy (another user thread holds it): the caller runs serially.
  bool try_run(std::size_t chunks, const std::function<void(std::size_t)>& job) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    errors_.assign(chunks, nullptr);
    job_ = &job;
    chunks_ = chunks;
    remaining_.store(workers_.size(), std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lk(m_);
      gen_.fetch_add(1, std::memory_order_release);
    }
    cv_work_.notify_all();
    run_one(0);
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
  void run_one(std::size_t c) {
    if (c >= chunks_) return;
    tl_in_pool = true;
    try {
      (*job_)(c);
    } catch (...) {
      errors_[c] = std::current_exception();
    }
    tl_in_pool = false;
  }

  void work(std::size_t id) {
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
      if (stop_) return;
      run_one(id);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lk(m_);
        cv_done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex m_;
  std::condition_variable cv_work_, cv_done_;
  std::atomic<std::uint64_t> gen_{0};
  std::atomic<std::size_t> remaining_{0};
  const std::function<void(std::size_t)>* job_ = nullptr;
  std::size_t chunks_ = 0;
  std::vector<std::exception_ptr> errors_;
  bool stop_ = false;
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

std::size_t parallel_chunks(std::size_t n, std::size_t grain) {
  if (grain == 0 || n < 2 * grain) return 1;  // before touching the pool: tiny ops stay cheap
  const std::size_t nt = static_cast<std::size_t>(pool_threads());
  if (nt <= 1 || grain == 0 || n < 2 * grain) return 1;
  return std::min(nt, n / grain);
}

void run_chunks(std::size_t chunks, const std::function<void(std::size_t)>& job) {
  if (chunks > 1 && !tl_in_pool) {
    const auto p = pool();
    if (chunks <= static_cast<std::size_t>(p->threads()) && p->try_run(chunks, job)) return;
  }
  for (std::size_t c = 0; c < chunks; ++c) job(c);  // serial fallback, same partition
}

}  // namespace xg::detail
