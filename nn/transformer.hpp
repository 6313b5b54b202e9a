/// \file
/// Pre-LN transformer blocks and the two models built from them:
/// \verbatim
///   DecoderBlock:      x += attn(ln1(x), causal);           x += ffn(ln2(x))
///   EncoderBlock:      x += attn(ln1(x), key padding);      x += ffn(ln2(x))   (bidirectional)
///   CrossDecoderBlock: x += attn(ln1(x), causal); x += cross(ln2(x), memory, source padding);
///                      x += ffn(ln3(x))
///   LlamaBlock:        x += attn(rms_attn_norm(x), causal, RoPE, no biases);
///                      x += down(swiglu(gate(rms_ffn_norm(x)), up(...)))        (docs/llama.md)
///   GPT:               decoder-only language model. arch gpt (default): token + learned position
///                      embeddings, DecoderBlocks, final layer norm, logits tied to the token
///                      embedding. arch llama: token embedding, LlamaBlocks, final RMSNorm,
///                      logits from the token embedding (tied) or a separate classifier.
///   EncoderDecoder:    EncoderBlocks over the source, CrossDecoderBlocks over the target.
/// \endverbatim
/// GPT-2 initialisation: weights normal(0, 0.02), residual output projections (attention W_O
/// and the second feed-forward layer; Llama's W_O and `down`) normal(0, 0.02 / sqrt(2 * layers)),
/// biases zero, norm gains one.
///
/// Parameter names of a Llama model (arch llama; weights in x out, the transpose of llama2.c's
/// and Hugging Face's out x in):
/// \verbatim
///   tok.weight                  [V_vocab, d]              llama2.c tok_embeddings
///   blocks.L.attn_norm.weight   [d]                       attention_norm
///   blocks.L.attn.W_QKV         [d, (H_q + 2 H_kv) d_h]   wq | wk | wv, columns packed
///   blocks.L.attn.W_O           [H_q d_h, d]              wo
///   blocks.L.ffn_norm.weight    [d]                       ffn_norm
///   blocks.L.ffn.gate.W         [d, d_ff]                 w1
///   blocks.L.ffn.up.W           [d, d_ff]                 w3
///   blocks.L.ffn.down.W         [d_ff, d]                 w2
///   norm.weight                 [d]                       norm
///   classifier.weight           [V_vocab, d]              output (only when not tied)
/// \endverbatim
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <xgrad/nn/attention.hpp>
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/nn/layers.hpp>

namespace xg::nn {

/// How a GPT knows where a token is.
enum class PositionScheme {
  learned,  ///< Learned absolute position embeddings added to the token embeddings (default).
  rope,     ///< No position embedding; RoPE (TransformerConfig::rope) on Q and K in every layer.
  alibi,    ///< No position embedding; ALiBi (Visibility::alibi) in every layer.
  none      ///< No position information at all (only the causal mask orders the tokens).
};

/// "learned", "rope", "alibi" or "none".
std::string position_scheme_name(PositionScheme p);
/// The scheme named "learned", "rope", "alibi" or "none"; ValueError naming `name` otherwise.
PositionScheme position_scheme_from_name(const std::string& name);

/// The block a GPT is built from.
enum class Architecture {
  gpt,   ///< GPT-2: LayerNorm, GELU feed-forward, biases, tied classifier (DecoderBlock; default).
  llama  ///< Llama: RMSNorm, SwiGLU, RoPE, no biases, tied or separate classifier (LlamaBlock).
};

/// "gpt" or "llama".
std::string architecture_name(Architecture a);
/// The architecture named "gpt" or "llama"; ValueError naming `name` otherwise.
Architecture architecture_from_name(const std::string& name);

/// llama2.c's feed-forward width for model width `d_model`: int(2 * 4 d_model / 3) rounded up
/// to a multiple of `multiple_of` (positive; ValueError otherwise). stories15M: d 288,
/// multiple_of 32 -> 768.
std::size_t llama_hidden_size(std::size_t d_model, std::size_t multiple_of);

/// Sizes of a transformer model (GPT or EncoderDecoder).
struct TransformerConfig {
  std::size_t V_vocab = 0;     ///< Vocabulary size (shared by source and target).
  std::size_t context = 0;     ///< Maximum positions (learned position embeddings).
  std::size_t d_model = 64;    ///< Model width.
  std::size_t H_q = 4;         ///< Query heads per attention layer.
  std::size_t H_kv = 0;        ///< Key/value heads; 0 means H_q.
  std::size_t layers = 2;      ///< Decoder layers (GPT) / decoder layers (encoder-decoder).
  std::size_t encoder_layers = 0;  ///< Encoder-decoder only; 0 means `layers`.
  /// Feed-forward width; 0 means 4 * d_model (gpt) or llama_hidden_size(d_model, multiple_of)
  /// (llama).
  std::size_t d_ff = 0;
  /// Dropout: residual, attention-weight and feed-forward (gpt: after the GELU) dropout, and on
  /// the embeddings. A Llama model takes it too (as llama2.c: embeddings, attention weights,
  /// after W_O and after `down`).
  double dropout = 0.0;
  DType dtype = default_dtype();  ///< Parameter dtype (default_dtype() when the config is made).
  /// Sliding window W of the causal self-attention layers (GPT blocks, encoder-decoder
  /// decoder self-attention; the encoder stays bidirectional); 0 = none (AttentionConfig::window).
  std::size_t window = 0;
  /// Position scheme of a GPT; an EncoderDecoder takes only `learned` (ValueError otherwise).
  /// Without learned embeddings the GPT has no `pos` parameter; `context` still bounds positions.
  PositionScheme pos = PositionScheme::learned;
  ops::RopeConfig rope;  ///< RoPE base, fraction and layout, used when pos is rope.
  /// Attention core of every attention layer (AttentionConfig::impl, nn/sdpa.hpp). Not part
  /// of a checkpoint: it changes rounding, not the model.
  SdpaImpl impl = SdpaImpl::automatic;
  /// The block: gpt (default) or llama. A Llama GPT needs pos = rope (ValueError naming `pos`
  /// otherwise); the EncoderDecoder is gpt only.
  Architecture arch = Architecture::gpt;
  /// Llama only: the feed-forward width rounding of llama_hidden_size when d_ff is 0 (positive).
  /// 256 is llama2.c's model default; its TinyStories models use 32.
  std::size_t multiple_of = 256;
  /// Llama only: the eps of every RMSNorm (positive and finite).
  double norm_eps = 1e-5;
  /// Whether the classifier is the token embedding (logits = h tok.weight^T; one parameter, its
  /// gradient the sum of both uses) or a separate classifier.weight [V_vocab, d]. Only a Llama
  /// model may be untied (ValueError naming `tie_embeddings` otherwise).
  bool tie_embeddings = true;
  /// GPT-2 blocks: whether the linear layers (attention projections, feed-forward) and the
  /// LayerNorms have biases (nanoGPT's GPTConfig.bias). False: none (W and gamma only), as the
  /// Llama blocks, which have none either way (false with arch llama is refused, ValueError
  /// naming `bias`, so that one model has one configuration); an EncoderDecoder has biases.
  bool bias = true;
  /// Registered sub-layers (nn/layer_registry.hpp) a GPT builds instead of its own; empty: the
  /// built-in one. `activation` replaces GELU (gpt) or SiLU (llama) in the built-in
  /// feed-forward layer; `mlp` replaces the whole feed-forward sub-layer (not together with
  /// `activation`); `norm` replaces every norm (both of each block and the final one). The
  /// names must be registered when the model is built (ValueError naming the layer); an
  /// EncoderDecoder takes none. Checkpoints record them (metadata layer_activation, layer_mlp,
  /// layer_norm). @{
  std::string activation, mlp, norm;
  /// @}
  /// A registered attention core (nn::register_attention) in place of scaled dot-product
  /// attention in every block's self-attention (AttentionConfig::core); empty: the built-in
  /// one. Checkpoints record it (metadata layer_attention); an EncoderDecoder takes none.
  std::string attention;

  /// A copy with the 0 defaults filled in; validates (ValueError naming the bad size).
  TransformerConfig resolved() const;
};

/// A pre-norm decoder layer of a GPT (DecoderBlock or LlamaBlock): causal self-attention and a
/// feed-forward layer, each residual: h = x + drop(attn(norm(x))); h + drop(ffn_branch(h)).
class DecoderLayer : public Module {
 public:
  /// x [B, T, d] -> [B, T, d]; call.visibility should be causal (the model passes it), and
  /// call.generator is the dropout source. If `attn` is given it receives the attention output.
  Tensor operator()(const Tensor& x, const AttentionCall& call, AttentionOutput* attn = nullptr);
  /// The block on the next positions `x_new` [B, n, d] with the self-attention KV `cache`
  /// (MultiHeadAttention::forward_cached); `call` and `attn` as for operator().
  Tensor forward_cached(const Tensor& x_new, KVCache& cache, const AttentionCall& call,
                        AttentionOutput* attn = nullptr);
  MultiHeadAttention attn;  ///< Causal self-attention.

 protected:
  /// The attention layer of `cfg`, drawn from `gen`; residual dropout probability `dropout`.
  DecoderLayer(const AttentionConfig& cfg, Generator& gen, double dropout);
  /// The norm before the attention.
  virtual Tensor attention_input(const Tensor& x) = 0;
  /// The feed-forward branch on h, its norm included (`gen`: the dropout source).
  virtual Tensor ffn_branch(const Tensor& h, Generator* gen) = 0;
  /// h + the feed-forward branch on h (residual dropout applied to the branch in training);
  /// blocks may compute the sum inside the branch's last op (the same bits).
  virtual Tensor ffn_residual(const Tensor& h, Generator* gen);
  /// Whether residual dropout acts on this call (training with a positive probability).
  bool residual_dropout_on() const;

 private:
  /// Both passes: attention through `cache` when given, else over x alone.
  Tensor forward_impl(const Tensor& x, KVCache* cache, const AttentionCall& call, AttentionOutput* out);
  double dropout_;
};

/// Pre-LN decoder block (GPT-2): causal self-attention and a feed-forward layer, each residual.
class DecoderBlock : public DecoderLayer {
 public:
  /// A block of the sizes in `c` (resolved, arch gpt; ValueError naming `arch` otherwise),
  /// weights drawn from `gen` (GPT-2 initialisation).
  DecoderBlock(const TransformerConfig& c, Generator& gen);
  /// Layer norms before the attention (ln1) and the feed-forward layer (ln2). @{
  LayerNorm ln1, ln2;
  /// @}
  FeedForward ffn;          ///< Position-wise feed-forward layer.

 protected:
  Tensor attention_input(const Tensor& x) override;             ///< ln1(x).
  Tensor ffn_branch(const Tensor& h, Generator* gen) override;  ///< ffn(ln2(h)), dropout from gen.
  /// h + ffn(ln2(h)) with fc2's bias and the residual in fc2's op (FeedForward::with_residual)
  /// when residual dropout is off.
  Tensor ffn_residual(const Tensor& h, Generator* gen) override;
};

/// Llama decoder block: x += attn(attn_norm(x)); x += ffn(ffn_norm(x)), with RMSNorm, RoPE
/// attention (GQA when H_kv < H_q) without biases, and the SwiGLU feed-forward.
class LlamaBlock : public DecoderLayer {
 public:
  /// A block of the sizes in `c` (resolved, arch llama; ValueError naming `arch` otherwise),
  /// weights drawn from `gen` (GPT-2 initialisation, norm gains one).
  LlamaBlock(const TransformerConfig& c, Generator& gen);
  /// RMSNorms before the attention (llama2.c attention_norm) and the feed-forward (ffn_norm). @{
  RMSNorm attn_norm, ffn_norm;
  /// @}
  SwiGLUFeedForward ffn;  ///< down(swiglu(gate(x), up(x))).

 protected:
  Tensor attention_input(const Tensor& x) override;             ///< attn_norm(x).
  Tensor ffn_branch(const Tensor& h, Generator* gen) override;  ///< ffn(ffn_norm(h)) (no dropout inside).
};

/// A decoder block with registered sub-layers (TransformerConfig::mlp or TransformerConfig::norm set; built
/// by GPT): the GPT-2 or Llama block of `arch` whose norms and/or feed-forward sub-layer come
/// from the registry, the others built-in. Parameter names are those of the arch's block
/// (gpt: ln1, attn, ln2, ffn; llama: attn_norm, attn, ffn_norm, ffn); a built-in part keeps its
/// own names below them (ffn.fc1.W), and draws its initial weights in the built-in block's order.
class RegisteredBlock : public DecoderLayer {
 public:
  /// A block of the sizes in `c` (resolved; its registered names must be registered:
  /// ValueError naming the layer otherwise), weights drawn from `gen`.
  RegisteredBlock(const TransformerConfig& c, Generator& gen);
  /// The norms before the attention and the feed-forward sub-layer. @{
  std::unique_ptr<NormLayer> norm1, norm2;
  /// @}
  std::unique_ptr<MLPLayer> ffn;  ///< The feed-forward sub-layer (gelu_ffn / swiglu_ffn reach a built-in one's).

 protected:
  Tensor attention_input(const Tensor& x) override;             ///< norm1(x).
  Tensor ffn_branch(const Tensor& h, Generator* gen) override;  ///< ffn(norm2(h), gen); its shape checked.
};

/// The built-in GPT-2 feed-forward layer of `block` (a DecoderBlock's, or a RegisteredBlock's
/// built-in one), or null (a Llama block, a registered mlp). @{
FeedForward* gelu_ffn(DecoderLayer& block);
const FeedForward* gelu_ffn(const DecoderLayer& block);
/// @}
/// The built-in SwiGLU feed-forward layer of `block` (a LlamaBlock's, or a RegisteredBlock's
/// built-in one), or null. @{
SwiGLUFeedForward* swiglu_ffn(DecoderLayer& block);
const SwiGLUFeedForward* swiglu_ffn(const DecoderLayer& block);
/// @}

/// Pre-LN encoder block: bidirectional self-attention (key padding only) and a feed-forward
/// layer, each residual.
class EncoderBlock : public Module {
 public:
  /// A block of the sizes in `c` (resolved), weights drawn from `gen` (GPT-2 initialisation).
  EncoderBlock(const TransformerConfig& c, Generator& gen);
  /// x [B, S, d] -> [B, S, d] with the visibility (key padding) and dropout source in `call`.
  Tensor operator()(const Tensor& x, const AttentionCall& call);
  /// Layer norms before the attention (ln1) and the feed-forward layer (ln2). @{
  LayerNorm ln1, ln2;
  /// @}
  MultiHeadAttention attn;  ///< Bidirectional self-attention.
  FeedForward ffn;          ///< Position-wise feed-forward layer.

 private:
  double dropout_;
};

/// Pre-LN decoder block with cross-attention to an encoder's memory.
class CrossDecoderBlock : public Module {
 public:
  /// A block of the sizes in `c` (resolved), weights drawn from `gen` (GPT-2 initialisation).
  CrossDecoderBlock(const TransformerConfig& c, Generator& gen);
  /// x [B, T, d] -> [B, T, d]: causal self-attention with `self_call` (its generator is the
  /// dropout source), cross-attention to the memory's K and V heads `memory_kv`
  /// (CrossAttention::project_memory) with `cross_call` (source padding), feed-forward.
  Tensor operator()(const Tensor& x, const AttentionCall& self_call, const std::pair<Tensor, Tensor>& memory_kv,
                    const AttentionCall& cross_call);
  /// The block on the next positions `x_new` [B, n, d] with the self-attention KV `cache`;
  /// the other arguments as for operator().
  Tensor forward_cached(const Tensor& x_new, KVCache& cache, const AttentionCall& self_call,
                        const std::pair<Tensor, Tensor>& memory_kv, const AttentionCall& cross_call);
  /// Layer norms before the self-attention, the cross-attention and the feed-forward layer. @{
  LayerNorm ln1, ln2, ln3;
  /// @}
  MultiHeadAttention attn;  ///< Causal self-attention.
  CrossAttention cross;     ///< Cross-attention to the memory.
  FeedForward ffn;          ///< Position-wise feed-forward layer.

 private:
  double dropout_;
};

/// Per-call inputs of GPT::logits() and GPT::loss() beyond the tokens.
struct GPTCall {
  /// Absolute positions [T] of the tokens, shared by every sample of the batch: what the learned
  /// position embedding looks up, RoPE rotates by, and ALiBi and the window measure distances in
  /// (AttentionCall::positions). Empty: 0 .. T-1. Each in [0, context) (ValueError), T of them
  /// (ShapeError). Packed documents restart them per document, with `visibility` set to
  /// Visibility::documents.
  std::vector<Position> positions = {};
  /// Intersected with the causal mask (by token order) in every layer, e.g.
  /// Visibility::documents(doc_ids) so that packed documents do not see each other.
  Visibility visibility = Visibility::all();
};

/// Decoder-only language model.
class GPT : public Module {
 public:
  /// A model of the sizes in `c` (resolved; ValueError if invalid), weights drawn from `gen`.
  GPT(const TransformerConfig& c, Generator& gen);
  /// The resolved configuration.
  const TransformerConfig& config() const { return cfg_; }

  /// `tokens` [B, T] (T <= context) -> logits [B, T, V_vocab]. `dropout_gen` is needed when
  /// training with dropout > 0. If `attn` is given, it receives each layer's attention output
  /// with weights (for attention maps).
  Tensor logits(const IndexArray& tokens, Generator* dropout_gen = nullptr,
                std::vector<AttentionOutput>* attn = nullptr);
  /// logits() with the positions and extra visibility of `call` (GPTCall): packed documents
  /// with restarted positions give each document's logits as if it ran alone.
  Tensor logits(const IndexArray& tokens, const GPTCall& call, Generator* dropout_gen = nullptr,
                std::vector<AttentionOutput>* attn = nullptr);
  /// Mean cross-entropy of the logits of `tokens` [B, T] against next-token `targets` [B, T]
  /// (targets equal to `ignore_index` are skipped); `dropout_gen` as for logits().
  Tensor loss(const IndexArray& tokens, const IndexArray& targets, std::int64_t ignore_index = -100,
              Generator* dropout_gen = nullptr);
  /// loss() of logits(tokens, call, dropout_gen).
  Tensor loss(const IndexArray& tokens, const IndexArray& targets, const GPTCall& call,
              std::int64_t ignore_index = -100, Generator* dropout_gen = nullptr);

  /// Incremental decoding: one empty cache per layer for `batch` samples and `capacity`
  /// positions.
  std::vector<KVCache> make_caches(std::size_t batch, std::size_t capacity) const;
  /// Logits [B, n, V_vocab] of the next positions `tokens_new` [B, n], appending to `caches`
  /// (one per layer, ValueError otherwise). If the call throws, the caches are left as they were.
  Tensor logits_cached(const IndexArray& tokens_new, std::vector<KVCache>& caches);

  /// Token and learned position embeddings (tok also gives the output logits when tied). `pos`
  /// is a registered parameter only when config().pos is learned. @{
  Embedding tok, pos;
  /// @}
  /// The decoder blocks, in order: DecoderBlock (arch gpt) or LlamaBlock (arch llama), or
  /// RegisteredBlock when the config names a registered mlp or norm.
  std::vector<std::unique_ptr<DecoderLayer>> blocks;
  LayerNorm ln_f;  ///< Final layer norm (arch gpt; not a parameter of a Llama model).
  RMSNorm norm;    ///< Final RMSNorm (arch llama; not a parameter of a GPT-2 model).
  /// The final norm when config().norm names a registered norm (registered as ln_f or norm, by
  /// arch, in place of the built-in one); null otherwise.
  std::unique_ptr<NormLayer> registered_norm;
  /// The separate classifier [V_vocab, d] of an untied Llama model (logits = h W^T); null
  /// when tied.
  std::unique_ptr<Embedding> classifier;
  /// The classifier weight [V_vocab, d] in use: classifier->weight, or tok.weight when tied.
  const Tensor& classifier_weight() const;

 private:
  Tensor embed(const IndexArray& tokens, const std::vector<Position>& positions, Generator* dropout_gen) const;
  Tensor head(const Tensor& h) const;  // the final norm, then logits with classifier_weight()
  TransformerConfig cfg_;
};

/// Encoder-decoder model with cross attention; source and target share the vocabulary and
/// the token embedding (also tied to the output logits).
class EncoderDecoder : public Module {
 public:
  /// A model of the sizes in `c` (resolved; ValueError if invalid or arch llama), weights
  /// drawn from `gen`.
  EncoderDecoder(const TransformerConfig& c, Generator& gen);
  /// The resolved configuration.
  const TransformerConfig& config() const { return cfg_; }

  /// `src` [B, S] with `src_lengths` (real tokens per sample; the rest is padding) -> memory
  /// [B, S, d]. The encoder is bidirectional; padded source keys are hidden. `dropout_gen` is
  /// needed when training with dropout > 0.
  Tensor encode(const IndexArray& src, const std::vector<std::size_t>& src_lengths, Generator* dropout_gen = nullptr);
  /// `tgt` [B, T] -> logits [B, T, V_vocab] (causal over the target, cross attention to
  /// `memory` with the source padding of `src_lengths`); `dropout_gen` as for encode().
  Tensor decode(const IndexArray& tgt, const Tensor& memory, const std::vector<std::size_t>& src_lengths,
                Generator* dropout_gen = nullptr);
  /// Mean cross-entropy of decode(tgt_in) against `tgt_out` (targets equal to `ignore_index`
  /// are skipped), with the source `src` and `src_lengths` encoded first.
  Tensor loss(const IndexArray& src, const std::vector<std::size_t>& src_lengths, const IndexArray& tgt_in,
              const IndexArray& tgt_out, std::int64_t ignore_index = -100, Generator* dropout_gen = nullptr);

  /// Incremental decoding: one empty self-attention cache per decoder layer for `batch`
  /// samples and `capacity` positions.
  std::vector<KVCache> make_caches(std::size_t batch, std::size_t capacity) const;
  /// The memory's K and V heads for every decoder layer, computed once from `memory`.
  std::vector<std::pair<Tensor, Tensor>> memory_kv(const Tensor& memory) const;
  /// Logits of the next target positions `tgt_new` [B, n], with the per-layer `caches`, the
  /// memory's `memory_kv` and the source padding of `src_lengths`. If the call throws, the
  /// caches are left as they were.
  Tensor decode_cached(const IndexArray& tgt_new, std::vector<KVCache>& caches,
                       const std::vector<std::pair<Tensor, Tensor>>& memory_kv,
                       const std::vector<std::size_t>& src_lengths);

  /// Token and learned position embeddings (tok also gives the output logits). @{
  Embedding tok, pos;
  /// @}
  std::vector<std::unique_ptr<EncoderBlock>> encoder;  ///< The encoder blocks, in order.
  LayerNorm ln_enc;  ///< Layer norm after the encoder.
  std::vector<std::unique_ptr<CrossDecoderBlock>> decoder;  ///< The decoder blocks, in order.
  LayerNorm ln_f;  ///< Final layer norm of the decoder.

 private:
  Tensor embed(const IndexArray& tokens, std::size_t start, Generator* dropout_gen) const;
  TransformerConfig cfg_;
};

}  // namespace xg::nn
