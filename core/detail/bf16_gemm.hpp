// Internal: the bfloat16 GEMM kernel behind xg::set_matmul_dtype(MatmulDtype::bfloat16).
// Row-major C = alpha * op(A) op(B) + beta * C with float32 A, B and C: the inputs are rounded to
// bfloat16 (round to nearest even, as VCVTNE2PS2BF16 does it: denormal inputs become signed
// zeros, NaN stays NaN) and multiplied with float32 accumulation (VDPBF16PS, AVX512_BF16). The
// functions carry their own target attributes: callers must check cpu_supported() first.
// blas::gemm_bf16 (core/detail/blas.hpp) splits a product over xgrad's pool and calls
// gemm_block once per block, single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace xg::blas::bf16 {

// The CPU has AVX512_BF16 (with the F, BW and VL subsets the kernel uses), from cpuid at run time.
bool cpu_supported();

// x rounded to bfloat16 as the kernel rounds it (its bits), and back to float32 (exact).
std::uint16_t round_bits(float x);
float widen(std::uint16_t bits);
inline float round(float x) { return widen(round_bits(x)); }

// How many times faster bfloat16 dot products (VDPBF16PS) run than float32 FMAs on this CPU,
// in flops per second, from a short calibration on the calling thread (about 10 ms); 0 where
// the CPU has no AVX512_BF16. On an Intel Xeon of family 6 model 207 it is about 0.4, on AMD
// Zen 5 about 2: the instruction's presence says nothing about its speed.
double measured_speedup();
// bfloat16 products are used only from this speed-up on (blas::bf16_unavailable_reason):
// below it the rounding and packing cost more than the faster dot products save.
constexpr double kMinSpeedup = 1.25;
// Whether gemm_block prefetches the float32 source of its next pack of a transposed A into L2
// while the micro-kernel runs (on by default; tests and scratch benchmarks turn it off to
// compare). The prefetches change no value: the results are the same bits either way.
// prefetch_ahead_lines() counts the cache lines prefetched so, over the process.
void set_prefetch_ahead(bool on);
bool prefetch_ahead();
std::uint64_t prefetch_ahead_lines();
// One single-threaded block of the product (beta 0 never reads C: it may hold anything).
void gemm_block(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc);

// --- The same products on oneDNN's matmul primitive (core/bf16_onednn.cpp) ---
// The inputs are rounded here as above (the same bfloat16 values), into dense copies, and
// oneDNN multiplies them with float32 accumulation on the best kernel it has for this CPU: AMX
// tiles (TDPBF16PS) where the CPU has them and the OS grants them, else AVX512_BF16 dot
// products. Split over xgrad's pool by rows of C, oneDNN single-threaded in each block.
//
// Built with oneDNN, the CPU has AVX512_BF16 (the rounding uses it) and the ISA ceiling
// (XGRAD_ISA, set_max_isa) is avx512 (under AVX2 oneDNN has no bfloat16 matmul).
bool onednn_supported();
// Why not, in one phrase ("" where onednn_supported()): built without oneDNN, no AVX512_BF16,
// or the kernels capped at AVX2.
std::string onednn_unavailable_reason();
// oneDNN's implementation for a [512 x 256] x [256 x 768] product, e.g. "brg:avx512_core_amx_bf16"
// (AMX) or "brg:avx512_core_bf16"; "" where !onednn_supported().
std::string onednn_impl();
// True where onednn_impl() runs on AMX tiles.
inline bool onednn_uses_amx() { return onednn_impl().find("amx") != std::string::npos; }
// How many times faster a bfloat16 product (M 256, N 512, K 256, rounding included) runs on
// oneDNN than the float32 product on oneDNN's sgemm, one thread, from a short calibration (a
// few milliseconds); 0 where !onednn_supported().
double onednn_measured_speedup();
// The whole product, over the pool (beta 0 never reads C). Throws Error where !onednn_supported().
void onednn_gemm(bool trans_a, bool trans_b, std::size_t M, std::size_t N, std::size_t K, float alpha, const float* A,
                 std::size_t lda, const float* B, std::size_t ldb, float beta, float* C, std::size_t ldc);
// The implementation of the last oneDNN product this thread ran ("" before the first).
std::string onednn_last_impl();

}  // namespace xg::blas::bf16
