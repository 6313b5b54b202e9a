// One data-parallel training step (docs/distributed.md): run it as one process or under
// `mpirun -np N`. Every rank draws the same global batch (--batch is global) and computes
// its shard: forward, cross-entropy, backward, the gradient all-reduce in buckets
// (dist::GradientReducer, optionally overlapped with backward), clipping by the global
// norm, AdamW. The model is the trainer's GPT (tied embeddings, learned positions).
//
// Prints, from rank 0: the step time (each rank's includes waiting for the slowest), the
// time in the gradient all-reduce per step (packing, communication, waiting, unpacking),
// tokens per second of the whole job, and `RESULT dp_step_ms <median> ms`.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <thread>
#include <vector>

#include "bench/common.hpp"
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/ops/dropout.hpp>

using namespace xg;

namespace {

struct DpFlags {
  bench::TrainFlags train;
  bool overlap = false;
  std::size_t bucket_kib = 1024;
  bool threads_given = false;
};

void run(DpFlags& f, dist::Communicator& comm) {
  bench::validate(f.train);
  const bool root = comm.rank() == 0;
  const dist::Shard shard = dist::shard_of(f.train.batch, comm.rank(), comm.size());
  // Without --threads: the cores of this machine divided among its ranks.
  const int threads =
      f.threads_given ? f.train.threads
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / comm.local_size());
  f.train.threads = threads;
  set_num_threads(threads);
  nn::TransformerConfig cfg;
  cfg.V_vocab = f.train.vocab;
  cfg.context = f.train.seq;
  cfg.d_model = f.train.d;
  cfg.H_q = f.train.heads;
  cfg.H_kv = f.train.kv();
  cfg.layers = f.train.layers;
  cfg = cfg.resolved();
  Generator init(f.train.seed);
  nn::GPT model(cfg, init);
  const auto params = model.named_parameters();
  dist::broadcast_parameters(comm, params, 0);
  nn::AdamW opt(params, 3e-4, 1e-2);
  dist::GradientReducer::Options ro;
  ro.bucket_bytes = f.bucket_kib * 1024;
  ro.overlap = f.overlap;
  dist::GradientReducer reducer(comm, params, ro);

  // The same random global batch on every rank; this rank's rows.
  Generator data(f.train.seed + 1);
  const std::size_t B = f.train.batch, T = f.train.seq;
  std::vector<std::int64_t> tok(B * T), tgt(B * T);
  for (auto& t : tok) t = static_cast<std::int64_t>(data.below(f.train.vocab));
  for (auto& t : tgt) t = static_cast<std::int64_t>(data.below(f.train.vocab));
  const auto rows = [&](const std::vector<std::int64_t>& v) {
    return IndexArray({shard.rows(), T}, std::vector<std::int64_t>(v.begin() + static_cast<long>(shard.begin * T),
                                                                   v.begin() + static_cast<long>(shard.end * T)));
  };
  const IndexArray tokens = rows(tok), targets = rows(tgt);
  const double weight = static_cast<double>(shard.rows()) / static_cast<double>(B);  // every target counts

  if (root) {
    bench::print_header("bench_dp_step", "xgrad", f.train);
    bench::print_line("ranks: " + comm.description() + "; " + std::to_string(shard.rows()) + " sequences and " +
                      std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " per rank");
    bench::print_line("parameters: " + std::to_string(model.parameter_count()) + "; gradients all-reduced per step: " +
                      bench::fmt(static_cast<double>(reducer.bytes()) / (1024.0 * 1024.0), 2) + " MiB in " +
                      std::to_string(reducer.buckets()) + (reducer.buckets() == 1 ? " bucket" : " buckets") +
                      (f.overlap ? ", overlapped with backward" : ""));
  }
  std::vector<double> allreduce_ms;
  double loss = 0;
  const auto step = [&] {
    Tape tape;
    ops::DropoutRowOffset offset(shard.begin);
    const Tensor L = model.loss(tokens, targets);
    BackwardOptions bo;
    bo.on_leaf_grad = reducer.hook();
    backward(L, Array::full(L.shape(), comm.size() == 1 ? 1.0 : weight, L.dtype()), bo);
    reducer.reduce();
    allreduce_ms.push_back(reducer.last_seconds() * 1e3);
    loss = comm.all_reduce(L.item() * weight, dist::ReduceOp::sum);
    nn::clip_grad_norm(params, 1.0);
    opt.step();
    opt.zero_grad();
  };
  comm.barrier();
  const std::vector<double> ms = bench::time_reps(f.train.warmup, f.train.steps, step);
  allreduce_ms.erase(allreduce_ms.begin(), allreduce_ms.begin() + static_cast<long>(f.train.warmup));
  dist::check_parameters_agree(comm, params, "after the benchmark");
  if (!root) return;
  const double median = bench::summarize(ms).median;
  bench::print_line("loss after " + std::to_string(f.train.warmup + f.train.steps) + " steps: " + bench::fmt(loss, 4));
  bench::print_summary("step", ms, "ms");
  bench::print_summary("all-reduce per step", allreduce_ms, "ms");
  bench::print_line("all-reduce share of the step: " +
                    bench::fmt(100.0 * bench::summarize(allreduce_ms).median / median, 1) + " %");
  bench::print_line("tokens/s (whole job): " + bench::fmt(static_cast<double>(B * T) / (median / 1e3), 0));
  bench::print_peak_rss();
  bench::print_result("dp_step_ms", median, "ms");
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<dist::Communicator> comm;
  try {
    comm = dist::launch();
  } catch (const std::exception& e) {
    std::cerr << "bench_dp_step: error: " << e.what() << "\n";
    return 1;
  }
  DpFlags f;
  CLI::Option* threads = nullptr;
  return bench::run_program(
      "bench_dp_step", "One data-parallel training step of the trainer's GPT; run under mpirun -np N", argc, argv,
      [&](CLI::App& app) {
        bench::add_flags(app, f.train);
        threads = app.get_option("--threads");
        threads->description("worker threads per rank (default: cores / ranks on this machine)");
        app.add_flag("--overlap", f.overlap, "start each bucket's all-reduce during backward");
        app.add_option("--bucket-kib", f.bucket_kib, "gradient bucket size in KiB")
            ->check(CLI::Range(std::size_t(1), std::size_t(1) << 20))
            ->capture_default_str();
      },
      [&] {
        f.threads_given = threads->count() > 0;
        run(f, *comm);
      });
}
