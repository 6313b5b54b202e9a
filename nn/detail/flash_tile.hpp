/// \file
/// Internal: the float32 tile kernels of the fused attention op (nn/flash_attention.cpp), one
/// set per vector ISA (AVX-512 with 16 lanes, AVX2 + FMA with 8), chosen at run time from the
/// CPU's feature flags under the ceiling set_max_isa() / XGRAD_ISA sets (blas::isa_ceiling()),
/// never from the compiler's -march. Compiled with per-function target attributes
/// (nn/flash_tile.cpp includes nn/detail/flash_tile_body.inc once per ISA).
#pragma once

#include <cstddef>
#include <string>

namespace xg::nn::tile {

/// The kernels of one ISA. All pointers are row-major float32; nothing is allocated.
struct Kernels {
  std::size_t width;  ///< Vector lanes: 16 (AVX-512) or 8 (AVX2).
  const char* isa;    ///< "avx512" or "avx2".
  /// C[M, N] = alpha * sum_k A(i, k) B[k, 0..N) (accumulate: C += that), A(i, k) =
  /// A[i * a_rs + k * a_cs] (so a transposed or strided A costs nothing), B's rows ldb apart.
  /// N must be a multiple of `width`. Each entry of C is one FMA chain over k = 0, 1, ..., K-1
  /// (the same bits for the same operands, whatever M and N).
  void (*gemm)(std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A, std::size_t a_rs,
               std::size_t a_cs, const float* B, std::size_t ldb, float* C, std::size_t ldc, bool accumulate);
  /// gemm with alpha, accumulate = false, then C[i][j] = e^((C[i][j] - m[i]) - lz[i]) (exp_shift's
  /// arithmetic, without its sum) on the values in registers: the same bits as gemm then
  /// exp_shift row by row.
  void (*gemm_exp)(std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A, std::size_t a_rs,
                   std::size_t a_cs, const float* B, std::size_t ldb, float* C, std::size_t ldc, const float* m,
                   const float* lz);
  /// gemm with alpha = 1, accumulate = false, then C[i][j] = P[i * ldp + j] (C[i][j] - D[i]) on the
  /// values in registers (the softmax VJP): the same bits as gemm then that pass.
  void (*gemm_dsoft)(std::size_t M, std::size_t N, std::size_t K, const float* A, std::size_t a_rs, std::size_t a_cs,
                     const float* B, std::size_t ldb, float* C, std::size_t ldc, const float* P, std::size_t ldp,
                     const float* D);
  /// gemm with alpha, accumulate = false, then softmax_rows(C, ldc, M, N, m, l, acc, ldacc, dv):
  /// the same bits, the same return and the same rows left as stored scores. With AVX-512 and
  /// N = 64 (a row of the tile in one micro-tile's registers) each micro-tile's step runs on its
  /// registers, with no pass over the stored scores.
  std::size_t (*gemm_softmax)(std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                              std::size_t a_rs, std::size_t a_cs, const float* B, std::size_t ldb, float* C,
                              std::size_t ldc, float* m, float* l, float* acc, std::size_t ldacc, std::size_t dv);
  /// The forward pass's online-softmax step on `rows` rows of a tile that see all n keys (n a
  /// multiple of `width`; row k at S + k ld): if row k has a non-finite score, returns k, rows
  /// before it done. Else mx = max of the row; when mx > m[k]: if m[k] is finite, f = e^(m[k] - mx),
  /// l[k] *= f and acc's row k (dv values, ldacc apart) *= f; m[k] = mx; then l[k] += exp_shift(row,
  /// n, m[k], 0). Returns rows. The operations of the per-row loop it replaces, in its order.
  std::size_t (*softmax_rows)(float* S, std::size_t ld, std::size_t rows, std::size_t n, float* m, float* l,
                              float* acc, std::size_t ldacc, std::size_t dv);
  /// softmax_rows on `rows` rows that each see the part [ja[k], je[k]) of a tile n wide, with
  /// nothing to apply in it (the causal diagonal, a window's edges): an empty part sets the row
  /// to zero; else if the part has a non-finite score, returns k; else the step of softmax_rows
  /// on the part (max, rescale, l[k] += exp_shift of the part), the row zero outside it. The
  /// operations of the per-row loop it replaces, in its order.
  std::size_t (*softmax_parts)(float* S, std::size_t ld, std::size_t rows, const std::size_t* ja,
                               const std::size_t* je, std::size_t n, float* m, float* l, float* acc,
                               std::size_t ldacc, std::size_t dv);
  float (*max)(const float* x, std::size_t n);                   ///< max of x[0..n), -inf for n = 0
  float (*sum)(const float* x, std::size_t n);                   ///< sum of x[0..n)
  float (*dot)(const float* x, const float* y, std::size_t n);   ///< sum of x[j] y[j]
  /// x[j] = e^((x[j] - m) - lz) over [0, n); returns the sum of the new x (the softmax's
  /// numerators and their sum in one pass). e^x within 1 ulp, 0 for x < -87.34 and -inf.
  float (*exp_shift)(float* x, std::size_t n, float m, float lz);
  bool (*finite)(const float* x, std::size_t n);  ///< whether every x[j] is finite
  /// t[c * ldt + j] = x[j * ldx + c] for j < rows, c < cols (an exact copy).
  void (*transpose)(const float* x, std::size_t ldx, std::size_t rows, std::size_t cols, float* t, std::size_t ldt);
};

/// The kernels for this CPU under the ISA ceiling, or null when the CPU has neither AVX-512 nor
/// AVX2 with FMA (the callers then keep the BLAS path).
const Kernels* kernels();

/// Whether the fused attention runs its tile products with bfloat16 operands under bfloat16 mixed
/// precision (xg::set_matmul_dtype; nn/flash_attention.cpp, Bf16Products), on which engine, and
/// why; decided at the first call, once per process. The engines share the operand layouts of
/// core/detail/amx_gemm.hpp: AMX tiles (blas::amx::tiles) where blas::amx::available(), else
/// AVX512_BF16 dot products (blas::amx::dot_tiles) where blas::amx::dot_available().
/// XGRAD_BF16_ATTENTION (or its entry bf16_attention in XGRAD_KERNELS, core/detail/blas.hpp)
/// =off never uses them; =amx and =dpbf16 use that engine wherever the CPU has it; =on the
/// first engine the CPU has (AMX, then the dot products); =auto (the default) that engine where
/// a tile product measures at least kMinBf16Speedup times the float32 kernels' in a short
/// calibration on the calling thread (128 x 64 x 64, A row-major and transposed, 3 alternating
/// rounds, the fastest of each). Another value throws ValueError.
enum class Bf16Engine { none, amx, dpbf16 };
struct Bf16Choice {
  Bf16Engine engine = Bf16Engine::none;  ///< none: the products stay float32
  std::string why;
  bool use() const { return engine != Bf16Engine::none; }
};
const Bf16Choice& bf16_choice();
/// The bfloat16 tile products are used from this speed-up on (as the bfloat16 GEMM's choice).
constexpr double kMinBf16Speedup = 1.25;

}  // namespace xg::nn::tile
