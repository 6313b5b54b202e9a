// The model of bench_train_step (and bench_hvp, which times derivatives of the same model): a
// small GPT-style language model built from nn/ layers, --arch gpt or llama (see
// bench_train_step.cpp's file comment), and random token ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/nn/layers.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/ops/elementwise.hpp>

namespace bench {
namespace model_detail {
using namespace xg;

class BenchModel : public nn::Module {
 public:
  BenchModel(const nn::TransformerConfig& c, Generator& gen)
      : llama_(c.arch == nn::Architecture::llama),
        tok(c.V_vocab, c.d_model, gen),
        pos(c.context, c.d_model, gen),
        ln_f(c.d_model),
        norm(c.d_model, c.dtype, c.norm_eps),
        head(c.d_model, c.V_vocab, gen, /*bias=*/!llama_) {
    register_module("tok", tok);
    if (!llama_) register_module("pos", pos);
    for (std::size_t l = 0; l < c.layers; ++l) {
      if (llama_)
        blocks.push_back(std::make_unique<nn::LlamaBlock>(c, gen));
      else
        blocks.push_back(std::make_unique<nn::DecoderBlock>(c, gen));
      register_module("blocks." + std::to_string(l), *blocks.back());
    }
    register_module(llama_ ? "norm" : "ln_f", llama_ ? static_cast<nn::Module&>(norm) : ln_f);
    register_module("head", head);
    std::vector<std::int64_t> p(c.context);
    for (std::size_t t = 0; t < c.context; ++t) p[t] = static_cast<std::int64_t>(t);
    positions_ = IndexArray({c.context}, p);
    call_.visibility = nn::Visibility::causal(c.context, c.context);
  }

  // tokens [B, T] -> logits [B, T, vocab]
  Tensor operator()(const IndexArray& tokens) {
    Tensor h = llama_ ? tok(tokens) : tok(tokens) + pos(positions_);  // llama: RoPE in the blocks
    for (auto& block : blocks) h = (*block)(h, call_);
    return head(llama_ ? norm(h) : ln_f(h));
  }

 private:
  bool llama_;

 public:
  nn::Embedding tok, pos;
  std::vector<std::unique_ptr<nn::DecoderLayer>> blocks;
  nn::LayerNorm ln_f;
  nn::RMSNorm norm;
  nn::Linear head;

 private:
  IndexArray positions_;
  nn::AttentionCall call_;
};

inline IndexArray random_ids(const Shape& shape, std::size_t vocab, Generator& gen) {
  std::vector<std::int64_t> ids(numel(shape));
  for (auto& id : ids) id = static_cast<std::int64_t>(gen.below(vocab));
  return IndexArray(shape, ids);
}

}  // namespace model_detail

using model_detail::BenchModel;
using model_detail::random_ids;

}  // namespace bench
