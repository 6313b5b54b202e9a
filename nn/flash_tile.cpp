// The fused attention op's float32 tile kernels for AVX-512 and AVX2 (nn/detail/flash_tile.hpp).
#include <xgrad/nn/detail/flash_tile.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include <xgrad/core/detail/blas.hpp>

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 headers start some intrinsics (the reductions, roundscale, cvtps) from an
// "undefined" vector that -Wmaybe-uninitialized then reports inside the header (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace xg::nn::tile {

#define XG_TILE_NS avx512
#define XG_TILE_TARGET __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))
#define XG_TILE_W 16
#include "detail/flash_tile_body.inc"
#undef XG_TILE_NS
#undef XG_TILE_TARGET
#undef XG_TILE_W

#define XG_TILE_NS avx2
#define XG_TILE_TARGET __attribute__((target("avx2,fma")))
#define XG_TILE_W 8
#include "detail/flash_tile_body.inc"
#undef XG_TILE_NS
#undef XG_TILE_TARGET
#undef XG_TILE_W

const Kernels* kernels() {
  // blas::isa_ceiling() is the CPU's widest ISA (cpuid) under set_max_isa() / XGRAD_ISA.
  const std::string isa = blas::isa_ceiling();
  if (isa == "avx512") return &avx512::table;
  if (isa == "avx2") return &avx2::table;
  return nullptr;
}

}  // namespace xg::nn::tile

#else

namespace xg::nn::tile {
const Kernels* kernels() { return nullptr; }
}  // namespace xg::nn::tile

#endif
