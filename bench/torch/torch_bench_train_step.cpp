// libtorch reference for bench_train_step: the same model, step and flags (plus
// --blas-threads), on libtorch's C++ frontend. See bench/bench_train_step.cpp.
#include <stdexcept>
#include <cmath>

#include "bench/torch/torch_common.hpp"

namespace {

using bench::torchref::composed_attention;

// Pre-LayerNorm block: x += W_O attn(ln1(x)); x += fc2(gelu(fc1(ln2(x)))). Packed, biased
// Q/K/V projection [d, (H + 2 H_kv) d_h], columns [Q heads | K heads | V heads].
struct BlockImpl : torch::nn::Module {
  BlockImpl(std::int64_t d, std::int64_t H, std::int64_t Hkv)
      : H(H),
        Hkv(Hkv),
        dh(d / H),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        qkv(register_module("qkv", torch::nn::Linear(d, (H + 2 * Hkv) * (d / H)))),
        out(register_module("out", torch::nn::Linear(H * (d / H), d))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 4 * d))),
        fc2(register_module("fc2", torch::nn::Linear(4 * d, d))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& hidden) {
    const std::int64_t B = x.size(0), T = x.size(1);
    const auto parts = qkv(ln1(x)).split_with_sizes({H * dh, Hkv * dh, Hkv * dh}, -1);
    const torch::Tensor Q = parts[0].view({B, T, H, dh}).transpose(1, 2);
    const torch::Tensor K = parts[1].view({B, T, Hkv, dh}).transpose(1, 2);
    const torch::Tensor V = parts[2].view({B, T, Hkv, dh}).transpose(1, 2);
    const torch::Tensor O = composed_attention(Q, K, V, hidden).transpose(1, 2).reshape({B, T, H * dh});
    const torch::Tensor h = x + out(O);
    return h + fc2(torch::gelu(fc1(ln2(h))));
  }

  std::int64_t H, Hkv, dh;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, out;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(const bench::TrainFlags& f)
      : tok(register_module("tok", torch::nn::Embedding(f.vocab, f.d))),
        pos(register_module("pos", torch::nn::Embedding(f.seq, f.d))),
        ln_f(register_module("ln_f",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({static_cast<std::int64_t>(f.d)})))),
        head(register_module("head", torch::nn::Linear(f.d, f.vocab))),
        positions(torch::arange(static_cast<std::int64_t>(f.seq), torch::kLong)),
        hidden(
            torch::ones({static_cast<std::int64_t>(f.seq), static_cast<std::int64_t>(f.seq)}, torch::kBool).triu(1)) {
    for (std::size_t l = 0; l < f.layers; ++l)
      blocks.push_back(register_module("block" + std::to_string(l),
                                       Block(static_cast<std::int64_t>(f.d), static_cast<std::int64_t>(f.heads),
                                             static_cast<std::int64_t>(f.kv()))));
  }

  torch::Tensor forward(const torch::Tensor& tokens) {
    torch::Tensor h = tok(tokens) + pos(positions);
    for (auto& block : blocks) h = block->forward(h, hidden);
    return head(ln_f(h));
  }

  torch::nn::Embedding tok, pos;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
  torch::Tensor positions, hidden;
};
TORCH_MODULE(Model);

void run(const bench::TrainFlags& f, const bench::torchref::ThreadFlags& tf) {
  bench::validate(f);
  if (f.no_memory_cache) throw std::invalid_argument("--no-memory-cache is xgrad's allocator setting; libtorch has none");
  bench::print_header("torch_bench_train_step", "libtorch", f);
  bench::torchref::set_threads(f.threads, tf);
  torch::manual_seed(f.seed);
  Model model(f);
  std::int64_t count = 0;
  for (const auto& p : model->parameters()) count += p.numel();
  bench::print_line("parameters: " + std::to_string(count));
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(3e-4).betas({0.9, 0.999}).eps(1e-8).weight_decay(1e-2));
  const auto V = static_cast<std::int64_t>(f.vocab);
  const std::vector<std::int64_t> BT{static_cast<std::int64_t>(f.batch), static_cast<std::int64_t>(f.seq)};
  const torch::Tensor tokens = torch::randint(V, BT, torch::kLong);
  const torch::Tensor targets = torch::randint(V, BT, torch::kLong).view({-1});

  double loss = 0;
  const auto step = [&] {
    for (auto& p : model->parameters()) p.mutable_grad().reset();  // set_to_none, as xgrad's zero_grad
    const torch::Tensor L = torch::nn::functional::cross_entropy(model->forward(tokens).view({-1, V}), targets);
    loss = L.item<double>();
    L.backward();
    opt.step();
  };
  const std::vector<double> ms = bench::time_reps(f.warmup, f.steps, step);
  bench::report_train_step(ms, f.warmup + f.steps, loss);
}

}  // namespace

int main(int argc, char** argv) {
  bench::TrainFlags f;
  return bench::torchref::run_program(
      "torch_bench_train_step", "One training step of the same small GPT, libtorch reference", argc, argv, f, run);
}
