// libtorch reference for bench_attention: the same inputs, loss and flags (plus
// --blas-threads). --impl composed and auto: matmul, masked_fill, softmax, matmul (GQA by
// stacking query heads, no copy of K and V). --impl fused: at::_scaled_dot_product_attention,
// libtorch 1.13's internal attention op (its CPU path is the same math composition).
#include "bench/torch/torch_common.hpp"

namespace {

void run(const bench::AttentionFlags& f, const bench::torchref::ThreadFlags& tf) {
  bench::validate(f);
  bench::print_header("torch_bench_attention", "libtorch", f);
  bench::torchref::set_threads(f.threads, tf);
  torch::manual_seed(f.seed);
  const auto B = static_cast<std::int64_t>(f.batch), H = static_cast<std::int64_t>(f.heads),
             Hkv = static_cast<std::int64_t>(f.kv()), T = static_cast<std::int64_t>(f.seq),
             dh = static_cast<std::int64_t>(f.dh);
  torch::Tensor Q = torch::randn({B, H, T, dh}).requires_grad_();
  torch::Tensor K = torch::randn({B, Hkv, T, dh}).requires_grad_();
  torch::Tensor V = torch::randn({B, Hkv, T, dh}).requires_grad_();
  const torch::Tensor G = torch::randn({B, H, T, dh});
  const double rss_inputs = bench::current_rss_mib();

  const torch::Tensor hidden = bench::torchref::hidden_mask(f);
  const auto attention = f.impl == "fused" ? bench::torchref::library_attention : bench::torchref::composed_attention;
  const auto fwd_bwd = [&] {
    for (torch::Tensor* t : {&Q, &K, &V}) t->mutable_grad().reset();
    (attention(Q, K, V, hidden) * G).sum().backward();
  };
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, fwd_bwd);
  bench::report_attention(ms, rss_inputs);
}

}  // namespace

int main(int argc, char** argv) {
  bench::AttentionFlags f;
  return bench::torchref::run_program("torch_bench_attention", "Attention forward + backward, libtorch reference", argc,
                                      argv, f, run);
}
