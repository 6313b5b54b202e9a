// Internal: small bfloat16 products on AMX tiles (TDPBF16PS), or on the same operand layouts with
// AVX512_BF16 dot products (VDPBF16PS) where the CPU has no AMX, single-threaded, for the fused
// attention's tiles under bfloat16 mixed precision (nn/detail/flash_tile.hpp, bf16_choice()).
// The operands are float32 and rounded here as every bfloat16 product of xgrad rounds them
// (VCVTNE2PS2BF16: to nearest even; core/detail/bf16_gemm.hpp), the sums are float32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace xg::blas::amx {

// "" where this process can run AMX bfloat16 tiles: the CPU has AMX-TILE, AMX-BF16 and
// AVX512_BF16 (cpuid), the OS saves the tile state (XCR0 bits 17 and 18) and granted this
// process its use (arch_prctl ARCH_REQ_XCOMP_PERM, asked once here), and the ISA ceiling
// (XGRAD_ISA, set_max_isa) is avx512. Else the one-line reason.
std::string unavailable_reason();
inline bool available() { return unavailable_reason().empty(); }

// C[i * ldc + j] = sum_k a(i, k) b(k, j) for i < M, j < N (overwritten), with a(i, k) the bfloat16
// rounding of A[i * a_rs + k * a_cs] and b(k, j) that of B[k * ldb + j], float32 sums. Any M, N
// and K (K = 0 gives zeros). Each entry is the tiles' sum over k in steps of 32 from k = 0
// (zeros beyond K), so its bits depend on its row of A, its column of B and K, not on M, N or
// where it lies in C. Throws Error where !available(). Nothing is allocated once the calling
// thread's buffers have grown to the size.
void product(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t a_rs, std::size_t a_cs,
             const float* B, std::size_t ldb, float* C, std::size_t ldc);

// product(), tiles() and dot_tiles() calls so far, process-wide.
std::uint64_t calls();

// --- Operands rounded once, multiplied many times ---
// The tile layouts: 32-bit words, each a pair of bfloat16 values (the first in the low half).
// "A layout": row i of the product's left operand is kw = round_up(K, 32) / 2 words, pairs
// along k. "B layout": pair row p holds words (b(2p, j), b(2p + 1, j)) for the columns j. The
// functions below write zeros beyond K, and beyond M (A: up to round_up(M, 16) rows) or N (B: up to
// round_up(N, 16) words). Rounding as product() rounds; it needs AVX512_BF16, not AMX (else Error).

// A layout of alpha A[i * a_rs + k * a_cs] (alpha 1: A itself), row i at out + i * ldo.
void round_a(std::size_t M, std::size_t K, float alpha, const float* A, std::size_t a_rs, std::size_t a_cs,
             std::uint32_t* out, std::size_t ldo);
// B layout of b(k, j) = B[k * ldb + j], pair row p at out + p * ldo.
void round_b(std::size_t K, std::size_t N, const float* B, std::size_t ldb, std::uint32_t* out, std::size_t ldo);
// B layout of b(k, j) = Bt[j * ldt + k] (B given transposed), pair row p at out + p * ldo.
void round_b_transposed(std::size_t K, std::size_t N, const float* Bt, std::size_t ldt, std::uint32_t* out,
                        std::size_t ldo);
// C[i * ldc + j] = (accumulate: C[i * ldc + j] +) sum over kw words of pairs a(i, .) b(., j), for
// i < M, j < N, with A rows lda words apart (round_up(M, 16) rows readable) and B pair rows ldb
// words apart (round_up(N, 16) words readable); kw a multiple of 16. The same sums as product()
// on the unrounded operands. Throws Error where !available() (the CPU and OS part).
void tiles(std::size_t M, std::size_t N, std::size_t kw, const std::uint32_t* A, std::size_t lda,
           const std::uint32_t* B, std::size_t ldb, float* C, std::size_t ldc, bool accumulate);

// The same sums as tiles() on the same layouts with VDPBF16PS (AVX512_BF16, no AMX): a word of A
// broadcast against a pair row of B, each entry summed pair by pair in order of k (its bits
// depend on its row of A, its column of B and kw, not on M, N or where it lies in C; they need
// not equal tiles()'s). Any kw (0: zeros, or C as it was where accumulate); C's rows beyond M
// and columns beyond N are not touched. Throws Error where the CPU has no AVX512_BF16.
void dot_tiles(std::size_t M, std::size_t N, std::size_t kw, const std::uint32_t* A, std::size_t lda,
               const std::uint32_t* B, std::size_t ldb, float* C, std::size_t ldc, bool accumulate);
// "" where this process can run dot_tiles() (AVX512_BF16, the ISA ceiling avx512), else why not.
std::string dot_unavailable_reason();
inline bool dot_available() { return dot_unavailable_reason().empty(); }

// While one lives on a thread, tiles() there loads the tile configuration once (here) instead of
// once per call, and the tiles are released when it ends: for runs of many small products with
// no other AMX code on the thread in between (oneDNN's kernels load a configuration of their
// own). Nests; does nothing where !available().
class TileSession {
 public:
  TileSession();
  ~TileSession();
  TileSession(const TileSession&) = delete;
  TileSession& operator=(const TileSession&) = delete;
};

}  // namespace xg::blas::amx
