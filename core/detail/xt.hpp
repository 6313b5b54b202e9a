// Internal: xtensor for the kernels that use it (docs/architecture.md, "xtensor": today
// ops/unary.cpp's exp, log and tanh, vectorised by xsimd). Only .cpp files include this; the
// rest of the engine needs only core/detail/storage.hpp. The Array <-> xtensor conversions
// for users are the public, installed <xgrad/xtensor.hpp>, which sits above the engine: this
// header includes xtensor itself, never that one (internal code points down, not up).
#pragma once

// xgrad's kernels use xtensor's SIMD-aligned allocator and xsimd math (XTENSOR_USE_XSIMD). The
// macro changes the type xt::xarray<T> itself, so every translation unit of the library must
// agree on it; the xgrad target defines it for its own sources, this guard covers code that
// includes this header directly.
#ifndef XTENSOR_USE_XSIMD
#define XTENSOR_USE_XSIMD
#endif

#include <vector>

// xsimd's AVX-512 kernels start some intrinsics of GCC 12's headers from an "undefined" vector
// that -Wmaybe-uninitialized then reports inside the header (GCC bug 105593; as in
// nn/flash_tile.cpp). Only the library's .cpp files include this header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include <xgrad/core/array.hpp>
#include <xgrad/core/detail/storage.hpp>

namespace xg {

// A 1-d xtensor view over an Array's contiguous data (for vectorised elementwise math).
template <class T> auto flat_view(Array& a) {
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(), std::vector<std::size_t>{a.size()});
}
template <class T> auto flat_view(const Array& a) {
  return xt::adapt(a.data<T>(), a.size(), xt::no_ownership(), std::vector<std::size_t>{a.size()});
}

}  // namespace xg
