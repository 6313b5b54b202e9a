// The fused attention op's float32 tile kernels for AVX-512 and AVX2 (nn/detail/flash_tile.hpp).
#include <xgrad/nn/detail/flash_tile.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include <vector>

#include <xgrad/core/detail/amx_gemm.hpp>
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/detail/calibrate.hpp>
#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/core/error.hpp>

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

namespace {

// How many times faster a tile product runs on `engine` than on the float32 kernels on this
// thread, as the fused attention runs them: 128 x 64 x 64 with A row-major (the weights times V)
// and A transposed (their transpose times dO), the bfloat16 side rounding A per product and B
// once (the attention rounds K, V, Q and dO once per pass or block): detail::measured_speedup, 20
// runs a round.
double measure_bf16_speedup(const Kernels& f32, Bf16Engine engine) {
  constexpr std::size_t M = 128, N = 64, K = 64;
  std::vector<float> A(M * K), B(K * N), C(M * N);
  for (std::size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>((i * 37) % 101) / 101.0f - 0.5f;
  for (std::size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>((i * 53) % 97) / 97.0f - 0.5f;
  std::vector<std::uint32_t> a(M * K / 2), b(K / 2 * N);
  blas::amx::round_b(K, N, B.data(), N, b.data(), N);
  const auto f32_run = [&] {
    f32.gemm(M, N, K, 1.0f, A.data(), K, 1, B.data(), N, C.data(), N, true);  // A [M, K] row-major
    f32.gemm(M, N, K, 1.0f, A.data(), 1, M, B.data(), N, C.data(), N, true);  // A [K, M] read transposed
  };
  const auto tiles = engine == Bf16Engine::amx ? &blas::amx::tiles : &blas::amx::dot_tiles;
  const auto bf16_run = [&] {
    blas::amx::round_a(M, K, 1.0f, A.data(), K, 1, a.data(), K / 2);
    tiles(M, N, K / 2, a.data(), K / 2, b.data(), N, C.data(), N, true);
    blas::amx::round_a(M, K, 1.0f, A.data(), 1, M, a.data(), K / 2);
    tiles(M, N, K / 2, a.data(), K / 2, b.data(), N, C.data(), N, true);
  };
  return detail::measured_speedup(f32_run, bf16_run, 20);
}

std::string ratio_text(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

const char* engine_name(Bf16Engine e) { return e == Bf16Engine::amx ? "AMX tile" : "AVX512_BF16 dot"; }

Bf16Choice choose_bf16() {
  const blas::ForcedKernel f = blas::forced_kernel("XGRAD_BF16_ATTENTION", "bf16_attention");
  const std::string& force = f.value;
  if (!force.empty() && force != "auto" && force != "on" && force != "off" && force != "amx" && force != "dpbf16")
    throw ValueError(op_message(f.source, "unknown value '" + force + "' (auto, on, off, amx or dpbf16)"));
  if (force == "off") return {Bf16Engine::none, f.setting()};
  // (both reasons include the ISA ceiling)
  const std::string no_amx = blas::amx::unavailable_reason(), no_dot = blas::amx::dot_unavailable_reason();
  if (force == "amx") {
    if (!no_amx.empty()) return {Bf16Engine::none, "no AMX bfloat16 tiles: " + no_amx};
    return {Bf16Engine::amx, f.setting()};
  }
  if (force == "dpbf16") {
    if (!no_dot.empty()) return {Bf16Engine::none, "no AVX512_BF16 dot products: " + no_dot};
    return {Bf16Engine::dpbf16, f.setting()};
  }
  if (!no_dot.empty()) return {Bf16Engine::none, "no bfloat16 tile products: " + no_dot};
  const Bf16Engine engine = no_amx.empty() ? Bf16Engine::amx : Bf16Engine::dpbf16;
  if (force == "on") return {engine, f.setting()};
  // Measured once per CPU and build (the calibration cache): every process on this machine
  // decides the same way, also where the ratio sits near the threshold.
  const detail::Calibration c =
      detail::calibrated(engine == Bf16Engine::amx ? "attention_tiles_amx" : "attention_tiles_dpbf16",
                         [engine] { return measure_bf16_speedup(*kernels(), engine); });
  const double r = c.value;
  const std::string from = c.cached ? detail::kReadFromCache : "";
  if (r >= kMinBf16Speedup)
    return {engine, std::string(engine_name(engine)) + " products measured at " + ratio_text(r) + " float32" + from};
  return {Bf16Engine::none,
          std::string(engine_name(engine)) + " products measured at " + ratio_text(r) + " float32" + from +
              " (they need " + ratio_text(kMinBf16Speedup) + ")"};
}

}  // namespace

const Bf16Choice& bf16_choice() {
  static const Bf16Choice choice = choose_bf16();  // a throw leaves it unset: the next call throws again
  return choice;
}

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
const Bf16Choice& bf16_choice() {
  static const Bf16Choice choice{Bf16Engine::none, "bfloat16 tile products are an x86-64 feature"};
  return choice;
}
}  // namespace xg::nn::tile

#endif
