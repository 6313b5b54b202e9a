// `xgrad train`: trains a built-in task from scratch (or resumes a run). With no arguments
// it is the main job: the sort task, reaching >= 99% held-out exact match in a few minutes.
#include <CLI/CLI.hpp>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <unistd.h>

#include "commands.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/dist/communicator.hpp>
#include <xgrad/dist/data_parallel.hpp>
#include <xgrad/train/trainer.hpp>

namespace xg::cli {

namespace {

volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_quiet = 0;  // a rank other than 0: rank 0 alone says it is stopping

// First SIGINT/SIGTERM: ask the loop to finish its step, checkpoint and stop. A second one:
// leave at once (the last checkpoint on disk is intact: it is replaced atomically).
extern "C" void on_stop_signal(int sig) {
  if (g_stop != 0) ::_exit(128 + sig);
  g_stop = sig;
  if (g_quiet) return;
  static const char msg[] = "\nxgrad: stopping after this step (checkpoint, log); press Ctrl-C again to quit at once\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
}

// Installed for the training loop only: before and after it (also while the ranks agree on a
// refusal and finalise MPI), SIGINT/SIGTERM end the process at once and silently, as mpirun
// expects when it tears the job down.
class StopSignals {
 public:
  explicit StopSignals(bool quiet) {
    g_quiet = quiet ? 1 : 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
};

}  // namespace

void add_train(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  CLI::App* cmd = app.add_subcommand("train", "Train a tiny transformer on a built-in task (the main job)");
  cmd->add_option("--task", o->task, "sort (decoder-only), reverse (encoder-decoder) or charlm")
      ->check(CLI::IsMember({"sort", "reverse", "charlm"}))
      ->capture_default_str();
  cmd->add_option("--text", o->text, "charlm: the text file to learn, or a folder of them (all its files)")
      ->capture_default_str();
  cmd->add_option("--out", o->out, "output directory")->capture_default_str();
  cmd->add_option("--resume", o->resume, "continue the run saved in this output directory");
  cmd->add_option("--init-from", o->init_from,
                  "a new run starting from this model.safetensors (e.g. from xgrad convert): its model options and weights")
      ->check(non_empty_path());
  cmd->add_option("--steps", o->steps, "training steps (0: task default)")->capture_default_str()
      ->check(integer());
  cmd->add_option("--batch", o->batch, "sequences per step")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--lr", o->lr, "peak learning rate, in (0, 1] (default: 0.003; charlm 0.005)")->check(number());
  cmd->add_option("--warmup", o->warmup, "warmup steps")->capture_default_str()
      ->check(integer());
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW weight decay")->capture_default_str()
      ->check(number());
  cmd->add_option("--clip", o->clip, "gradient clipping by global norm")->capture_default_str()
      ->check(number());
  cmd->add_option("--dtype", o->dtype, "parameter and arithmetic precision: float32 or float64")
      ->check(CLI::IsMember({"float32", "float64"}))
      ->capture_default_str();
  cmd->add_option("--d-model", o->d_model, "model width")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--heads", o->heads, "query heads H_q")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads H_kv (0: = heads; 1: MQA)")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--layers", o->layers, "transformer layers")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--d-ff", o->d_ff, "feed-forward width (0: 4 d_model)")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--dropout", o->dropout, "dropout")->capture_default_str()
      ->check(number());
  cmd->add_option("--pos", o->pos, "positions (decoder-only tasks): learned, rope, alibi or none")->capture_default_str();
  cmd->add_option("--rope-base", o->rope_base, "--pos rope: frequency base, > 1")->capture_default_str()
      ->check(number());
  cmd->add_option("--rope-fraction", o->rope_fraction, "--pos rope: fraction of each head rotated, in (0, 1]")
      ->capture_default_str()->check(number());
  cmd->add_option("--rope-layout", o->rope_layout, "--pos rope: interleaved or half-split (GPT-NeoX)")
      ->capture_default_str();
  cmd->add_option("--context", o->context, "charlm: context length")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--window", o->window,
                  "sliding-window attention: each position sees itself and the W-1 before it (0: no window)")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--digits", o->n_digits, "sort: digits per problem")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--seed", o->seed, "random seed (initialisation, data, dropout)")->capture_default_str()
      ->check(non_negative_integer());
  cmd->add_option("--threads", o->threads, "xgrad worker threads per rank (0: the cores, shared among the ranks on this machine)")->capture_default_str()
      ->check(integer());
  cmd->add_option("--eval-every", o->eval_every, "evaluate every N steps (0: only at the end)")->capture_default_str()
      ->check(integer());
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "checkpoint every N steps (0: only at the end)")
      ->capture_default_str()->check(integer());
  cmd->add_option("--stop-at", o->stop_at, "stop after this step, as if interrupted (for resume)")->check(integer());
  cmd->add_flag("--no-progress{false}", o->progress, "no live progress line");
  cmd->add_flag("--no-plot{false}", o->plot, "do not draw loss.png");
  cmd->add_flag("--overwrite", o->overwrite, "replace a different run saved in --out");
  // Data-parallel runs: mpirun -np N xgrad train ... (docs/distributed.md).
  cmd->add_option("--dist-check-every", o->dist_check_every,
                  "several ranks: compare parameter checksums every N steps (0: at the start and end only)")
      ->capture_default_str()
      ->check(integer());
  cmd->add_flag("--dist-overlap", o->dist_overlap, "several ranks: all-reduce gradient buckets during backward");
  cmd->add_option("--dist-bucket-kib", o->dist_bucket_kib, "several ranks: gradient bucket size in KiB")
      ->capture_default_str()
      ->check(non_negative_integer());
  cmd->callback([o, cmd] {
    // Checks of the command line, which every rank of an MPI job shares; rank 0 alone reports
    // a failure (cli/main.cpp: the others exit quietly with the same status).
    if (cmd->count("--resume") > 0 && o->resume.empty())
      throw UsageError(op_message("train", "--resume needs the folder of a run, got ''"));
    if (!o->resume.empty()) {
      // A resumed run is the saved run: its options come from the checkpoint.
      for (const std::string& flag : train::kRunDefiningFlags)
        if (cmd->count(flag) > 0)
          throw UsageError(op_message("train", flag + " cannot be combined with --resume: a resumed run keeps the "
                                                      "options saved in " + o->resume +
                                                      " (it may take --threads, --stop-at, --no-progress, --no-plot, "
                                                      "--dist-check-every, --dist-overlap, --dist-bucket-kib)"));
    }
    if (o->resume.empty()) {
      if (!o->init_from.empty())
        train::apply_init_from(*o, [cmd](const std::string& flag) { return cmd->count(flag) > 0; });
      // Flags that only one task reads would be ignored by the others: refuse them.
      auto only_for = [&](const std::string& flag, const std::string& task) {
        if (cmd->count(flag) > 0 && o->task != task)
          throw UsageError(op_message("train", flag + " is only for --task " + task + " (this run is --task " +
                                                   o->task + ")"));
      };
      only_for("--text", "charlm");
      only_for("--context", "charlm");
      only_for("--digits", "sort");
      for (const char* flag : {"--rope-base", "--rope-fraction", "--rope-layout"})
        if (cmd->count(flag) > 0 && o->pos != "rope")
          throw UsageError(op_message("train", std::string(flag) + " is only for --pos rope (this run is --pos " +
                                                   o->pos + ")"));
      if (cmd->count("--lr") > 0 && o->lr == 0.0)
        throw UsageError(op_message("train", "--lr 0: must be a number in (0, 1] (leave --lr out for the default)"));
      // charlm has defaults of its own (model, schedule, regularisation) for the flags not given.
      if (o->task == "charlm") *o = train::with_charlm_defaults(*o, [&](const std::string& f) { return cmd->count(f) > 0; });
      train::validate_options(train::with_defaults(*o));
      // Rank 0 alone writes the run folder (the other ranks, maybe on other machines, need none).
      if (dist::detect_launch().rank == 0) {
        check_output_folder("train", "--out", o->out);
        if (o->task == "charlm") {
          // The run's files must not become its texts (a resume would find them changed) or
          // replace one of them.
          if (same_file(o->text, o->out))
            throw UsageError(op_message("train", "--text '" + o->text + "' is the --out folder '" + o->out +
                                                     "': the run's files would join its texts; give another --out"));
          std::vector<FileRole> files{{"--text", o->text, false}};
          for (const char* f : {"model.safetensors", "model_best.safetensors", "train_state.safetensors", "log.csv",
                                "loss.png", "loss.gp"})
            files.push_back({"--out's " + std::string(f), (std::filesystem::path(o->out) / f).string(), true});
          check_distinct_files("train", files);
        }
      }
    }
    g_stop = 0;
    // One process, or one rank of the job mpirun/srun started (docs/distributed.md).
    std::unique_ptr<dist::Communicator> comm = dist::launch();  // rank 0 alone reports a failure
    std::optional<StopSignals> guard;
    guard.emplace(comm->rank() > 0);
    train::TrainOptions opts = *o;
    opts.stop_signal = &g_stop;
    train::TrainResult r;
    try {
      // Results (the run, samples, files written, RESULT) on stdout; the live progress line and
      // warnings on stderr, so `xgrad train > log` keeps a clean record.
      r = train::run_training(opts, std::cout, std::cerr, *comm);
    } catch (const dist::CollectiveError& e) {
      // Every rank failed here together (a refusal, a bad file, a diverged run): the reporter
      // says why before any rank may exit, then all end normally (MPI_Finalize). A rank that
      // leaves first would have mpirun tear down the others, the reporter maybe before its line.
      guard.reset();  // from here a SIGTERM (mpirun ending the job) ends a rank silently
      if (e.reporter()) {
        try {
          e.rethrow();
        } catch (...) {
          print_line(describe_failure(std::current_exception(), "train").line);
        }
      }
      if (comm->size() > 1) {
        try {
          comm->barrier();  // every rank waits here until the reporter has written its line
        } catch (const Error&) {
        }
      }
      comm.reset();
      throw CLI::RuntimeError(e.exit_code());
    } catch (...) {
      if (comm->size() == 1) throw;
      // This rank alone failed; the others may be waiting for it: report, then end the job.
      const std::exception_ptr failure = std::current_exception();
      std::string m = dist::message_of(failure);
      for (char& c : m)
        if (c == '\n' || c == '\r') c = ' ';
      std::cerr << ("xgrad: rank " + std::to_string(comm->rank()) + " of " + std::to_string(comm->size()) + ": " + m +
                    "\n");  // one write: mpirun interleaves the output of its processes
      comm->abort(dist::exit_code_of(failure));
    }
    if (r.signal != 0) {
      if (comm->rank() == 0)
        std::cerr << ("xgrad: interrupted by signal " + std::to_string(r.signal) + " after step " +
                      std::to_string(r.steps_done) + "; checkpoint written; continue with xgrad train --resume " +
                      (o->resume.empty() ? o->out : o->resume) + "\n");
      throw CLI::RuntimeError(128 + r.signal);
    }
  });
}

}  // namespace xg::cli
