// One full training step of a small GPT-style language model (issue 8, "Benchmarks"):
// zero grads, forward, cross-entropy on random targets, backward, AdamW. The libtorch
// reference (bench/torch/torch_bench_train_step.cpp) builds the same model.
//
// Model: token + learned position embeddings; `layers` pre-LayerNorm blocks (causal
// self-attention with biased Q/K/V/output projections, GQA when kv-heads < heads; GELU MLP
// with hidden 4d; residuals); final LayerNorm; linear head with bias (not tied).
#include <memory>
#include <vector>

#include "bench/common.hpp"
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/nn/layers.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/loss.hpp>

using namespace xg;

namespace {

class BenchModel : public nn::Module {
 public:
  BenchModel(const nn::TransformerConfig& c, Generator& gen)
      : tok(c.V_vocab, c.d_model, gen),
        pos(c.context, c.d_model, gen),
        ln_f(c.d_model),
        head(c.d_model, c.V_vocab, gen, /*bias=*/true) {
    register_module("tok", tok);
    register_module("pos", pos);
    for (std::size_t l = 0; l < c.layers; ++l) {
      blocks.push_back(std::make_unique<nn::DecoderBlock>(c, gen));
      register_module("blocks." + std::to_string(l), *blocks.back());
    }
    register_module("ln_f", ln_f);
    register_module("head", head);
    std::vector<std::int64_t> p(c.context);
    for (std::size_t t = 0; t < c.context; ++t) p[t] = static_cast<std::int64_t>(t);
    positions_ = IndexArray({c.context}, p);
    call_.visibility = nn::Visibility::causal(c.context, c.context);
  }

  // tokens [B, T] -> logits [B, T, vocab]
  Tensor operator()(const IndexArray& tokens) {
    Tensor h = tok(tokens) + pos(positions_);
    for (auto& block : blocks) h = (*block)(h, call_);
    return head(ln_f(h));
  }

  nn::Embedding tok, pos;
  std::vector<std::unique_ptr<nn::DecoderBlock>> blocks;
  nn::LayerNorm ln_f;
  nn::Linear head;

 private:
  IndexArray positions_;
  nn::AttentionCall call_;
};

IndexArray random_ids(const Shape& shape, std::size_t vocab, Generator& gen) {
  std::vector<std::int64_t> ids(numel(shape));
  for (auto& id : ids) id = static_cast<std::int64_t>(gen.below(vocab));
  return IndexArray(shape, ids);
}

void run(const bench::TrainFlags& f) {
  bench::validate(f);
  set_num_threads(f.threads);
  if (f.no_memory_cache) set_memory_cache_limit(0);
  nn::TransformerConfig cfg;
  cfg.V_vocab = f.vocab;
  cfg.context = f.seq;
  cfg.d_model = f.d;
  cfg.H_q = f.heads;
  cfg.H_kv = f.kv();
  cfg.layers = f.layers;
  cfg = cfg.resolved();

  Generator gen(f.seed);
  BenchModel model(cfg, gen);
  nn::AdamW opt(model.named_parameters(), /*lr=*/3e-4, /*weight_decay=*/1e-2, /*beta1=*/0.9, /*beta2=*/0.999,
                /*eps=*/1e-8);
  const IndexArray tokens = random_ids({f.batch, f.seq}, f.vocab, gen);
  const IndexArray targets = random_ids({f.batch, f.seq}, f.vocab, gen);

  bench::print_header("bench_train_step", "xgrad", f);
  bench::print_line("parameters: " + std::to_string(model.parameter_count()));

  double loss = 0;
  const auto step = [&] {
    opt.zero_grad();
    const Tensor L = ops::cross_entropy(model(tokens), targets);
    loss = L.item();
    L.backward();
    opt.step();
  };
  const std::vector<double> ms = bench::time_reps(f.warmup, f.steps, step);
  bench::report_train_step(ms, f.warmup + f.steps, loss);
}

}  // namespace

int main(int argc, char** argv) {
  bench::TrainFlags f;
  return bench::run_program("bench_train_step",
                            "One training step (forward, cross-entropy, backward, AdamW) of a small GPT, xgrad", argc,
                            argv, f, run);
}
