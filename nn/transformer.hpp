// Pre-LN transformer blocks and the two models built from them:
//   DecoderBlock:      x += attn(ln1(x), causal);           x += ffn(ln2(x))
//   EncoderBlock:      x += attn(ln1(x), key padding);      x += ffn(ln2(x))   (bidirectional)
//   CrossDecoderBlock: x += attn(ln1(x), causal); x += cross(ln2(x), memory, source padding);
//                      x += ffn(ln3(x))
//   GPT:               decoder-only language model, token + learned position embeddings,
//                      DecoderBlocks, final layer norm, logits tied to the token embedding.
//   EncoderDecoder:    EncoderBlocks over the source, CrossDecoderBlocks over the target.
// GPT-2 initialisation: weights normal(0, 0.02), residual output projections (attention W_O
// and the second feed-forward layer) normal(0, 0.02 / sqrt(2 * layers)), biases zero.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <xgrad/nn/attention.hpp>
#include <xgrad/nn/layers.hpp>

namespace xg::nn {

struct TransformerConfig {
  std::size_t V_vocab = 0;     // vocabulary size (shared by source and target)
  std::size_t context = 0;     // maximum positions (learned position embeddings)
  std::size_t d_model = 64;
  std::size_t H_q = 4;
  std::size_t H_kv = 0;        // 0 means H_q
  std::size_t layers = 2;      // decoder layers (GPT) / decoder layers (encoder-decoder)
  std::size_t encoder_layers = 0;  // encoder-decoder only; 0 means `layers`
  std::size_t d_ff = 0;        // 0 means 4 * d_model
  double dropout = 0.0;        // residual, attention-weight and feed-forward dropout
  DType dtype = default_dtype();

  TransformerConfig resolved() const;  // fills the 0 defaults; validates (ValueError)
};

class DecoderBlock : public Module {
 public:
  DecoderBlock(const TransformerConfig& c, Generator& gen);
  // x [B, T, d]; call.visibility should be causal (the model passes it).
  Tensor operator()(const Tensor& x, const AttentionCall& call, AttentionOutput* attn = nullptr);
  Tensor forward_cached(const Tensor& x_new, KVCache& cache, const AttentionCall& call,
                        AttentionOutput* attn = nullptr);
  LayerNorm ln1, ln2;
  MultiHeadAttention attn;
  FeedForward ffn;

 private:
  double dropout_;
};

class EncoderBlock : public Module {
 public:
  EncoderBlock(const TransformerConfig& c, Generator& gen);
  Tensor operator()(const Tensor& x, const AttentionCall& call);
  LayerNorm ln1, ln2;
  MultiHeadAttention attn;
  FeedForward ffn;

 private:
  double dropout_;
};

class CrossDecoderBlock : public Module {
 public:
  CrossDecoderBlock(const TransformerConfig& c, Generator& gen);
  Tensor operator()(const Tensor& x, const AttentionCall& self_call, const std::pair<Tensor, Tensor>& memory_kv,
                    const AttentionCall& cross_call);
  Tensor forward_cached(const Tensor& x_new, KVCache& cache, const AttentionCall& self_call,
                        const std::pair<Tensor, Tensor>& memory_kv, const AttentionCall& cross_call);
  LayerNorm ln1, ln2, ln3;
  MultiHeadAttention attn;
  CrossAttention cross;
  FeedForward ffn;

 private:
  double dropout_;
};

// Decoder-only language model.
class GPT : public Module {
 public:
  GPT(const TransformerConfig& c, Generator& gen);
  const TransformerConfig& config() const { return cfg_; }

  // tokens [B, T] (T <= context) -> logits [B, T, V_vocab]. dropout_gen is needed when
  // training with dropout > 0. If attn is given, it receives each layer's attention output
  // with weights (for attention maps).
  Tensor logits(const IndexArray& tokens, Generator* dropout_gen = nullptr,
                std::vector<AttentionOutput>* attn = nullptr);
  // Mean cross-entropy of next-token targets [B, T] (ignore_index skips positions).
  Tensor loss(const IndexArray& tokens, const IndexArray& targets, std::int64_t ignore_index = -100,
              Generator* dropout_gen = nullptr);

  // Incremental decoding: one cache per layer; tokens_new [B, n] are the next positions.
  std::vector<KVCache> make_caches(std::size_t batch, std::size_t capacity) const;
  Tensor logits_cached(const IndexArray& tokens_new, std::vector<KVCache>& caches);

  Embedding tok, pos;
  std::vector<std::unique_ptr<DecoderBlock>> blocks;
  LayerNorm ln_f;

 private:
  Tensor embed(const IndexArray& tokens, std::size_t start, Generator* dropout_gen) const;
  Tensor head(const Tensor& h) const;  // ln_f, then logits with the tied embedding
  TransformerConfig cfg_;
};

// Encoder-decoder model with cross attention; source and target share the vocabulary and
// the token embedding (also tied to the output logits).
class EncoderDecoder : public Module {
 public:
  EncoderDecoder(const TransformerConfig& c, Generator& gen);
  const TransformerConfig& config() const { return cfg_; }

  // src [B, S] with src_lengths (real tokens per sample; the rest is padding) -> memory
  // [B, S, d]. The encoder is bidirectional; padded source keys are hidden.
  Tensor encode(const IndexArray& src, const std::vector<std::size_t>& src_lengths, Generator* dropout_gen = nullptr);
  // tgt [B, T] -> logits [B, T, V_vocab] (causal over the target, cross attention to memory).
  Tensor decode(const IndexArray& tgt, const Tensor& memory, const std::vector<std::size_t>& src_lengths,
                Generator* dropout_gen = nullptr);
  Tensor loss(const IndexArray& src, const std::vector<std::size_t>& src_lengths, const IndexArray& tgt_in,
              const IndexArray& tgt_out, std::int64_t ignore_index = -100, Generator* dropout_gen = nullptr);

  // Incremental decoding with per-layer self-attention caches and the memory's K/V computed once.
  std::vector<KVCache> make_caches(std::size_t batch, std::size_t capacity) const;
  std::vector<std::pair<Tensor, Tensor>> memory_kv(const Tensor& memory) const;
  Tensor decode_cached(const IndexArray& tgt_new, std::vector<KVCache>& caches,
                       const std::vector<std::pair<Tensor, Tensor>>& memory_kv,
                       const std::vector<std::size_t>& src_lengths);

  Embedding tok, pos;
  std::vector<std::unique_ptr<EncoderBlock>> encoder;
  LayerNorm ln_enc;
  std::vector<std::unique_ptr<CrossDecoderBlock>> decoder;
  LayerNorm ln_f;

 private:
  Tensor embed(const IndexArray& tokens, std::size_t start, Generator* dropout_gen) const;
  TransformerConfig cfg_;
};

}  // namespace xg::nn
