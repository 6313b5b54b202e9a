/// \file
/// Compiling a region of a file for one instruction set, whatever `-march` the build has: the
/// kernels that exist once per ISA (core/dgemm.cpp, core/sgemv.cpp, core/fused_kernels.cpp)
/// include the same .inc body twice, once between XG_TARGET_BEGIN(XG_ISA_AVX512) and
/// XG_TARGET_END() and once for AVX2, and choose between them at run time (core/runtime.hpp,
/// `XGRAD_ISA`).
/// Every function defined in the region gets the target: clang's `attribute push`, GCC's
/// `push_options` with `target`.
#pragma once

/// The ISA of the AVX-512 kernels (F, BW, VL and DQ, with AVX2 and FMA for the 256-bit forms).
#define XG_ISA_AVX512 "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"
/// The ISA of the AVX2 kernels.
#define XG_ISA_AVX2 "avx2,fma"

#define XG_DETAIL_PRAGMA(text) _Pragma(#text)
#if defined(__clang__)
/// Starts a region whose functions are compiled for `isa` (a string literal, e.g. XG_ISA_AVX2).
#define XG_TARGET_BEGIN(isa) XG_DETAIL_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
/// Ends the region XG_TARGET_BEGIN started.
#define XG_TARGET_END() XG_DETAIL_PRAGMA(clang attribute pop)
#else
#define XG_TARGET_BEGIN(isa) XG_DETAIL_PRAGMA(GCC push_options) XG_DETAIL_PRAGMA(GCC target(isa))
#define XG_TARGET_END() XG_DETAIL_PRAGMA(GCC pop_options)
#endif
