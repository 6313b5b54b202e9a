// Internal: std::vector whose data() starts on a cache line (64 bytes), for the scratch buffers
// that vector kernels read and write a row at a time (the fused attention's tiles and panels,
// nn/flash_attention.cpp; the GEMM doorway's partial sums, core/blas.cpp; the float64 kernel's
// packed operands, core/detail/dgemm.inc). std::vector<float> has malloc's 16-byte alignment; a
// block above malloc's mmap threshold starts 16 bytes past a page, so every 64-byte AVX-512 load
// or store of a row crossed two cache lines. On the Xeon model 167 a 12 x 64 x 64 tile product
// on such buffers ran at 70% of one thread's FMA peak, and at 80% on aligned ones
// (bench/NOTES.md, "Xeon model 167: scratch on cache lines").
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace xg::detail {

template <class T> struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::size_t kAlign = 64;
  CacheLineAllocator() = default;
  template <class U> CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(kAlign))); }
  void deallocate(T* p, std::size_t) noexcept { ::operator delete(p, std::align_val_t(kAlign)); }
  template <class U> bool operator==(const CacheLineAllocator<U>&) const noexcept { return true; }
  template <class U> bool operator!=(const CacheLineAllocator<U>&) const noexcept { return false; }
};

template <class T> using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace xg::detail
