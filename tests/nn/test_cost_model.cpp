// Cost model (SPEC 11): FLOPs by term (projections: the text before (5.34); Q K^T and A V:
// (5.34)), weight-matrix bytes (5.35), KV sharing (5.36), cache size and KV parameters (the
// text after (5.36)), exercises 5.7 and 5.11.
#include "tests/support/helpers.hpp"

using namespace xg::nn::cost;

TEST_CASE("cost: an explicit weight matrix for B=2 H=16 T=S=4096 in 2 bytes is 1 GiB (5.35)", "[nn][cost][spec]") {
  CHECK(weight_matrix_bytes(2, 16, 4096, 4096, 2) == 1073741824ull);
  CHECK(weight_matrix_bytes(2, 16, 4096, 4096, 2) == (1ull << 30));
}

TEST_CASE("cost: exercise 5.7 - GQA KV cache with H_q=24 H_kv=6 d_h=64 for 2048 positions in 2 bytes",
          "[nn][cost][spec]") {
  CHECK(kv_cache_bytes(1, 2048, 6, 64, 2) == 3145728ull);         // 3 MiB per layer
  CHECK(kv_cache_bytes(1, 2048, 24, 64, 2) == 12ull * (1 << 20));  // MHA: 12 MiB
}

TEST_CASE("cost: exercise 5.11 - H_q=32 -> H_kv=8 shrinks KV projections and cache 4x and leaves scores unchanged",
          "[nn][cost][spec]") {
  AttentionShape mha{1, 128, 128, 4096, 32, 32, 128};
  AttentionShape gqa = mha;
  gqa.H_kv = 8;
  AttentionShape mqa = mha;
  mqa.H_kv = 1;
  const Flops a = attention_flops(mha), b = attention_flops(gqa), c = attention_flops(mqa);
  CHECK(b.k_proj * 4 == a.k_proj);
  CHECK(b.v_proj * 4 == a.v_proj);
  CHECK(b.scores == a.scores);
  CHECK(b.weighted_sum == a.weighted_sum);
  CHECK(b.q_proj == a.q_proj);
  CHECK(kv_cache_bytes(1, 1000, 8, 128, 2) * 4 == kv_cache_bytes(1, 1000, 32, 128, 2));
  CHECK(kv_cache_bytes(1, 1000, 1, 128, 2) * 32 == kv_cache_bytes(1, 1000, 32, 128, 2));  // MQA: 1/32
  CHECK(kv_projection_params(4096, 8, 128) * 4 == kv_projection_params(4096, 32, 128));
  CHECK(c.k_proj * 32 == a.k_proj);
}

TEST_CASE("cost: MHA FLOPs by term are the spec's 2BTd^2 + 4BSd^2 + 2BTd^2 + 2BHTSd_k + 2BHTSd_v (5.34)",
          "[nn][cost][spec]") {
  const std::uint64_t B = 3, T = 5, S = 7, d = 64, H = 8, d_k = d / H;
  const Flops f = attention_flops({B, T, S, d, H, H, 0});
  CHECK(f.q_proj == 2 * B * T * d * d);
  CHECK(f.k_proj + f.v_proj == 4 * B * S * d * d);
  CHECK(f.o_proj == 2 * B * T * d * d);
  CHECK(f.scores == 2 * B * H * T * S * d_k);
  CHECK(f.weighted_sum == 2 * B * H * T * S * d_k);
  CHECK(f.total() == f.q_proj + f.k_proj + f.v_proj + f.o_proj + f.scores + f.weighted_sum);
  CHECK_THROWS_AS(attention_flops({1, 1, 1, 8, 6, 4, 0}), xg::ValueError);
}
