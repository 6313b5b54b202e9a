// Internal: xgrad's own float64 GEMM kernel, one single-threaded block of
// C = alpha * op(A) op(B) + beta * C (row-major), for the BLAS doorway (core/detail/blas.hpp),
// which splits a product over xgrad's pool and chooses this kernel or OpenBLAS's dgemm.
//
// Layout (core/dgemm.cpp): K is cut into blocks of kKC = 256; for each, op(B) is packed into
// panels of NR columns (k-major) and op(A), kMC rows at a time, into groups of MR rows
// (k-major); a register-blocked micro-kernel keeps an MR x NR tile of C in vector registers:
// AVX-512 8 x 24 (24 zmm accumulators), AVX2 + FMA 6 x 8 (12 ymm). Edges are zero-padded in
// the packed copies; edge tiles of C go through a small buffer with the same arithmetic, except
// a full row group's last panel of whole vectors one short of NR (16 columns on AVX-512, 4 on
// AVX2), which the micro-kernel computes on C with one vector fewer.
//
// What is guaranteed about the bits: each entry of C is, for every K block b in increasing
// order, s_b = the fused multiply-add chain over k in that block in increasing k (starting
// from 0), and C = alpha s_0 (+ beta C0 by one FMA), then C = C + alpha s_b for b > 0. That
// order depends on K alone: not on M, N, where the entry sits in a tile or a block, the pool's
// thread count or how the doorway splits C, nor on the ISA (AVX2 and AVX-512 give the same
// bits). beta 0 never reads C (it may hold NaN).
#pragma once

#include <cstddef>

namespace xg::blas::f64 {

enum class Isa { avx2, avx512 };

// The CPU has the instructions of `isa` (cpuid at run time; AVX2 needs FMA too).
bool cpu_supported(Isa isa);

// One block, single-threaded. Throws Error if the CPU lacks `isa`.
void gemm_block(Isa isa, bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, double alpha,
                const double* A, std::size_t lda, const double* B, std::size_t ldb, double beta, double* C,
                std::size_t ldc);

}  // namespace xg::blas::f64
