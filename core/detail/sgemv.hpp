// Internal: xgrad's own float32 matrix-vector kernel, the one-row (or one-column) products of
// the BLAS doorway (core/detail/blas.hpp): batch-1 decoding multiplies one token's row by every
// weight. Single-threaded over a range of outputs; the doorway splits the outputs (and a rows
// product's two halves of K) over the pool.
//
// Two forms, by how the matrix is stored (row-major, leading dimension ldw):
//   rows: y_j = sum_k x_k W[k ldw + j], j in [lo, hi): W is [K, N] (xgrad's Linear weight,
//         [in, out]), row by row (core/detail/sgemv.inc: over panels of columns held in
//         vector accumulators, or streamed in memory order, by ISA).
//   dots: y_j = sum_k W[j ldw + k] x_k: W is [N, K] (a tied classifier, the token embedding
//         [V, d]), one dot product per row of W.
// Then y_j = alpha s_j when beta is 0 (y never read), else fma(beta, y_j, alpha s_j).
//
// What is guaranteed about the bits (the ISAs give the same bits, and so does the scalar
// fallback, which computes the same chains with std::fma):
//   rows: s_j = c_j(0, h) + c_j(h, K), h = floor(K / 2), where c_j(k0, k1) is the fused
//         multiply-add chain over k = k0, k0 + 1, ..., k1 - 1 from +0 (0 for an empty range).
//         Two fixed halves, so that the doorway can give them to two threads: each streams a
//         contiguous half of W (split by columns instead, two threads read no faster than one
//         on AMD Zen 1; docs/performance.md, "Generation").
//   dots: 16 partial sums; partial l is the fma chain over k = l, l + 16, l + 32, ... from +0,
//         over ceil(K / 16) steps (a step past K adds fma(0, 0, .)); then s_j = the tree
//         ((p_l + p_{l+8}) for l < 8, then + 4 apart, + 2 apart, + 1 apart).
// Neither depends on where j sits in a panel or a chunk, nor on the thread count.
#pragma once

#include <cstddef>

namespace xg::blas::f32v {

enum class Isa { scalar, avx2, avx512 };

// The CPU has the instructions of `isa` (cpuid at run time; AVX2 needs FMA; scalar: always).
bool cpu_supported(Isa isa);
const char* isa_name(Isa isa);  // "scalar", "avx2", "avx512"

// y[j incy] for j in [lo, hi), single-threaded; x contiguous (K entries). Throws Error if the CPU
// lacks `isa`.
void rows(Isa isa, std::size_t K, std::size_t lo, std::size_t hi, float alpha, const float* x, const float* W,
          std::size_t ldw, float beta, float* y, std::size_t incy);
void dots(Isa isa, std::size_t K, std::size_t lo, std::size_t hi, float alpha, const float* x, const float* W,
          std::size_t ldw, float beta, float* y, std::size_t incy);

// out[j - lo] = c_j(k0, k1) above for j in [lo, hi): one half of a rows product, for the
// doorway's threads (rows() computes both and finishes y itself). Throws Error if the CPU lacks
// `isa`.
void rows_part(Isa isa, std::size_t k0, std::size_t k1, std::size_t lo, std::size_t hi, const float* x,
               const float* W, std::size_t ldw, float* out);

}  // namespace xg::blas::f32v
