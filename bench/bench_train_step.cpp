// One full training step of a small GPT-style language model (issue 8, "Benchmarks"):
// zero grads, forward, cross-entropy on random targets, backward, AdamW. The libtorch
// reference (bench/torch/torch_bench_train_step.cpp) builds the same model.
//
// Model (--arch gpt, the default): token + learned position embeddings; `layers` pre-LayerNorm
// blocks (causal self-attention with biased Q/K/V/output projections, GQA when kv-heads <
// heads; GELU MLP with hidden 4d; residuals); final LayerNorm; linear head with bias (not tied).
// --arch llama (xgrad only, issue 19): the same model with nn::LlamaBlocks instead (RMSNorm,
// RoPE, no biases, SwiGLU of llama2.c's width rule with multiple_of 32), no position embedding,
// a final RMSNorm and a head without bias: the block's cost against the GPT block's at the
// same width and depth (bench/NOTES.md, "Training step: Llama block vs GPT block", compares
// time per step per parameter).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_model.hpp"
#include "bench/common.hpp"
#include "bench/xgrad_pool.hpp"
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/core/detail/profile.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/nn/layers.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/loss.hpp>

using namespace xg;

namespace {

// --profile: `steps` more steps with the op and GEMM timers on (core/detail/profile.hpp), after
// the timed ones (which run without them). Prints the phases of a step, the time inside the
// GEMM doorway and per op its forward and backward time, in ms per step.
void print_profile(std::size_t steps, const std::function<void(double*)>& phased_step) {
  detail::reset_profile();
  detail::set_profiling(true);
  double phases[4] = {0, 0, 0, 0};  // zero_grad, forward + loss, backward, optimizer
  for (std::size_t i = 0; i < steps; ++i) phased_step(phases);
  detail::set_profiling(false);
  const double n = double(steps);
  const double total = (phases[0] + phases[1] + phases[2] + phases[3]) / n;
  const auto pct = [total](double ms) { return bench::fmt(100.0 * ms / total, 1) + "%"; };
  bench::print_line("profile over " + std::to_string(steps) + " steps, ms per step (share of " + bench::fmt(total, 2) +
                    " ms):");
  const char* names[4] = {"zero_grad", "forward+loss", "backward", "optimizer"};
  for (int k = 0; k < 4; ++k)
    bench::print_line(std::string("  phase ") + names[k] + ": " + bench::fmt(phases[k] / n, 3) + " (" +
                      pct(phases[k] / n) + ")");
  const double gemm = detail::gemm_profile_ms() / n;
  bench::print_line("  inside the GEMM doorway: " + bench::fmt(gemm, 3) + " (" + pct(gemm) + "), " +
                    std::to_string(detail::gemm_profile_calls() / steps) + " calls; everything else " +
                    bench::fmt(total - gemm, 3) + " (" + pct(total - gemm) + ")");
  for (const auto& t : detail::op_profile()) {
    char line[200];
    std::snprintf(line, sizeof line, "  op %-22s fwd %8.3f (%3llu)  bwd %8.3f (%3llu)  %s", t.op.c_str(),
                  t.forward_ms / n, static_cast<unsigned long long>(t.forward_calls / steps), t.backward_ms / n,
                  static_cast<unsigned long long>(t.backward_calls / steps),
                  pct((t.forward_ms + t.backward_ms) / n).c_str());
    bench::print_line(line);
  }
}

// The optimizer of the benchmark's model (and of --against's twin).
nn::AdamW bench_optimizer(bench::BenchModel& model) {
  return nn::AdamW(model.named_parameters(), /*lr=*/3e-4, /*weight_decay=*/1e-2, /*beta1=*/0.9, /*beta2=*/0.999,
                   /*eps=*/1e-8);
}

// One training step of `model` on the batch; returns its loss.
double train_step(bench::BenchModel& model, nn::AdamW& opt, const IndexArray& tokens, const IndexArray& targets) {
  opt.zero_grad();
  const Tensor L = ops::cross_entropy(model(tokens), targets);
  const double loss = L.item();
  L.backward();
  opt.step();
  return loss;
}

MatmulDtype dtype_named(const std::string& name) {
  return name == "bfloat16" ? MatmulDtype::bfloat16 : MatmulDtype::float32;
}

// --against: the step's time against that of an identical model (the same seed, so the same
// weights and batch) whose products take the other dtype, the two stepped in turn in this
// process (the order swapped every rep), so that a busy machine slows both alike. Prints the
// other model's times, the ratio of the medians (other / this: the speed-up of --dtype) and the
// median of the ratios of the back-to-back pairs, and returns this model's times.
std::vector<double> time_against(std::size_t warmup, std::size_t reps, const std::string& dtype,
                                 const std::function<void()>& step, const std::string& against,
                                 const std::function<void()>& other_step) {
  const auto timed = [](const std::function<void()>& fn) { return bench::time_reps(0, 1, fn)[0]; };  // as bench_hvp
  for (std::size_t i = 0; i < warmup; ++i) {
    step();
    other_step();
  }
  std::vector<double> ms, other_ms, pair_ratio;
  for (std::size_t i = 0; i < reps; ++i) {
    double a, b;
    if (i % 2 == 0) {
      a = timed(step);
      b = timed(other_step);
    } else {
      b = timed(other_step);
      a = timed(step);
    }
    ms.push_back(a);
    other_ms.push_back(b);
    pair_ratio.push_back(b / a);
  }
  bench::print_line("against " + against + ": an identical model (the same seed and batch) with " + against +
                    " products, stepped in turn with this one, the order swapped every rep");
  bench::print_summary(against + " train step", other_ms, "ms");
  const double median = bench::summarize(ms).median, other = bench::summarize(other_ms).median;
  bench::print_line(dtype + " against " + against + ": " + bench::fmt(other / median, 3) + "x (medians " +
                    bench::fmt(median, 2) + " and " + bench::fmt(other, 2) + " ms), median of the " +
                    std::to_string(reps) + " back-to-back pairs' ratios " +
                    bench::fmt(bench::summarize(pair_ratio).median, 3) + "x");
  bench::print_result("speedup_against_" + against, other / median, "x");
  return ms;
}

void run(const bench::TrainFlags& f, const std::string& arch, const std::string& dtype, const std::string& against,
         bool profile) {
  bench::validate(f);
  if (against == dtype)
    throw bench::UsageError("--against " + against + " is the --dtype of the run itself; give the other dtype");
  set_num_threads(f.threads);
  // --dtype bfloat16: float32 parameters, matmul inputs rounded to bfloat16 (core/matmul_dtype.hpp).
  const MatmulDtypeScope matmul_dtype_scope(dtype_named(dtype));
  if (f.no_memory_cache) set_memory_cache_limit(0);
  nn::TransformerConfig cfg;
  cfg.V_vocab = f.vocab;
  cfg.context = f.seq;
  cfg.d_model = f.d;
  cfg.H_q = f.heads;
  cfg.H_kv = f.kv();
  cfg.layers = f.layers;
  if (arch == "llama") {
    cfg.arch = nn::Architecture::llama;
    cfg.pos = nn::PositionScheme::rope;
    cfg.multiple_of = 32;  // llama2.c's TinyStories models
    cfg.tie_embeddings = false;
  }
  cfg = cfg.resolved();

  Generator gen(f.seed);
  bench::BenchModel model(cfg, gen);
  nn::AdamW opt = bench_optimizer(model);
  const IndexArray tokens = bench::random_ids({f.batch, f.seq}, f.vocab, gen);
  const IndexArray targets = bench::random_ids({f.batch, f.seq}, f.vocab, gen);

  bench::print_header("bench_train_step", "xgrad", f);
  bench::print_line("arch " + arch + ", feed-forward width " + std::to_string(cfg.d_ff));
  bench::print_line("parameters: " + std::to_string(model.parameter_count()));
  const std::string why_not = bfloat16_matmul_unavailable_reason();
  bench::print_line("matmul dtype: " + matmul_dtype_name(effective_matmul_dtype()) +
                    (dtype == "bfloat16" && !why_not.empty() ? " (bfloat16 asked for: " + why_not + ")" : ""));

  double loss = 0;
  const auto step = [&] { loss = train_step(model, opt, tokens, targets); };
  // The peak before the timed steps and again after them (bench/peak.hpp, peak_around).
  const bench::Peak peak_before = bench::measure_peak(f.threads, 0.05, bench::xgrad_pool(),
                                                      blas::sgemm_isa() == "avx2" ? "avx2" : "");
  std::vector<double> ms;
  if (against.empty()) {
    ms = bench::time_reps(f.warmup, f.steps, step);
  } else {
    Generator other_gen(f.seed);  // the same seed: the same weights
    bench::BenchModel other(cfg, other_gen);
    nn::AdamW other_opt = bench_optimizer(other);
    double other_loss = 0;
    const auto other_step = [&] {
      const MatmulDtypeScope scope(dtype_named(against));
      other_loss = train_step(other, other_opt, tokens, targets);
    };
    ms = time_against(f.warmup, f.steps, dtype, step, against, other_step);
    bench::print_line(against + " model's loss after " + std::to_string(f.warmup + f.steps) +
                      " steps: " + bench::fmt(other_loss, 4));
  }
  // FLOPs per step (docs/performance.md): 6 x parameters x tokens (forward 2, backward 4 per
  // parameter and token) + causal attention 6 B H T^2 d_head per layer.
  const double tokens_per_step = double(f.batch) * double(f.seq);
  const double attn = 6.0 * double(f.batch) * double(f.heads) * double(f.seq) * double(f.seq) *
                      double(f.d / f.heads) * double(f.layers);
  const double flop = 6.0 * double(model.parameter_count()) * tokens_per_step + attn;
  bench::print_line("FLOP per step: " + bench::fmt(flop * 1e-9, 3) + " G");
  bench::print_peak_share_around(peak_before, flop * 1e-9 / (bench::summarize(ms).median * 1e-3), bench::xgrad_pool());
  const double timed_loss = loss;  // the loss line reports the timed run, not the profiled steps after it
  if (profile)
    print_profile(f.steps, [&](double* phases) {
      using clock = std::chrono::steady_clock;
      const auto ms_between = [](clock::time_point a, clock::time_point b) {
        return std::chrono::duration<double, std::milli>(b - a).count();
      };
      const auto t0 = clock::now();
      opt.zero_grad();
      const auto t1 = clock::now();
      detail::profile_mark();
      const Tensor L = ops::cross_entropy(model(tokens), targets);
      (void)L.item();
      const auto t2 = clock::now();
      L.backward();
      const auto t3 = clock::now();
      opt.step();
      const auto t4 = clock::now();
      phases[0] += ms_between(t0, t1);
      phases[1] += ms_between(t1, t2);
      phases[2] += ms_between(t2, t3);
      phases[3] += ms_between(t3, t4);
    });
  bench::report_train_step(ms, f.warmup + f.steps, timed_loss);
}

}  // namespace

int main(int argc, char** argv) {
  bench::TrainFlags f;
  std::string arch = "gpt", dtype = "float32", against;
  bool profile = false;
  return bench::run_program(
      "bench_train_step", "One training step (forward, cross-entropy, backward, AdamW) of a small GPT, xgrad", argc,
      argv,
      [&](CLI::App& app) {
        bench::add_flags(app, f);
        app.add_option("--arch", arch, "block: gpt (LayerNorm, GELU, biases) or llama (RMSNorm, RoPE, SwiGLU, no biases)")
            ->check(CLI::IsMember({"gpt", "llama"}))
            ->capture_default_str();
        app.add_option("--dtype", dtype,
                       "matmul inputs: float32, or bfloat16 (fp32 parameters and accumulation; needs AVX512_BF16)")
            ->check(CLI::IsMember({"float32", "bfloat16"}))
            ->capture_default_str();
        app.add_option("--against", against,
                       "also step an identical model whose products take this dtype, in turn with the timed one, "
                       "and print the ratio of their times")
            ->check(CLI::IsMember({"float32", "bfloat16"}));
        app.add_flag("--profile", profile,
                     "after the timed steps, as many again with timers on: phases, GEMM doorway, time per op");
      },
      [&] { run(f, arch, dtype, against, profile); });
}
