// Autoregressive generation for the GPT and the encoder-decoder: greedy (default) or
// temperature / top-k sampling, with the KV cache (default) or recomputing the whole prefix.
// Both paths give the same tokens and the same logits to float tolerance (tested).
#pragma once

#include <cstdint>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/nn/transformer.hpp>

namespace xg::train {

struct SampleOptions {
  double temperature = 0.0;  // 0 = greedy (argmax, first maximum on ties)
  std::size_t top_k = 0;     // 0 = no top-k filter
  Generator* generator = nullptr;  // needed when temperature > 0
  bool use_kv_cache = true;
  std::int64_t stop_token = -1;    // stop a sample once it emits this token (-1: never)
};

struct Generation {
  std::vector<std::vector<std::int64_t>> tokens;  // new tokens per sample
  std::vector<Array> logits;                      // per step: [B, V_vocab] logits that were sampled from
};

// prompts: B sequences of equal length >= 1; generates max_new tokens (fewer if every
// sample hit stop_token). Runs under no_grad.
Generation generate(nn::GPT& model, const std::vector<std::vector<std::int64_t>>& prompts, std::size_t max_new,
                    const SampleOptions& opts = {});

// Encoder-decoder: encodes the padded sources once, then decodes from bos.
Generation generate(nn::EncoderDecoder& model, const IndexArray& src, const std::vector<std::size_t>& src_lengths,
                    std::int64_t bos, std::size_t max_new, const SampleOptions& opts = {});

// Picks the next token from one row of logits.
std::int64_t pick_token(const std::vector<double>& logits, const SampleOptions& opts);

}  // namespace xg::train
