// Pre-LN blocks, GPT and the encoder-decoder (see nn/transformer.hpp for the equations).
#include <xgrad/nn/transformer.hpp>

#include <cmath>
#include <limits>
#include <utility>

#include <xgrad/core/error.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/loss.hpp>
#include <xgrad/ops/matmul.hpp>

namespace xg::nn {

namespace {
// Lengths as the Visibility constructors take them (Position = std::int64_t).
std::vector<Position> positions(const std::vector<std::size_t>& lengths) {
  return std::vector<Position>(lengths.begin(), lengths.end());
}
}  // namespace

namespace {

const double kInitStd = 0.02;

// `causal_layer`: a decoder self-attention layer, which takes the model's sliding window.
AttentionConfig attention_config(const TransformerConfig& c, bool causal_layer = false) {
  AttentionConfig a;
  if (causal_layer) {
    a.window = c.window;
    a.core = c.attention;  // a registered core replaces the blocks' self-attention core
  }
  a.d_model = c.d_model;
  a.H_q = c.H_q;
  a.H_kv = c.H_kv;
  a.bias = c.arch == Architecture::gpt && c.bias;  // Llama: no biases anywhere
  a.dropout = c.dropout;
  a.dtype = c.dtype;
  if (c.pos == PositionScheme::rope) a.rope = c.rope;
  a.alibi = c.pos == PositionScheme::alibi;
  a.impl = c.impl;
  return a;
}

CrossAttentionConfig cross_config(const TransformerConfig& c) {
  CrossAttentionConfig a;
  a.d_q = a.d_m = c.d_model;
  a.H_q = c.H_q;
  a.H_kv = c.H_kv;
  a.dropout = c.dropout;
  a.dtype = c.dtype;
  a.impl = c.impl;
  return a;
}

// GPT-2 initialisation of an attention layer's projections: N(0, 0.02) for the inputs,
// N(0, 0.02 / sqrt(2 L)) for the residual output projection W_O.
void gpt2_init(const Tensor& W_in, const Tensor& W_out, std::size_t layers, Generator& gen) {
  Tensor in = W_in, out = W_out;
  in.set_value(random_normal(in.shape(), gen, in.dtype(), 0.0, kInitStd));
  out.set_value(random_normal(out.shape(), gen, out.dtype(), 0.0, kInitStd / std::sqrt(2.0 * layers)));
}

double residual_std(const TransformerConfig& c) { return kInitStd / std::sqrt(2.0 * c.layers); }

Tensor residual_dropout(const Tensor& y, double p, bool training, Generator* gen) {
  if (!training || p == 0.0) return y;
  if (!gen) throw ValueError(op_message("transformer", "dropout in training needs a generator"));
  return ops::dropout(y, p, *gen, true);
}

std::vector<std::int64_t> range(std::size_t start, std::size_t n) {
  std::vector<std::int64_t> r(n);
  for (std::size_t i = 0; i < n; ++i) r[i] = static_cast<std::int64_t>(start + i);
  return r;
}

// Token plus learned position embedding of tokens [B, T] at `positions` (empty: start ..
// start+T-1).
Tensor embed_tokens(const std::string& op, const Embedding& tok, const Embedding& pos, const TransformerConfig& c,
                    const IndexArray& tokens, std::size_t start, const std::vector<Position>& positions,
                    bool training, Generator* gen) {
  if (tokens.shape.size() != 2)
    throw ShapeError(op_message(op, "tokens must be [B, T], have shape " + shape_str(tokens.shape)));
  const std::size_t T = tokens.shape[1];
  if (T == 0)  // the rule: a model call needs at least one position (docs/reliability.md)
    throw ShapeError(op_message(op, "tokens have shape " + shape_str(tokens.shape) + ": T = 0 positions"));
  std::vector<std::int64_t> p;
  if (positions.empty()) {
    // Past the context only when decoding with a cache (start > 0) under a window no longer
    // than the context over relative or no positions: each query still sees W keys at most
    // W - 1 back, as in training (nn/generate.hpp).
    const bool endless = start > 0 && c.window > 0 && c.window <= c.context && c.pos != PositionScheme::learned;
    if (start + T > c.context && !endless)
      throw ValueError(op_message(op, "positions " + std::to_string(start) + ".." + std::to_string(start + T - 1) +
                                          " exceed the context length " + std::to_string(c.context)));
    p = range(start, T);
  } else {
    check_positions(op, positions, T);
    for (std::size_t i = 0; i < T; ++i)
      if (positions[i] >= static_cast<Position>(c.context))
        throw ValueError(op_message(op, "positions[" + std::to_string(i) + "] = " + std::to_string(positions[i]) +
                                            " is not below the context length " + std::to_string(c.context)));
    p = positions;
  }
  const Tensor h = c.pos == PositionScheme::learned ? tok(tokens) + pos(IndexArray({T}, p)) : tok(tokens);
  return residual_dropout(h, c.dropout, training, gen);
}

}  // namespace

std::string position_scheme_name(PositionScheme p) {
  switch (p) {
    case PositionScheme::learned: return "learned";
    case PositionScheme::rope: return "rope";
    case PositionScheme::alibi: return "alibi";
    case PositionScheme::none: return "none";
  }
  return "learned";
}

std::string architecture_name(Architecture a) { return a == Architecture::llama ? "llama" : "gpt"; }

Architecture architecture_from_name(const std::string& name) {
  for (const Architecture a : {Architecture::gpt, Architecture::llama})
    if (name == architecture_name(a)) return a;
  throw ValueError(op_message("transformer", "unknown architecture '" + name + "' (gpt or llama)"));
}

std::size_t llama_hidden_size(std::size_t d_model, std::size_t multiple_of) {
  if (multiple_of == 0) throw ValueError(op_message("transformer", "multiple_of must be positive"));
  const std::size_t big = std::numeric_limits<std::size_t>::max() / 8;
  if (multiple_of > big || d_model > big - multiple_of)
    throw ValueError(op_message("transformer", "d_model " + std::to_string(d_model) + " is too large"));
  const std::size_t hidden = 2 * (4 * d_model) / 3;  // int(2 * hidden_dim / 3), hidden_dim = 4 d
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

PositionScheme position_scheme_from_name(const std::string& name) {
  for (const PositionScheme p : {PositionScheme::learned, PositionScheme::rope, PositionScheme::alibi, PositionScheme::none})
    if (name == position_scheme_name(p)) return p;
  throw ValueError(op_message("transformer", "unknown position scheme '" + name + "' (learned, rope, alibi or none)"));
}

TransformerConfig TransformerConfig::resolved() const {
  TransformerConfig c = *this;
  if (c.H_kv == 0) c.H_kv = c.H_q;
  const std::string op = "transformer";
  if (c.arch == Architecture::llama) {
    if (c.multiple_of == 0) throw ValueError(op_message(op, "multiple_of must be positive (arch llama)"));
    if (c.pos != PositionScheme::rope)
      throw ValueError(op_message(op, "arch llama needs pos = rope (Llama's rotary positions), got pos = " +
                                          position_scheme_name(c.pos)));
    if (c.d_ff == 0) c.d_ff = llama_hidden_size(c.d_model, c.multiple_of);
  } else if (!c.tie_embeddings) {
    throw ValueError(op_message(op, "tie_embeddings = false needs arch llama (arch gpt ties the classifier to tok)"));
  }
  if (!c.bias && c.arch != Architecture::gpt)
    throw ValueError(op_message(op, "bias = false is for arch gpt (the Llama blocks have no biases either way)"));
  if (!(c.norm_eps > 0.0) || !std::isfinite(c.norm_eps))
    throw ValueError(op_message(op, "norm_eps must be positive and finite, got " + std::to_string(c.norm_eps)));
  if (c.d_ff == 0) c.d_ff = 4 * c.d_model;
  if (c.encoder_layers == 0) c.encoder_layers = c.layers;
  if (c.V_vocab == 0) throw ValueError(op_message(op, "V_vocab must be positive"));
  if (c.context == 0) throw ValueError(op_message(op, "context must be positive"));
  if (c.layers == 0) throw ValueError(op_message(op, "layers must be positive"));
  if (c.H_q == 0 || c.d_model % c.H_q != 0)
    throw ValueError(op_message(op, "d_model (" + std::to_string(c.d_model) + ") must be divisible by H_q (" +
                                        std::to_string(c.H_q) + ")"));
  if (c.H_q % c.H_kv != 0)
    throw ValueError(op_message(op, "H_q (" + std::to_string(c.H_q) + ") must be a multiple of H_kv (" +
                                        std::to_string(c.H_kv) + ")"));
  if (!(c.dropout >= 0.0 && c.dropout < 1.0))
    throw ValueError(op_message(op, "dropout must be in [0, 1), got " + std::to_string(c.dropout)));
  if (c.pos == PositionScheme::rope) ops::rope_rotary_dims(op, c.rope, c.d_model / c.H_q);
  return c;
}

// ---------------------------------------------------------------------------------------

DecoderLayer::DecoderLayer(const AttentionConfig& cfg, Generator& gen, double dropout)
    : attn(cfg, gen), dropout_(dropout) {}

Tensor DecoderLayer::operator()(const Tensor& x, const AttentionCall& call, AttentionOutput* out) {
  return forward_impl(x, nullptr, call, out);
}

Tensor DecoderLayer::forward_cached(const Tensor& x, KVCache& cache, const AttentionCall& call, AttentionOutput* out) {
  return forward_impl(x, &cache, call, out);
}

Tensor DecoderLayer::forward_impl(const Tensor& x, KVCache* cache, const AttentionCall& call, AttentionOutput* out) {
  const Tensor n = attention_input(x);
  const AttentionOutput a = cache ? attn.forward_cached(n, *cache, call) : attn.forward(n, call);
  if (out) *out = a;
  const Tensor h = x + residual_dropout(a.Y, dropout_, training(), call.generator);
  return ffn_residual(h, call.generator);
}

Tensor DecoderLayer::ffn_residual(const Tensor& h, Generator* gen) {
  return h + residual_dropout(ffn_branch(h, gen), dropout_, training(), gen);
}

bool DecoderLayer::residual_dropout_on() const { return training() && dropout_ > 0.0; }

namespace {
const TransformerConfig& check_arch(const TransformerConfig& c, Architecture want, const std::string& block) {
  if (c.arch != want)
    throw ValueError(op_message(block, "config arch is " + architecture_name(c.arch) + ", a " + block + " needs arch " +
                                           architecture_name(want)));
  return c;
}
}  // namespace

// The attention layer is drawn before ffn (the base is constructed first): the same draws in
// the same order as before DecoderLayer existed (the layer norms draw nothing).
DecoderBlock::DecoderBlock(const TransformerConfig& c, Generator& gen)
    : DecoderLayer(attention_config(check_arch(c, Architecture::gpt, "DecoderBlock"), true), gen, c.dropout),
      ln1(c.d_model, c.dtype, LayerNorm::kDefaultEps, c.bias), ln2(c.d_model, c.dtype, LayerNorm::kDefaultEps, c.bias),
      ffn(c.d_model, c.d_ff, gen, c.dropout, c.dtype, residual_std(c), c.bias) {
  gpt2_init(attn.W_QKV, attn.W_O, c.layers, gen);
  if (!c.activation.empty()) ffn.activation = make_activation(c.activation);
  register_module("ln1", ln1);
  register_module("attn", attn);
  register_module("ln2", ln2);
  register_module("ffn", ffn);
}

Tensor DecoderBlock::attention_input(const Tensor& x) { return ln1(x); }

Tensor DecoderBlock::ffn_branch(const Tensor& h, Generator* gen) { return ffn(ln2(h), gen); }

Tensor DecoderBlock::ffn_residual(const Tensor& h, Generator* gen) {
  if (residual_dropout_on()) return DecoderLayer::ffn_residual(h, gen);
  return ffn.with_residual(ln2(h), h, gen);  // h + ffn(ln2(h)), the sum in fc2's op
}

LlamaBlock::LlamaBlock(const TransformerConfig& c, Generator& gen)
    : DecoderLayer(attention_config(check_arch(c, Architecture::llama, "LlamaBlock"), true), gen, c.dropout),
      attn_norm(c.d_model, c.dtype, c.norm_eps), ffn_norm(c.d_model, c.dtype, c.norm_eps),
      ffn(c.d_model, c.d_ff, gen, c.dtype, residual_std(c)) {
  gpt2_init(attn.W_QKV, attn.W_O, c.layers, gen);
  if (!c.activation.empty()) ffn.activation = make_activation(c.activation);
  register_module("attn_norm", attn_norm);
  register_module("attn", attn);
  register_module("ffn_norm", ffn_norm);
  register_module("ffn", ffn);
}

Tensor LlamaBlock::attention_input(const Tensor& x) { return attn_norm(x); }

Tensor LlamaBlock::ffn_branch(const Tensor& h, Generator*) { return ffn(ffn_norm(h)); }

namespace {
// The built-in layers behind the registry's interfaces, their parameters under their own names
// (registered with an empty name: "ln1.gamma", "ffn.fc1.W").
template <class L>
class BuiltinNorm : public NormLayer {
 public:
  template <class... A>
  explicit BuiltinNorm(A&&... a) : inner(std::forward<A>(a)...) { register_module("", inner); }
  Tensor operator()(const Tensor& x) const override { return inner(x); }
  L inner;
};

class BuiltinGeluMLP : public MLPLayer {
 public:
  BuiltinGeluMLP(const TransformerConfig& c, Generator& gen)
      : inner(c.d_model, c.d_ff, gen, c.dropout, c.dtype, residual_std(c), c.bias) {
    if (!c.activation.empty()) inner.activation = make_activation(c.activation);
    register_module("", inner);
  }
  Tensor operator()(const Tensor& x, Generator* gen) const override { return inner(x, gen); }
  FeedForward inner;
};

class BuiltinSwiGLUMLP : public MLPLayer {
 public:
  BuiltinSwiGLUMLP(const TransformerConfig& c, Generator& gen) : inner(c.d_model, c.d_ff, gen, c.dtype, residual_std(c)) {
    if (!c.activation.empty()) inner.activation = make_activation(c.activation);
    register_module("", inner);
  }
  Tensor operator()(const Tensor& x, Generator*) const override { return inner(x); }
  SwiGLUFeedForward inner;
};

// A norm of width d_model: the registered one of c.norm, else the arch's built-in.
std::unique_ptr<NormLayer> block_norm(const TransformerConfig& c) {
  if (!c.norm.empty()) return make_norm(c.norm, c, c.d_model);
  if (c.arch == Architecture::llama) return std::make_unique<BuiltinNorm<RMSNorm>>(c.d_model, c.dtype, c.norm_eps);
  return std::make_unique<BuiltinNorm<LayerNorm>>(c.d_model, c.dtype, LayerNorm::kDefaultEps, c.bias);
}

const TransformerConfig& checked_layers(const TransformerConfig& c) {
  check_registered_layers(c);
  return c;
}
}  // namespace

// Draws in the built-in blocks' order: the attention (base), the feed-forward layer, then the
// attention's GPT-2 initialisation (norms draw nothing).
RegisteredBlock::RegisteredBlock(const TransformerConfig& c, Generator& gen)
    : DecoderLayer(attention_config(checked_layers(c), true), gen, c.dropout) {
  const bool llama = c.arch == Architecture::llama;
  norm1 = block_norm(c);
  norm2 = block_norm(c);
  if (!c.mlp.empty()) {
    ffn = make_mlp(c.mlp, c, gen);
  } else if (llama) {
    ffn = std::make_unique<BuiltinSwiGLUMLP>(c, gen);
  } else {
    ffn = std::make_unique<BuiltinGeluMLP>(c, gen);
  }
  gpt2_init(attn.W_QKV, attn.W_O, c.layers, gen);
  register_module(llama ? "attn_norm" : "ln1", *norm1);
  register_module("attn", attn);
  register_module(llama ? "ffn_norm" : "ln2", *norm2);
  register_module("ffn", *ffn);
}

Tensor RegisteredBlock::attention_input(const Tensor& x) {
  Tensor y = (*norm1)(x);
  if (!y.defined() || y.shape() != x.shape())
    throw ShapeError(op_message("transformer", "registered norm turned " + shape_str(x.shape()) + " into " +
                                                   (y.defined() ? shape_str(y.shape()) : std::string("nothing"))));
  return y;
}

Tensor RegisteredBlock::ffn_branch(const Tensor& h, Generator* gen) {
  const Tensor n = (*norm2)(h);
  if (!n.defined() || n.shape() != h.shape())
    throw ShapeError(op_message("transformer", "registered norm turned " + shape_str(h.shape()) + " into " +
                                                   (n.defined() ? shape_str(n.shape()) : std::string("nothing"))));
  Tensor y = (*ffn)(n, gen);
  if (!y.defined() || y.shape() != h.shape())
    throw ShapeError(op_message("transformer", "the mlp turned " + shape_str(h.shape()) + " into " +
                                                   (y.defined() ? shape_str(y.shape()) : std::string("nothing")) +
                                                   ": a feed-forward sub-layer keeps the shape [..., d_model]"));
  return y;
}

EncoderBlock::EncoderBlock(const TransformerConfig& c, Generator& gen)
    : ln1(c.d_model, c.dtype), ln2(c.d_model, c.dtype), attn(attention_config(c), gen),
      ffn(c.d_model, c.d_ff, gen, c.dropout, c.dtype, kInitStd / std::sqrt(2.0 * c.encoder_layers)),
      dropout_(c.dropout) {
  gpt2_init(attn.W_QKV, attn.W_O, c.encoder_layers, gen);
  register_module("ln1", ln1);
  register_module("attn", attn);
  register_module("ln2", ln2);
  register_module("ffn", ffn);
}

Tensor EncoderBlock::operator()(const Tensor& x, const AttentionCall& call) {
  const Tensor h = x + residual_dropout(attn.forward(ln1(x), call).Y, dropout_, training(), call.generator);
  return h + residual_dropout(ffn(ln2(h), call.generator), dropout_, training(), call.generator);
}

CrossDecoderBlock::CrossDecoderBlock(const TransformerConfig& c, Generator& gen)
    : ln1(c.d_model, c.dtype), ln2(c.d_model, c.dtype), ln3(c.d_model, c.dtype), attn(attention_config(c, true), gen),
      cross(cross_config(c), gen), ffn(c.d_model, c.d_ff, gen, c.dropout, c.dtype, residual_std(c)),
      dropout_(c.dropout) {
  gpt2_init(attn.W_QKV, attn.W_O, c.layers, gen);
  Tensor W_Q = cross.W_Q;
  W_Q.set_value(random_normal(W_Q.shape(), gen, c.dtype, 0.0, kInitStd));
  gpt2_init(cross.W_KV, cross.W_O, c.layers, gen);
  register_module("ln1", ln1);
  register_module("attn", attn);
  register_module("ln2", ln2);
  register_module("cross", cross);
  register_module("ln3", ln3);
  register_module("ffn", ffn);
}

Tensor CrossDecoderBlock::operator()(const Tensor& x, const AttentionCall& self_call,
                                     const std::pair<Tensor, Tensor>& memory_kv, const AttentionCall& cross_call) {
  Tensor h = x + residual_dropout(attn.forward(ln1(x), self_call).Y, dropout_, training(), self_call.generator);
  h = h + residual_dropout(cross.forward_with_memory(ln2(h), memory_kv, cross_call).Y, dropout_, training(),
                           self_call.generator);
  return h + residual_dropout(ffn(ln3(h), self_call.generator), dropout_, training(), self_call.generator);
}

Tensor CrossDecoderBlock::forward_cached(const Tensor& x, KVCache& cache, const AttentionCall& self_call,
                                         const std::pair<Tensor, Tensor>& memory_kv, const AttentionCall& cross_call) {
  Tensor h = x + residual_dropout(attn.forward_cached(ln1(x), cache, self_call).Y, dropout_, training(),
                                  self_call.generator);
  h = h + residual_dropout(cross.forward_with_memory(ln2(h), memory_kv, cross_call).Y, dropout_, training(),
                           self_call.generator);
  return h + residual_dropout(ffn(ln3(h), self_call.generator), dropout_, training(), self_call.generator);
}

FeedForward* gelu_ffn(DecoderLayer& block) {
  if (auto* b = dynamic_cast<DecoderBlock*>(&block)) return &b->ffn;
  if (auto* r = dynamic_cast<RegisteredBlock*>(&block))
    if (auto* f = dynamic_cast<BuiltinGeluMLP*>(r->ffn.get())) return &f->inner;
  return nullptr;
}

const FeedForward* gelu_ffn(const DecoderLayer& block) { return gelu_ffn(const_cast<DecoderLayer&>(block)); }

SwiGLUFeedForward* swiglu_ffn(DecoderLayer& block) {
  if (auto* b = dynamic_cast<LlamaBlock*>(&block)) return &b->ffn;
  if (auto* r = dynamic_cast<RegisteredBlock*>(&block))
    if (auto* f = dynamic_cast<BuiltinSwiGLUMLP*>(r->ffn.get())) return &f->inner;
  return nullptr;
}

const SwiGLUFeedForward* swiglu_ffn(const DecoderLayer& block) { return swiglu_ffn(const_cast<DecoderLayer&>(block)); }

// ---------------------------------------------------------------------------------------

GPT::GPT(const TransformerConfig& c, Generator& gen)
    : tok(c.resolved().V_vocab, c.d_model, gen, c.dtype), pos(c.resolved().context, c.d_model, gen, c.dtype),
      ln_f(c.d_model, c.dtype, LayerNorm::kDefaultEps, c.bias), norm(c.d_model, c.dtype, c.resolved().norm_eps),
      cfg_(c.resolved()) {
  const bool llama = cfg_.arch == Architecture::llama;
  check_registered_layers(cfg_);
  const bool registered = !cfg_.mlp.empty() || !cfg_.norm.empty();
  register_module("tok", tok);
  if (cfg_.pos == PositionScheme::learned) register_module("pos", pos);
  for (std::size_t l = 0; l < cfg_.layers; ++l) {
    if (registered)
      blocks.push_back(std::make_unique<RegisteredBlock>(cfg_, gen));
    else if (llama)
      blocks.push_back(std::make_unique<LlamaBlock>(cfg_, gen));
    else
      blocks.push_back(std::make_unique<DecoderBlock>(cfg_, gen));
    register_module("blocks." + std::to_string(l), *blocks.back());
  }
  if (!cfg_.norm.empty()) {
    registered_norm = make_norm(cfg_.norm, cfg_, cfg_.d_model);
    register_module(llama ? "norm" : "ln_f", *registered_norm);
  } else {
    register_module(llama ? "norm" : "ln_f", llama ? static_cast<Module&>(norm) : static_cast<Module&>(ln_f));
  }
  if (!cfg_.tie_embeddings) {
    classifier = std::make_unique<Embedding>(cfg_.V_vocab, cfg_.d_model, gen, cfg_.dtype);
    register_module("classifier", *classifier);
  }
}

const Tensor& GPT::classifier_weight() const { return classifier ? classifier->weight : tok.weight; }

Tensor GPT::embed(const IndexArray& tokens, const std::vector<Position>& positions, Generator* gen) const {
  return embed_tokens("gpt", tok, pos, cfg_, tokens, 0, positions, training(), gen);
}

Tensor GPT::head(const Tensor& h) const {
  const Tensor n = registered_norm ? (*registered_norm)(h) : cfg_.arch == Architecture::llama ? norm(h) : ln_f(h);
  return ops::matmul(n, classifier_weight(), {false, true});
}

Tensor GPT::logits(const IndexArray& tokens, Generator* gen, std::vector<AttentionOutput>* attn) {
  return logits(tokens, GPTCall{}, gen, attn);
}

Tensor GPT::logits(const IndexArray& tokens, const GPTCall& c, Generator* gen, std::vector<AttentionOutput>* attn) {
  Tensor h = embed(tokens, c.positions, gen);
  const std::size_t T = tokens.shape[1];
  AttentionCall call;
  call.visibility = c.visibility.unconstrained() ? Visibility::causal(T, T) : Visibility::causal(T, T) & c.visibility;
  call.positions = c.positions;
  call.generator = gen;
  call.return_weights = attn != nullptr;
  if (attn) attn->assign(blocks.size(), AttentionOutput{});
  for (std::size_t l = 0; l < blocks.size(); ++l) h = (*blocks[l])(h, call, attn ? &(*attn)[l] : nullptr);
  return head(h);
}

Tensor GPT::loss(const IndexArray& tokens, const IndexArray& targets, std::int64_t ignore_index, Generator* gen) {
  return loss(tokens, targets, GPTCall{}, ignore_index, gen);
}

Tensor GPT::loss(const IndexArray& tokens, const IndexArray& targets, const GPTCall& call, std::int64_t ignore_index,
                 Generator* gen) {
  ops::CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  return ops::cross_entropy(logits(tokens, call, gen), targets, o);
}

std::vector<KVCache> GPT::make_caches(std::size_t batch, std::size_t capacity) const {
  std::vector<KVCache> caches;
  for (const auto& b : blocks) caches.push_back(b->attn.make_cache(batch, capacity));
  return caches;
}

Tensor GPT::logits_cached(const IndexArray& tokens_new, std::vector<KVCache>& caches) {
  if (caches.size() != blocks.size())
    throw ValueError(op_message("gpt", "need one KV cache per layer: " + std::to_string(blocks.size()) + " layers, " +
                                           std::to_string(caches.size()) + " caches"));
  const std::size_t start = caches[0].next_position();
  Tensor h = embed_tokens("gpt", tok, pos, cfg_, tokens_new, start, {}, training(), nullptr);
  const AttentionCall call;  // causal by absolute position inside forward_cached
  try {
    for (std::size_t l = 0; l < blocks.size(); ++l) h = blocks[l]->forward_cached(h, caches[l], call);
  } catch (...) {  // keep the layers' caches in step
    for (auto& c : caches) c.truncate(std::min(start, c.next_position()));
    throw;
  }
  return head(h);
}

// ---------------------------------------------------------------------------------------

EncoderDecoder::EncoderDecoder(const TransformerConfig& c, Generator& gen)
    : tok(c.resolved().V_vocab, c.d_model, gen, c.dtype), pos(c.resolved().context, c.d_model, gen, c.dtype),
      ln_enc(c.d_model, c.dtype), ln_f(c.d_model, c.dtype), cfg_(c.resolved()) {
  if (cfg_.arch != Architecture::gpt)
    throw ValueError(op_message("encoder_decoder", "arch " + architecture_name(cfg_.arch) +
                                                       ": the encoder-decoder is built from GPT-2 blocks only"));
  if (!cfg_.activation.empty() || !cfg_.mlp.empty() || !cfg_.norm.empty() || !cfg_.attention.empty())
    throw ValueError(
        op_message("encoder_decoder", "registered layers (activation, mlp, norm, attention) are for GPT models only"));
  if (!cfg_.bias) throw ValueError(op_message("encoder_decoder", "bias = false is for GPT models only"));
  if (cfg_.pos != PositionScheme::learned)
    throw ValueError(op_message("encoder_decoder", "position scheme '" + position_scheme_name(cfg_.pos) +
                                                       "': the encoder-decoder has learned position embeddings only"));
  register_module("tok", tok);
  register_module("pos", pos);
  for (std::size_t l = 0; l < cfg_.encoder_layers; ++l) {
    encoder.push_back(std::make_unique<EncoderBlock>(cfg_, gen));
    register_module("encoder." + std::to_string(l), *encoder.back());
  }
  register_module("ln_enc", ln_enc);
  for (std::size_t l = 0; l < cfg_.layers; ++l) {
    decoder.push_back(std::make_unique<CrossDecoderBlock>(cfg_, gen));
    register_module("decoder." + std::to_string(l), *decoder.back());
  }
  register_module("ln_f", ln_f);
}

Tensor EncoderDecoder::embed(const IndexArray& tokens, std::size_t start, Generator* gen) const {
  return embed_tokens("encoder_decoder", tok, pos, cfg_, tokens, start, {}, training(), gen);
}

Tensor EncoderDecoder::encode(const IndexArray& src, const std::vector<std::size_t>& src_lengths, Generator* gen) {
  Tensor h = embed(src, 0, gen);
  AttentionCall call;
  call.visibility = Visibility::key_lengths(positions(src_lengths), src.shape[1]);  // bidirectional, padding hidden
  call.generator = gen;
  for (auto& block : encoder) h = (*block)(h, call);
  return ln_enc(h);
}

std::vector<std::pair<Tensor, Tensor>> EncoderDecoder::memory_kv(const Tensor& memory) const {
  std::vector<std::pair<Tensor, Tensor>> kv;
  for (const auto& block : decoder) kv.push_back(block->cross.project_memory(memory));
  return kv;
}

Tensor EncoderDecoder::decode(const IndexArray& tgt, const Tensor& memory, const std::vector<std::size_t>& src_lengths,
                              Generator* gen) {
  Tensor h = embed(tgt, 0, gen);
  const std::size_t T = tgt.shape[1];
  AttentionCall self_call, cross_call;
  self_call.visibility = Visibility::causal(T, T);
  self_call.generator = cross_call.generator = gen;
  cross_call.visibility = Visibility::key_lengths(positions(src_lengths), memory.shape()[1]);  // no causal mask here
  const auto kv = memory_kv(memory);
  for (std::size_t l = 0; l < decoder.size(); ++l) h = (*decoder[l])(h, self_call, kv[l], cross_call);
  return ops::matmul(ln_f(h), tok.weight, {false, true});
}

Tensor EncoderDecoder::loss(const IndexArray& src, const std::vector<std::size_t>& src_lengths,
                            const IndexArray& tgt_in, const IndexArray& tgt_out, std::int64_t ignore_index,
                            Generator* gen) {
  ops::CrossEntropyOptions o;
  o.ignore_index = ignore_index;
  return ops::cross_entropy(decode(tgt_in, encode(src, src_lengths, gen), src_lengths, gen), tgt_out, o);
}

std::vector<KVCache> EncoderDecoder::make_caches(std::size_t batch, std::size_t capacity) const {
  std::vector<KVCache> caches;
  for (const auto& b : decoder) caches.push_back(b->attn.make_cache(batch, capacity));
  return caches;
}

Tensor EncoderDecoder::decode_cached(const IndexArray& tgt_new, std::vector<KVCache>& caches,
                                     const std::vector<std::pair<Tensor, Tensor>>& kv,
                                     const std::vector<std::size_t>& src_lengths) {
  if (caches.size() != decoder.size() || kv.size() != decoder.size())
    throw ValueError(op_message("encoder_decoder", "need one KV cache and one memory K/V pair per decoder layer"));
  const std::size_t start = caches[0].next_position();
  Tensor h = embed(tgt_new, start, nullptr);
  AttentionCall self_call, cross_call;
  cross_call.visibility = Visibility::key_lengths(positions(src_lengths), kv[0].first.shape()[2]);
  try {
    for (std::size_t l = 0; l < decoder.size(); ++l)
      h = decoder[l]->forward_cached(h, caches[l], self_call, kv[l], cross_call);
  } catch (...) {  // keep the layers' caches in step
    for (auto& c : caches) c.truncate(std::min(start, c.next_position()));
    throw;
  }
  return ops::matmul(ln_f(h), tok.weight, {false, true});
}

}  // namespace xg::nn
