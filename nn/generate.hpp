/// \file
/// Autoregressive generation for the GPT and the encoder-decoder: greedy (default) or
/// temperature / top-k sampling, with the KV cache (default) or recomputing the whole prefix.
/// Both paths give the same tokens and the same logits to float tolerance (tested).
/// A GPT generates past its context by cropping, as nanoGPT does: once prompt and generated
/// tokens fill the context, each step runs the model afresh over the last `context` tokens
/// (positions 0..context-1). A model with a sliding window no longer than the context and
/// positions that are not learned (RoPE, ALiBi, none) instead keeps decoding with its windowed
/// KV cache (the keys older than the window are dropped; positions go on past the context).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/nn/transformer.hpp>

namespace xg::nn {

/// How the next token is chosen, and whether the KV cache is used.
struct SampleOptions {
  /// 0 = greedy (argmax, first maximum on ties); > 0 samples from softmax(logits /
  /// temperature). Must be finite and >= 0 (ValueError).
  double temperature = 0.0;
  std::size_t top_k = 0;     ///< Sample among the k largest logits only; 0 = no top-k filter.
  /// Nucleus sampling: among the most likely tokens (after top_k) whose probabilities (at the
  /// temperature) first reach this share of the total, in (0, 1]; 1 = no filter.
  double top_p = 1.0;
  Generator* generator = nullptr;  ///< The sampling source; needed when temperature > 0 (ValueError otherwise).
  bool use_kv_cache = true;  ///< Decode with the KV cache (else recompute the whole prefix each step).
  std::int64_t stop_token = -1;    ///< Stop a sample once it emits this token (-1: never); the token is kept.
  std::vector<std::int64_t> stop_tokens;  ///< More tokens that stop a sample as stop_token does.
  /// Called after each new token of a sample that is still running, with the sample's index and
  /// its new tokens so far (that token last); true ends the sample there (the token is kept).
  /// E.g. a stop string found in the decoded text.
  std::function<bool(std::size_t sample, const std::vector<std::int64_t>& generated)> stop_when;
  /// Sample among ids below this only (0: every id of the vocabulary): a model whose vocabulary is
  /// larger than its tokenizer's never produces the ids past the tokenizer's.
  std::size_t vocab_limit = 0;
  /// Keep every step's logits in Generation::logits (as Hugging Face's output_scores). false:
  /// it stays empty, and a long generation holds nothing per step but its tokens (with a
  /// vocabulary of 32,000, a step's logits are 128 kB).
  bool keep_logits = true;
};

/// What generate() produced.
struct Generation {
  /// The new tokens of each sample (the prompt not included), up to and including its stop
  /// token.
  std::vector<std::vector<std::int64_t>> tokens;
  std::vector<Array> logits;                      ///< Per step: the [B, V_vocab] logits that were sampled from (SampleOptions::keep_logits).
};

/// prompts: B sequences of equal length in [1, context]; generates max_new tokens (fewer if
/// every sample stopped), past the context by cropping (see the file's comment). Runs under
/// no_grad. ValueError for empty, unequal or too long prompts and for non-finite logits.
Generation generate(GPT& model, const std::vector<std::vector<std::int64_t>>& prompts, std::size_t max_new,
                    const SampleOptions& opts = {});

/// Encoder-decoder: encodes the padded sources `src` [B, S] (real lengths `src_lengths`) once,
/// then decodes from the token `bos`, up to max_new tokens (at most the context: no
/// cropping, the decoder's positions are learned). Runs under no_grad.
Generation generate(EncoderDecoder& model, const IndexArray& src, const std::vector<std::size_t>& src_lengths,
                    std::int64_t bos, std::size_t max_new, const SampleOptions& opts = {});

/// Picks the next token from one row of logits, as `opts` says. ValueError for an empty or
/// non-finite row, a bad temperature, a missing generator, or a temperature so small that
/// the sampling weights overflow.
std::int64_t pick_token(const std::vector<double>& logits, const SampleOptions& opts);

}  // namespace xg::nn
