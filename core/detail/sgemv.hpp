// Internal: xgrad's own float32 matrix-vector kernel, the one-row (or one-column) products of
// the BLAS doorway (core/detail/blas.hpp): batch-1 decoding multiplies one token's row by every
// weight. Single-threaded over a range of outputs; the doorway splits the outputs over the pool.
//
// Two forms, by how the matrix is stored (row-major, leading dimension ldw):
//   rows: y_j = sum_k x_k W[k ldw + j], j in [lo, hi): W is [K, N] (xgrad's Linear weight,
//         [in, out]), streamed row by row over a panel of columns held in vector accumulators.
//   dots: y_j = sum_k W[j ldw + k] x_k: W is [N, K] (a tied classifier, the token embedding
//         [V, d]), several rows of W at once, one dot product each.
// Then y_j = alpha s_j when beta is 0 (y never read), else fma(beta, y_j, alpha s_j).
//
// What is guaranteed about the bits (the ISAs give the same bits, and so does the scalar
// fallback, which computes the same chains with std::fma):
//   rows: s_j is the fused multiply-add chain over k = 0, 1, ..., K-1 from +0.
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

}  // namespace xg::blas::f32v
