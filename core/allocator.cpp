#include <xgrad/core/allocator.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/detail/sanitizer.hpp>

namespace xg {

namespace {

constexpr std::size_t kAlign = 64;            // cache line; AVX2 needs 32
constexpr std::size_t kMinCached = 64 << 10;  // smaller blocks: plain malloc
constexpr std::size_t kHuge = 2 << 20;        // x86-64's huge page; blocks of a class this big are mapped
constexpr std::size_t kPage = 4096;

// Huge pages for large blocks (runtime.hpp, set_huge_pages): -1 until first read, then 0 or 1.
std::atomic<int> g_huge{-1};
// XGRAD_HUGE_PAGES read at the first use: on (unset, empty, "on" or "1") or off ("off", "0");
// anything else is a ValueError, every time it is read, until set_huge_pages decides.
bool huge_on() {
  int v = g_huge.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("XGRAD_HUGE_PAGES");
    const std::string text = e ? e : "";
    if (text.empty() || text == "on" || text == "1")
      v = 1;
    else if (text == "off" || text == "0")
      v = 0;
    else
      throw ValueError(op_message("XGRAD_HUGE_PAGES", "unknown value '" + text + "' (on, off, 1 or 0)"));
    int expected = -1;
    if (!g_huge.compare_exchange_strong(expected, v)) v = expected;
  }
  return v == 1;
}

struct Cache {
  std::mutex m;
  std::unordered_map<std::size_t, std::vector<void*>> free_blocks;  // class bytes -> blocks
  std::size_t cached = 0;  // bytes held in free_blocks
  std::size_t limit = 0;   // 0 until first use: a quarter of physical memory
  std::size_t in_use = 0, peak = 0;

  std::size_t cap() {
#if XG_UNDER_ASAN
    // Under AddressSanitizer every block goes back to it, so a use after free is caught.
    if (limit == 0) limit = 1;
#endif
    if (limit == 0) {
      const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
      limit = (pages > 0 && page > 0) ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) / 4
                                      : std::size_t(1) << 30;
    }
    return limit;
  }
  void release_all();
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: arrays may be freed during static destruction
  return *c;
}

// Size class: 8 classes per power of two, rounded to the alignment.
std::size_t size_class(std::size_t bytes) {
  std::size_t top = 1;
  while ((top << 1) <= bytes) top <<= 1;
  const std::size_t step = std::max<std::size_t>(top / 8, kAlign);
  return (bytes + step - 1) / step * step;
}

// Blocks of a class of 2 MiB and more are mapped on their own, starting on a 2 MiB boundary,
// and marked MADV_HUGEPAGE before their first touch when huge pages are on. A matrix-vector
// product streams its matrix once (a decoding step reads every weight): with 4 KiB pages the
// hardware prefetcher stops at every page boundary and every page costs a TLB miss; a 2 MiB
// page removes both (docs/performance.md, "Huge pages"). Only whole 2 MiB extents inside the
// mapping become huge pages, so a block costs no more memory than its 4 KiB pages would.
// Under AddressSanitizer blocks stay malloc's, whose bounds ASan checks.
bool mapped(std::size_t cls) {
#if XG_UNDER_ASAN
  (void)cls;
  return false;
#else
  return cls >= kHuge;
#endif
}
std::size_t map_length(std::size_t cls) { return (cls + kPage - 1) / kPage * kPage; }

void* map_block(std::size_t cls) {
  const bool advise = huge_on();  // before mapping: a bad XGRAD_HUGE_PAGES throws here
  const std::size_t len = map_length(cls);
  void* m = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto lo = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t start = (lo + kHuge - 1) / kHuge * kHuge;
  if (start > lo) munmap(m, start - lo);
  const std::uintptr_t end = start + len, map_end = lo + len + kHuge;
  if (map_end > end) munmap(reinterpret_cast<void*>(end), map_end - end);
  void* p = reinterpret_cast<void*>(start);
  if (advise) madvise(p, len, MADV_HUGEPAGE);  // advice only: without THP the block keeps 4 KiB pages
  return p;
}

void* raw_alloc(std::size_t bytes) {
  if (mapped(bytes)) return map_block(bytes);
  const std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  return std::aligned_alloc(kAlign, rounded ? rounded : kAlign);
}
void raw_free(void* p, std::size_t cls) noexcept {
  if (mapped(cls))
    munmap(p, map_length(cls));
  else
    std::free(p);
}

void Cache::release_all() {
  for (auto& [bytes, v] : free_blocks)
    for (void* p : v) raw_free(p, bytes);
  free_blocks.clear();
  cached = 0;
}

// Small blocks: malloc's own blocks, aligned as the large ones. The alignment is part of the
// result: xtensor's SIMD assignment (xsimd) runs the elements before the first aligned address
// through the scalar function and the rest through the vector one (tanh, exp: results that
// differ in the last place), so an array at another address mod 64 could round otherwise.
void* small_alloc(std::size_t bytes) { return raw_alloc(bytes); }

}  // namespace

namespace detail {

void* cached_alloc(std::size_t bytes) {
  if (bytes < kMinCached) {
    void* p = small_alloc(bytes);
    if (!p) throw std::bad_alloc();
    return p;
  }
  const std::size_t cls = size_class(bytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lk(c.m);
    auto it = c.free_blocks.find(cls);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c.cached -= cls;
      c.in_use += cls;
      c.peak = std::max(c.peak, c.in_use);
      return p;
    }
  }
  void* p = raw_alloc(cls);
  if (!p) {  // out of memory: give the cache back and try once more
    std::lock_guard<std::mutex> lk(c.m);
    c.release_all();
    p = raw_alloc(cls);
    if (!p) throw std::bad_alloc();
  }
  std::lock_guard<std::mutex> lk(c.m);
  c.in_use += cls;
  c.peak = std::max(c.peak, c.in_use);
  return p;
}

void cached_free(void* p, std::size_t bytes) noexcept {
  if (!p) return;
  if (bytes < kMinCached) {
    std::free(p);
    return;
  }
  const std::size_t cls = size_class(bytes);
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.m);
  c.in_use -= std::min(c.in_use, cls);
  if (c.cached + cls > c.cap()) {
    raw_free(p, cls);
    return;
  }
  try {
    c.free_blocks[cls].push_back(p);
    c.cached += cls;
  } catch (...) {
    raw_free(p, cls);
  }
}

}  // namespace detail

namespace detail {

namespace {

// The pool of small blocks (allocator.hpp). The state is plain data (constant-initialised,
// never destroyed), so a block freed while this thread's other thread_local objects are being
// destroyed is still handled: PoolGuard, made at the first use, frees the lists at thread exit
// and marks the pool dead; after that every block goes straight to the heap.
struct PoolList {
  std::size_t bytes;
  void* head;
  std::size_t count;
};
constexpr int kPoolLists = 4;  // block sizes kept per thread (xgrad uses two)
struct PoolState {
  PoolList lists[kPoolLists];
  bool armed;
  bool dead;
};
thread_local PoolState tl_pool{};

void free_pool_lists() noexcept {
  for (PoolList& l : tl_pool.lists)
    while (l.head) {
      void* next = *static_cast<void**>(l.head);
      ::operator delete(l.head);
      l.head = next;
      --l.count;
    }
}

struct PoolGuard {
  ~PoolGuard() {
    tl_pool.dead = true;
    free_pool_lists();
  }
};

[[maybe_unused]] PoolList* pool_list(std::size_t bytes) noexcept {
  for (PoolList& l : tl_pool.lists) {
    if (l.bytes == bytes) return &l;
    if (l.bytes == 0) {
      l.bytes = bytes;
      return &l;
    }
  }
  return nullptr;
}

}  // namespace

void* pool_alloc(std::size_t bytes) {
#if !XG_UNDER_ASAN
  if (!tl_pool.dead)
    if (PoolList* l = pool_list(bytes); l && l->head) {
      void* p = l->head;
      l->head = *static_cast<void**>(p);
      --l->count;
      if (l->head) __builtin_prefetch(l->head, 1);  // the next pop reads its link (often out of cache)
      return p;
    }
#endif
  return ::operator new(bytes < sizeof(void*) ? sizeof(void*) : bytes);
}

void pool_free(void* p, std::size_t bytes) noexcept {
#if !XG_UNDER_ASAN
  if (!tl_pool.dead) {
    if (!tl_pool.armed) {
      tl_pool.armed = true;
      static thread_local PoolGuard guard;  // frees the lists when this thread ends
      (void)guard;
    }
    PoolList* l = pool_list(bytes);
    if (l && l->count < kPoolBlocks) {
      *static_cast<void**>(p) = l->head;
      l->head = p;
      ++l->count;
      return;
    }
  }
#else
  (void)bytes;
#endif
  ::operator delete(p);
}

}  // namespace detail

void set_memory_cache_limit(std::size_t bytes) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.m);
  c.limit = bytes ? bytes : 1;  // 1: cache nothing (every large block fits no more)
  if (c.cached > c.limit) c.release_all();
}

void set_huge_pages(bool on) { g_huge.store(on ? 1 : 0, std::memory_order_relaxed); }

bool huge_pages() { return huge_on(); }

void release_cached_memory() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.m);
  c.release_all();
}

MemoryStats memory_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lk(c.m);
  return {c.in_use, c.peak, c.cached, c.cap()};
}

}  // namespace xg
