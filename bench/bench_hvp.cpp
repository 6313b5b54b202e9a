// The cost of a Hessian-vector product against a gradient (docs/higher-order.md): on
// bench_train_step's model (bench/bench_model.hpp, the same flags), one gradient (forward,
// cross-entropy on random targets, backward: grad() of the loss with respect to every
// parameter) and one hvp (xg::hvp, core/higher_order.hpp: the gradient recorded with
// create_graph, then one reverse pass over it, with respect to every parameter, v random
// normal). The two are timed in alternating rounds (--warmup untimed rounds, then --steps timed
// ones), each on a scoped tape of its own; the closing line is the ratio of the medians.
#include <cmath>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_model.hpp"
#include "bench/common.hpp"
#include <xgrad/core/higher_order.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/ops/loss.hpp>

using namespace xg;

namespace {

void run(const bench::TrainFlags& f, const std::string& arch) {
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
  if (arch == "llama") {
    cfg.arch = nn::Architecture::llama;
    cfg.pos = nn::PositionScheme::rope;
    cfg.multiple_of = 32;
    cfg.tie_embeddings = false;
  }
  cfg = cfg.resolved();

  Generator gen(f.seed);
  bench::BenchModel model(cfg, gen);
  const std::vector<Tensor> params = model.parameters();
  const IndexArray tokens = bench::random_ids({f.batch, f.seq}, f.vocab, gen);
  const IndexArray targets = bench::random_ids({f.batch, f.seq}, f.vocab, gen);
  std::vector<Array> v;
  for (const Tensor& p : params) v.push_back(random_normal(p.shape(), gen, p.dtype()));

  bench::print_header("bench_hvp", "xgrad", f);
  bench::print_line("arch " + arch + ", feed-forward width " + std::to_string(cfg.d_ff));
  bench::print_line("parameters: " + std::to_string(model.parameter_count()) + " in " +
                    std::to_string(params.size()) + " tensors");

  const LossFn loss = [&] { return ops::cross_entropy(model(tokens), targets); };
  double g_norm = 0, vHv = 0;
  const auto gradient = [&] {
    Tape tape;
    const std::vector<Array> g = grad(loss(), params);
    double s = 0;
    for (const Array& a : g)
      for (std::size_t i = 0; i < a.size(); ++i) s += a.flat(i) * a.flat(i);
    g_norm = std::sqrt(s);
  };
  const auto hessian_vector = [&] {
    const std::vector<Array> hv = hvp(loss, params, v);
    double s = 0;
    for (std::size_t k = 0; k < hv.size(); ++k)
      for (std::size_t i = 0; i < hv[k].size(); ++i) s += v[k].flat(i) * hv[k].flat(i);
    vHv = s;
  };
  for (std::size_t i = 0; i < f.warmup; ++i) {
    gradient();
    hessian_vector();
  }
  std::vector<double> grad_ms, hvp_ms;
  for (std::size_t i = 0; i < f.steps; ++i) {
    grad_ms.push_back(bench::time_reps(0, 1, gradient)[0]);
    hvp_ms.push_back(bench::time_reps(0, 1, hessian_vector)[0]);
  }
  bench::print_summary("gradient (forward + backward)", grad_ms, "ms");
  bench::print_summary("hvp (forward + create_graph backward + backward)", hvp_ms, "ms");
  bench::print_line("|gradient| " + bench::fmt(g_norm, 6) + ", v . Hv " + bench::fmt(vHv, 6));
  bench::print_peak_rss();
  const double ratio = bench::summarize(hvp_ms).median / bench::summarize(grad_ms).median;
  bench::print_result("hvp_over_gradient", ratio, "x");
}

}  // namespace

int main(int argc, char** argv) {
  bench::TrainFlags f;
  std::string arch = "gpt";
  return bench::run_program(
      "bench_hvp", "A Hessian-vector product against a gradient on bench_train_step's model, xgrad", argc, argv,
      [&](CLI::App& app) {
        bench::add_flags(app, f);
        app.add_option("--arch", arch, "block: gpt (LayerNorm, GELU, biases) or llama (RMSNorm, RoPE, SwiGLU, no biases)")
            ->check(CLI::IsMember({"gpt", "llama"}))
            ->capture_default_str();
      },
      [&] { run(f, arch); });
}
