/// \file
/// Internal: the caching allocator behind every Array's storage (xtensor's default allocator
/// in core/detail/xt.hpp). A training step frees and allocates the same large blocks every step;
/// glibc serves those by fresh mmap and returns them on free, so each step page-faulted its
/// whole working set in again. Blocks of 64 KiB and more are kept on free in size classes
/// (eight per power of two: at most 12.5% rounding) and handed out again, so a steady-state
/// step touches no new pages. Smaller blocks go to malloc, which keeps them in its heap anyway.
/// Blocks of 2 MiB and more are mapped on their own at a 2 MiB boundary and advised as huge
/// pages (core/runtime.hpp: set_huge_pages; core/allocator.cpp), the others come from malloc.
///
/// The cache is bounded (core/runtime.hpp: set_memory_cache_limit, default a quarter of
/// physical memory); a block that would exceed the bound is returned to the system, and an
/// allocation that fails releases the cache and tries once more before throwing bad_alloc.
/// Builds with AddressSanitizer cache nothing by default, so ASan sees every free.
#pragma once

#include <cstddef>
#include <new>

namespace xg::detail {

void* cached_alloc(std::size_t bytes);
void cached_free(void* p, std::size_t bytes) noexcept;

template <class T> struct CachingAllocator {
  using value_type = T;
  CachingAllocator() noexcept = default;
  template <class U> CachingAllocator(const CachingAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(cached_alloc(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { cached_free(p, n * sizeof(T)); }
  template <class U> struct rebind { using other = CachingAllocator<U>; };
};
template <class T, class U> bool operator==(const CachingAllocator<T>&, const CachingAllocator<U>&) { return true; }
template <class T, class U> bool operator!=(const CachingAllocator<T>&, const CachingAllocator<U>&) { return false; }

}  // namespace xg::detail

namespace xg::detail {

// Small fixed-size blocks (the shared state of an Array's Storage and of a Tensor, with
// their reference counts): each thread keeps the blocks it frees on a list per block size and
// hands them out again. A tape's values are freed all at once when backward consumes it;
// glibc puts that many blocks of this size on its slow unsorted-bin path, and taking them
// back is about a third of an op's overhead. A list holds at most kPoolBlocks blocks (more
// go back to the heap); a block freed on another thread than the one that made it joins that
// thread's list, and a thread's list is freed when the thread ends. Under AddressSanitizer
// nothing is kept, so ASan sees every free.
constexpr std::size_t kPoolBlocks = 16384;
void* pool_alloc(std::size_t bytes);
void pool_free(void* p, std::size_t bytes) noexcept;

template <class T> struct PoolAllocator {
  using value_type = T;
  PoolAllocator() noexcept = default;
  template <class U> PoolAllocator(const PoolAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n != 1) return static_cast<T*>(::operator new(n * sizeof(T)));
    return static_cast<T*>(pool_alloc(sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n != 1) return ::operator delete(p);
    pool_free(p, sizeof(T));
  }
  template <class U> struct rebind { using other = PoolAllocator<U>; };
};
template <class T, class U> bool operator==(const PoolAllocator<T>&, const PoolAllocator<U>&) { return true; }
template <class T, class U> bool operator!=(const PoolAllocator<T>&, const PoolAllocator<U>&) { return false; }

}  // namespace xg::detail
