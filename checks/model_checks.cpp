// Checks of the basic layers (nn/layers.hpp), the transformer blocks and the two models
// (nn/transformer.hpp), each with respect to its inputs and every parameter through
// gradcheck_leaves. Parameters are re-drawn from uniform [-0.6, 0.6] (GPT-2's 0.02 init and
// zero biases would leave most terms too small to see, and a bias bug invisible); models
// run without dropout, so f is deterministic. GELU and layer norm have no kinks. Both models'
// incremental decoding is checked against their full forward by the KV-cache checker
// (checks/kv_cache_check.hpp), the same one users point at their own decoders. The Llama
// model (arch llama) gets the same two checks: its loss gradient and its (windowed) KV cache.
// LoRA (nn/lora.hpp): the layer with respect to its input and factors (the base weight
// frozen), and the Llama model's loss with respect to every adapter, B re-drawn away from its
// zero start (at B = 0 the gradient of A is zero and a bug in it would not show).
#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/detail/common.hpp>
#include <xgrad/checks/kv_cache_check.hpp>
#include <xgrad/nn/layers.hpp>
#include <xgrad/nn/lora.hpp>
#include <xgrad/nn/transformer.hpp>

namespace xg::checks {

namespace {

using Leaves = std::vector<std::pair<std::string, Tensor>>;

void randomise(nn::Module& m, CheckContext& ctx, double a = 0.6) {
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    t.set_value(ctx.uniform(t.shape(), -a, a));
  }
}

Leaves with_inputs(const nn::Module& m, Leaves inputs) {
  for (auto& kv : m.named_parameters()) inputs.push_back(kv);
  return inputs;
}

nn::TransformerConfig tiny(CheckContext& ctx, std::size_t layers = 1) {
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 8;
  c.d_model = ctx.full() ? 16 : 8;
  c.H_q = ctx.full() ? 4 : 2;
  c.H_kv = 2;  // --full: GQA
  c.layers = layers;
  c.d_ff = 2 * c.d_model;
  c.dtype = ctx.dtype();
  return c.resolved();
}

// A tiny Llama model (RMSNorm, RoPE, no biases, SwiGLU; GQA with H_kv 2 < H_q 4).
nn::TransformerConfig tiny_llama(CheckContext& ctx, bool tied, std::size_t window = 0) {
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = 11;
  c.context = 8;
  c.d_model = 8;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = 2;
  c.multiple_of = 4;  // d_ff = 2 * 32 / 3 = 21 -> 24
  c.tie_embeddings = tied;
  c.window = window;
  c.dtype = ctx.dtype();
  return c.resolved();
}

IndexArray random_tokens(CheckContext& ctx, std::size_t B, std::size_t T, std::size_t V_vocab) {
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = static_cast<std::int64_t>(ctx.gen().below(V_vocab));
  return IndexArray({B, T}, ids);
}

// The KV-cache checker's view of a GPT (either architecture): full logits, `batch` empty
// caches of `capacity` positions, and cached logits.
KVCacheDecoder gpt_decoder(const std::shared_ptr<nn::GPT>& m, std::size_t batch, std::size_t capacity) {
  return kv_cache_decoder([m](const IndexArray& t) { return m->logits(t); },
                          [m, batch, capacity] { return m->make_caches(batch, capacity); },
                          [m](std::vector<nn::KVCache>& caches, const IndexArray& t) {
                            return m->logits_cached(t, caches);
                          });
}

// A block of tiny(ctx)'s sizes: its gradient on x (2, 4, d) under `vis`, w.r.t. x and all
// parameters.
template <class Block>
CheckResult block_gradcheck(CheckContext& ctx, const nn::Visibility& vis) {
  const nn::TransformerConfig c = tiny(ctx);
  Block m(c, ctx.gen());
  randomise(m, ctx);
  const Tensor x(ctx.uniform({2, 4, c.d_model}), true);
  const nn::AttentionCall call = make_call(vis);
  return ctx.gradcheck_leaves([&] { return m(x, call); }, with_inputs(m, {{"x", x}}));
}

// A GPT of config `c` with weights randomised to +-a: its loss on tokens (2, 6) below 11, target
// number `ignored` set to -100, w.r.t. all parameters.
CheckResult gpt_loss_gradcheck(CheckContext& ctx, const nn::TransformerConfig& c, double a, std::size_t ignored) {
  nn::GPT m(c, ctx.gen());
  randomise(m, ctx, a);
  const IndexArray tokens = random_tokens(ctx, 2, 6, 11);
  IndexArray targets = random_tokens(ctx, 2, 6, 11);
  targets.data[ignored] = -100;
  return ctx.gradcheck_leaves([&] { return m.loss(tokens, targets); }, m.named_parameters());
}

// A KV-cache case: a GPT of config `c` with weights randomised to +-a, 2 caches of 8
// positions, tokens (2, 8) below 11.
KVCacheCheck gpt_kv_cache_case(CheckContext& ctx, const nn::TransformerConfig& c, double a) {
  auto m = std::make_shared<nn::GPT>(c, ctx.gen());
  randomise(*m, ctx, a);
  KVCacheCheck k;
  k.decoder = gpt_decoder(m, 2, 8);
  k.input = random_tokens(ctx, 2, 8, 11);
  return k;
}

}  // namespace

void register_model_checks(GradcheckSuite& s) {
  s.add("layers/linear", "gradient", "Linear 5 -> 4 with bias, x (2, 3, 5); x, W, b", [](CheckContext& ctx) {
    nn::Linear m(5, 4, ctx.gen(), true, ctx.dtype());
    randomise(m, ctx);
    const Tensor x(ctx.uniform({2, 3, 5}), true);
    return ctx.gradcheck_leaves([&] { return m(x); }, with_inputs(m, {{"x", x}}));
  });
  s.add("layers/lora-linear", "gradient",
        "LoRALinear 5 -> 4 with bias, rank 2, alpha 3; x (2, 3, 5); x, lora_A, lora_B (W, b frozen)",
        [](CheckContext& ctx) {
          nn::Linear base(5, 4, ctx.gen(), true, ctx.dtype());
          randomise(base, ctx);
          nn::LoRALinear m(base, {2, 3.0}, ctx.gen());
          randomise(m, ctx);
          const Tensor x(ctx.uniform({2, 3, 5}), true);
          Leaves leaves = {{"x", x}};
          for (auto& kv : m.named_trainable_parameters()) leaves.push_back(kv);
          return ctx.gradcheck_leaves([&] { return m(x); }, leaves);
        });
  s.add("layers/embedding", "gradient", "Embedding V_vocab 7, d 4, ids (2, 3) with repeats; weight",
        [](CheckContext& ctx) {
          nn::Embedding m(7, 4, ctx.gen(), ctx.dtype());
          randomise(m, ctx);
          const IndexArray ids({2, 3}, {6, 1, 6, 0, 1, 1});
          return ctx.gradcheck_leaves([&] { return m(ids); }, with_inputs(m, {}));
        });
  s.add("layers/layer_norm", "gradient", "LayerNorm d 6, x (3, 6); x, gamma, beta", [](CheckContext& ctx) {
    nn::LayerNorm m(6, ctx.dtype());
    randomise(m, ctx);
    const Tensor x(ctx.uniform({3, 6}, -2, 2), true);
    return ctx.gradcheck_leaves([&] { return m(x); }, with_inputs(m, {{"x", x}}));
  });
  s.add("layers/feed_forward", "gradient", "FeedForward d 6 -> 12 -> 6 (GELU), x (2, 3, 6); x and all parameters",
        [](CheckContext& ctx) {
          nn::FeedForward m(6, 12, ctx.gen(), 0.0, ctx.dtype());
          randomise(m, ctx);
          const Tensor x(ctx.uniform({2, 3, 6}), true);
          return ctx.gradcheck_leaves([&] { return m(x); }, with_inputs(m, {{"x", x}}));
        });
  s.add("layers/decoder-block", "gradient", "pre-LN DecoderBlock d 8, H 2, d_ff 16; causal; x (2, 4, 8), all parameters",
        [](CheckContext& ctx) { return block_gradcheck<nn::DecoderBlock>(ctx, nn::Visibility::causal(4, 4)); });
  s.add("layers/encoder-block", "gradient", "pre-LN EncoderBlock d 8, H 2; key padding {4, 2}; x (2, 4, 8), all parameters",
        [](CheckContext& ctx) { return block_gradcheck<nn::EncoderBlock>(ctx, nn::Visibility::key_lengths({4, 2}, 4)); });
  s.add("layers/cross-decoder-block", "gradient",
        "CrossDecoderBlock d 8, H 2: causal self, cross to memory (2, 5, 8) with padding; x, memory, all parameters",
        [](CheckContext& ctx) {
          const nn::TransformerConfig c = tiny(ctx);
          nn::CrossDecoderBlock m(c, ctx.gen());
          randomise(m, ctx);
          const Tensor x(ctx.uniform({2, 3, c.d_model}), true), memory(ctx.uniform({2, 5, c.d_model}), true);
          const nn::AttentionCall self_call = make_call(nn::Visibility::causal(3, 3));
          const nn::AttentionCall cross_call = make_call(nn::Visibility::key_lengths({5, 3}, 5));
          return ctx.gradcheck_leaves([&] { return m(x, self_call, m.cross.project_memory(memory), cross_call); },
                                      with_inputs(m, {{"x", x}, {"memory", memory}}));
        });
  s.add("models/gpt-loss", "gradient",
        "tiny GPT (V 11, context 8, d 8, H 2, 2 layers, d_ff 16), tokens (2, 6), one ignored target; "
        "loss w.r.t. all parameters (--full: d 16, GQA)",
        [](CheckContext& ctx) {
          CheckResult r = gpt_loss_gradcheck(ctx, tiny(ctx, 2), 0.3, 3);
          if (ctx.full()) r.config = "GPT V 11, d 16, H_q 4, H_kv 2, 2 layers, d_ff 32, tokens (2, 6); all parameters";
          return r;
        });
  s.add("models/encoder-decoder-loss", "gradient",
        "tiny encoder-decoder (V 11, d 8, H 2, 1 + 1 layers), src (2, 5) with lengths {5, 3}, tgt (2, 4); "
        "loss w.r.t. all parameters",
        [](CheckContext& ctx) {
          nn::EncoderDecoder m(tiny(ctx, 1), ctx.gen());
          randomise(m, ctx, 0.3);
          const IndexArray src = random_tokens(ctx, 2, 5, 11), tgt_in = random_tokens(ctx, 2, 4, 11),
                           tgt_out = random_tokens(ctx, 2, 4, 11);
          const std::vector<std::size_t> lengths = {5, 3};
          return ctx.gradcheck_leaves([&] { return m.loss(src, lengths, tgt_in, tgt_out); }, m.named_parameters());
        });
  add_kv_cache_check(
      s, "models/gpt-kv-cache",
      "tiny GPT (V 11, context 8, d 8, H 2, 2 layers), tokens (2, 8): logits_cached in 5 schedules and prefix "
      "isolation vs logits (--full: d 16, GQA)",
      [](CheckContext& ctx) {
        return gpt_kv_cache_case(ctx, tiny(ctx, 2), 0.3);
      });
  s.add("models/llama", "gradient",
        "tiny Llama (V 11, d 8, H_q 4, H_kv 2, 2 layers, d_ff 24, RoPE, tied classifier), tokens (2, 6), one "
        "ignored target; loss w.r.t. all parameters",
        [](CheckContext& ctx) {
          return gpt_loss_gradcheck(ctx, tiny_llama(ctx, true), 0.5, 4);
        });
  s.add("models/llama-lora", "gradient",
        "tiny Llama as models/llama with rank-2 LoRA on q, k, v, o, gate, up, down (base frozen); loss "
        "w.r.t. every adapter",
        [](CheckContext& ctx) {
          nn::GPT m(tiny_llama(ctx, true), ctx.gen());
          randomise(m, ctx, 0.5);
          nn::add_lora(m, "all", {2, 4.0}, ctx.gen());
          randomise(m, ctx, 0.5);  // B away from zero; the frozen weights too (they stay frozen)
          const IndexArray tokens = random_tokens(ctx, 2, 6, 11);
          const IndexArray targets = random_tokens(ctx, 2, 6, 11);
          return ctx.gradcheck_leaves([&] { return m.loss(tokens, targets); }, m.named_trainable_parameters());
        });
  add_kv_cache_check(
      s, "models/llama-kv-cache",
      "tiny Llama (V 11, d 8, H_q 4, H_kv 2, 2 layers, window 3, untied classifier), tokens (2, 8): "
      "logits_cached in 5 schedules and prefix isolation vs logits",
      [](CheckContext& ctx) {
        return gpt_kv_cache_case(ctx, tiny_llama(ctx, false, 3), 0.5);
      });
  add_kv_cache_check(
      s, "models/encoder-decoder-kv-cache",
      "tiny encoder-decoder (V 11, d 8, H 2, 1 + 1 layers), src (2, 5) with lengths {5, 3}, tgt (2, 6): "
      "decode_cached in 5 schedules and prefix isolation vs decode",
      [](CheckContext& ctx) {
        auto m = std::make_shared<nn::EncoderDecoder>(tiny(ctx, 1), ctx.gen());
        randomise(*m, ctx, 0.3);
        const IndexArray src = random_tokens(ctx, 2, 5, 11);
        const std::vector<std::size_t> lengths = {5, 3};
        NoGradGuard ng;
        const Tensor memory = m->encode(src, lengths);
        auto kv = std::make_shared<std::vector<std::pair<Tensor, Tensor>>>(m->memory_kv(memory));
        KVCacheCheck k;
        k.decoder = kv_cache_decoder(
            [m, memory, lengths](const IndexArray& t) { return m->decode(t, memory, lengths); },
            [m] { return m->make_caches(2, 6); },
            [m, kv, lengths](std::vector<nn::KVCache>& caches, const IndexArray& t) {
              return m->decode_cached(t, caches, *kv, lengths);
            });
        k.input = random_tokens(ctx, 2, 6, 11);
        return k;
      });
}

}  // namespace xg::checks
