// Internal: a 16 x 16 transpose of 32-bit words in AVX-512 registers, shared by the bfloat16
// kernels (core/amx_gemm.cpp: the attention's rounded operands; core/bf16_gemm.cpp: packing a
// transposed B). Its own target attribute: callers check the CPU first.
#pragma once

#if defined(__x86_64__)
#include <cstddef>
#include <cstdint>
#include <immintrin.h>

// GCC 12's AVX-512 headers start some intrinsics from an "undefined" vector that
// -Wuninitialized then reports inside the header (GCC bug 105593; as in core/bf16_gemm.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace xg::detail {

// out[c * ldo + r] = in[r * ldi + c] for a 16 x 16 block of 32-bit words (an exact copy).
__attribute__((target("avx512f"))) inline void transpose16_words(const std::uint32_t* in, std::size_t ldi,
                                                                 std::uint32_t* out, std::size_t ldo) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(in + i * ldi);
  for (int j = 0; j < 8; ++j) {  // per 128-bit lane: (r[2j][4L + q], r[2j+1][4L + q]) pairs
    t[2 * j] = _mm512_unpacklo_epi32(r[2 * j], r[2 * j + 1]);
    t[2 * j + 1] = _mm512_unpackhi_epi32(r[2 * j], r[2 * j + 1]);
  }
  for (int j = 0; j < 4; ++j) {  // r[4j][4L + c] .. r[4j+3][4L + c] in lane L of r[4j + c]
    r[4 * j + 0] = _mm512_unpacklo_epi64(t[4 * j + 0], t[4 * j + 2]);
    r[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j + 0], t[4 * j + 2]);
    r[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
    r[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // output row 4L + c: lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
    const __m512i w1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    const __m512i w2 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    const __m512i w3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    const __m512i w4 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    _mm512_storeu_si512(out + (0 + c) * ldo, _mm512_shuffle_i32x4(w1, w3, 0x88));
    _mm512_storeu_si512(out + (8 + c) * ldo, _mm512_shuffle_i32x4(w1, w3, 0xDD));
    _mm512_storeu_si512(out + (4 + c) * ldo, _mm512_shuffle_i32x4(w2, w4, 0x88));
    _mm512_storeu_si512(out + (12 + c) * ldo, _mm512_shuffle_i32x4(w2, w4, 0xDD));
  }
}

}  // namespace xg::detail

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif
