// The cost of a Hessian-vector product against a gradient (docs/higher-order.md): on
// bench_train_step's model (bench/bench_model.hpp, the same flags), one gradient (forward,
// cross-entropy on random targets, backward: grad() of the loss with respect to every
// parameter) and one hvp (xg::hvp, core/higher_order.hpp: the gradient recorded with
// create_graph, then one reverse pass over it, with respect to every parameter, v random
// normal). The two are timed in alternating rounds (--warmup untimed rounds, then --steps timed
// ones), each on a scoped tape of its own; the closing line is the ratio of the medians.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "bench/bench_model.hpp"
#include "bench/common.hpp"
#include <xgrad/core/detail/profile.hpp>
#include <xgrad/core/higher_order.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/loss.hpp>
#include <xgrad/ops/reduce.hpp>

using namespace xg;

namespace {

// --profile: `rounds` more hvps with the op timers on (core/detail/profile.hpp), after the timed
// rounds: per op (its first-order VJPs and second-order rules both count as backward time) in ms
// per hvp, the 12 largest.
void print_profile(std::size_t rounds, const std::function<void()>& hvp_once) {
  detail::reset_profile();
  detail::set_profiling(true);
  for (std::size_t i = 0; i < rounds; ++i) hvp_once();
  detail::set_profiling(false);
  const double n = double(rounds);
  std::vector<detail::OpTime> ops = detail::op_profile();
  std::sort(ops.begin(), ops.end(), [](const detail::OpTime& a, const detail::OpTime& b) {
    return a.forward_ms + a.backward_ms > b.forward_ms + b.backward_ms;
  });
  bench::print_line("profile of the hvp over " + std::to_string(rounds) + " rounds, ms per hvp; GEMM doorway " +
                    bench::fmt(detail::gemm_profile_ms() / n, 3) + ":");
  for (std::size_t k = 0; k < ops.size() && k < 12; ++k) {
    char line[200];
    std::snprintf(line, sizeof line, "  op %-24s fwd %9.3f (%4llu)  bwd %9.3f (%4llu)", ops[k].op.c_str(),
                  ops[k].forward_ms / n, static_cast<unsigned long long>(ops[k].forward_calls / rounds),
                  ops[k].backward_ms / n, static_cast<unsigned long long>(ops[k].backward_calls / rounds));
    bench::print_line(line);
  }
}

void run(const bench::TrainFlags& f, const std::string& arch, bool profile, bool modes) {
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
  // The hvp again, timed in its three parts: the forward, the recorded (create_graph) backward
  // with <g, v>, and the reverse pass over that.
  std::vector<double> fwd_ms, graph_ms, second_ms;
  const auto hvp_in_parts = [&] {
    Tape tape;
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor y = loss();
    const auto t1 = std::chrono::steady_clock::now();
    BackwardOptions o;
    o.create_graph = true;
    const std::vector<Tensor> g = grad(y, params, Tensor(), o);
    Tensor s;
    for (std::size_t k = 0; k < g.size(); ++k) {
      const Tensor d = ops::sum(g[k] * Tensor(v[k], false));
      s = s.defined() ? s + d : d;
    }
    const auto t2 = std::chrono::steady_clock::now();
    const std::vector<Array> hv = grad(s, params);
    const auto t3 = std::chrono::steady_clock::now();
    const auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    fwd_ms.push_back(ms(t0, t1));
    graph_ms.push_back(ms(t1, t2));
    second_ms.push_back(ms(t2, t3));
  };
  // --modes: H v again as forward over reverse, the way xgrad's jvp() computes a JVP (by
  // linearising reverse mode, docs/higher-order.md): with u a dummy leaf per parameter,
  // w(u) = d<g, u>/dp = H u is recorded, and H v = d<w(u), v>/du (H symmetric).
  double fwd_vHv = 0;
  const auto forward_over_reverse = [&] {
    Tape tape;
    BackwardOptions o;
    o.create_graph = true;
    const std::vector<Tensor> g = grad(loss(), params, Tensor(), o);
    std::vector<Tensor> u;
    Tensor s;
    for (std::size_t k = 0; k < g.size(); ++k) {
      u.emplace_back(Array::zeros(g[k].shape(), g[k].dtype()), true);
      const Tensor d = ops::sum(g[k] * u.back());
      s = s.defined() ? s + d : d;
    }
    const std::vector<Tensor> w = grad(s, params, Tensor(), o);
    Tensor t;
    for (std::size_t k = 0; k < w.size(); ++k) {
      const Tensor d = ops::sum(w[k] * Tensor(v[k], false));
      t = t.defined() ? t + d : d;
    }
    const std::vector<Array> hv = grad(t, u);
    double acc = 0;
    for (std::size_t k = 0; k < hv.size(); ++k)
      for (std::size_t i = 0; i < hv[k].size(); ++i) acc += v[k].flat(i) * hv[k].flat(i);
    fwd_vHv = acc;
  };
  std::vector<double> grad_ms, hvp_ms, fwd_ms2;
  for (std::size_t i = 0; i < f.steps; ++i) {
    grad_ms.push_back(bench::time_reps(0, 1, gradient)[0]);
    hvp_ms.push_back(bench::time_reps(0, 1, hessian_vector)[0]);
    hvp_in_parts();
    if (modes) fwd_ms2.push_back(bench::time_reps(0, 1, forward_over_reverse)[0]);
  }
  if (modes) {
    bench::print_summary("hvp as forward over reverse (jvp of the gradient, linearised)", fwd_ms2, "ms");
    bench::print_line("forward over reverse v . Hv " + bench::fmt(fwd_vHv, 6) + ", against reverse over reverse: " +
                      bench::fmt(bench::summarize(fwd_ms2).median / bench::summarize(hvp_ms).median, 3) + "x");
  }
  bench::print_summary("gradient (forward + backward)", grad_ms, "ms");
  bench::print_summary("hvp (forward + create_graph backward + backward)", hvp_ms, "ms");
  bench::print_line("hvp in parts (medians, ms): forward " + bench::fmt(bench::summarize(fwd_ms).median, 3) +
                    ", create_graph backward " + bench::fmt(bench::summarize(graph_ms).median, 3) +
                    ", reverse pass over it " + bench::fmt(bench::summarize(second_ms).median, 3));
  bench::print_line("|gradient| " + bench::fmt(g_norm, 6) + ", v . Hv " + bench::fmt(vHv, 6));
  bench::print_peak_rss();
  if (profile) print_profile(f.steps, hessian_vector);
  const double ratio = bench::summarize(hvp_ms).median / bench::summarize(grad_ms).median;
  bench::print_result("hvp_over_gradient", ratio, "x");
}

}  // namespace

int main(int argc, char** argv) {
  bench::TrainFlags f;
  std::string arch = "gpt";
  bool profile = false, modes = false;
  return bench::run_program(
      "bench_hvp", "A Hessian-vector product against a gradient on bench_train_step's model, xgrad", argc, argv,
      [&](CLI::App& app) {
        bench::add_flags(app, f);
        app.add_option("--arch", arch, "block: gpt (LayerNorm, GELU, biases) or llama (RMSNorm, RoPE, SwiGLU, no biases)")
            ->check(CLI::IsMember({"gpt", "llama"}))
            ->capture_default_str();
        app.add_flag("--profile", profile, "after the timed rounds, as many hvps again with the op timers on");
        app.add_flag("--modes", modes, "also time H v as forward over reverse (a jvp of the gradient), per round");
      },
      [&] { run(f, arch, profile, modes); });
}
