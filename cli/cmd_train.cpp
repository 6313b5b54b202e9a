// `xgrad train`: trains a built-in task from scratch (or resumes a run). With no arguments
// it is the main job: the sort task, reaching >= 99% held-out exact match in a few minutes.
#include <CLI/CLI.hpp>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <type_traits>
#include <variant>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>
#include <unistd.h>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/train/lifecycle.hpp>
#include <xgrad/train/options.hpp>
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

// The handler's own stack. oneDNN's float32 GEMM kernel points the stack pointer at a heap
// workspace while it runs (oneDNN 2.6: whenever its K block exceeds 84), so a signal frame
// pushed on the interrupted stack (some 3 KiB of AVX-512 register state) overwrote the heap
// below that workspace, and a later free() aborted ("corrupted size vs. prev_size"). 64 KiB
// holds the largest frame (AVX-512 and AMX state) many times over.
alignas(64) char g_handler_stack[64 * 1024];

// Installed for the training loop only: before and after it (also while the ranks agree on a
// refusal and finalise MPI), SIGINT/SIGTERM end the process at once and silently, as mpirun
// expects when it tears the job down. The handler runs on an alternate stack (SA_ONSTACK; the
// thread's own if it has one, e.g. AddressSanitizer's, else g_handler_stack); the pool's workers
// block these signals (core/parallel.cpp), so no handler ever runs on a stack inside a GEMM.
class StopSignals {
 public:
  explicit StopSignals(bool quiet) {
    g_quiet = quiet ? 1 : 0;
    stack_t current {};
    if (::sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) != 0) {
      stack_t mine {};
      mine.ss_sp = g_handler_stack;
      mine.ss_size = sizeof g_handler_stack;
      own_stack_ = ::sigaltstack(&mine, &old_stack_) == 0;
    }
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    if (own_stack_) ::sigaltstack(&old_stack_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {};
  stack_t old_stack_ {};
  bool own_stack_ = false;
};

// Every flag from the option table (train/options.hpp): one row an option.
void add_train_flags(Options& opts, train::TrainOptions& o) {
  for (const train::OptionSpec& spec : train::option_schema()) {
    if (spec.flag.empty()) continue;
    std::visit([&](auto member) { opts.add(train_flag(spec), o.*member); }, spec.member);
  }
}

// The defaults that differ by task (and by --arch), from the table and the task defaults
// themselves: what --help shows below the options.
std::string task_defaults() {
  const train::TrainOptions table;
  std::string text = "Defaults by task, where they differ from the ones above:";
  const std::vector<std::pair<std::string, train::TrainOptions>> cases = [] {
    std::vector<std::pair<std::string, train::TrainOptions>> v;
    for (const char* task : {"sort", "reverse", "text"}) {
      train::TrainOptions o;
      o.task = task;
      v.emplace_back(std::string("--task ") + task + (o.task == "text" ? " (and charlm)" : ""), o);
    }
    train::TrainOptions llama;
    llama.arch = "llama";
    v.emplace_back("--arch llama", llama);
    return v;
  }();
  const train::TrainOptions sort = train::with_defaults(table);
  for (const auto& [label, given] : cases) {
    const train::TrainOptions d = train::with_task_defaults(train::with_defaults(given), {});
    const train::TrainOptions& base = label == "--arch llama" ? sort : table;  // llama: beside sort's
    std::string parts;
    for (const train::OptionSpec& s : train::option_schema())
      if (!s.flag.empty() && s.name != "task" && s.name != "arch" &&
          train::option_text(d, s) != train::option_text(base, s))
        parts += (parts.empty() ? "" : ", ") + s.flag + " " + train::shown_text(d, s);
    text += "\n  " + label + ": " + parts;
  }
  return text;
}

// A new run's files (rank 0 writes the run folder; the other ranks, maybe on other machines,
// need none): --out can be written, and no file of the run replaces an input (--config,
// --init-from, the texts, the tokenizer) or becomes one of its texts (a resume would find them
// changed).
void check_run_files(const train::TrainOptions& o, const std::string& config) {
  check_output_folder("train", "--out", o.out);
  const bool text_task = o.task == "charlm" || o.task == "text";
  if (text_task && same_file(o.text, o.out))
    throw UsageError(op_message("train", "--text '" + o.text + "' is the --out folder '" + o.out +
                                             "': the run's files would join its texts; give another --out"));
  std::vector<FileRole> files{{"--config", config, false}, {"--init-from", o.init_from, false}};
  if (text_task) {
    files.push_back({"--text", o.text, false});
    if (o.task == "text" && o.tokenizer != "bytes") files.push_back({"--tokenizer", o.tokenizer, false});
  }
  for (const char* f : {"model.safetensors", "model_best.safetensors", "train_state.safetensors", "log.csv",
                        "loss.png", "loss.gp", "config.json", "run_id.txt", "train.bin", "val.bin"})
    files.push_back({"--out's " + std::string(f), (std::filesystem::path(o.out) / f).string(), true});
  check_distinct_files("train", files);
}

// Every rank failed together (a refusal, a bad file, a diverged run): the reporter says why
// before any rank may exit, then all end normally (MPI_Finalize). A rank that leaves first
// would have mpirun tear down the others, the reporter maybe before its line.
[[noreturn]] void end_together(const dist::CollectiveError& e, std::unique_ptr<dist::Communicator>& comm) {
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
}

// This rank alone failed; the others may be waiting for it: report, then end the job.
void end_alone(const std::exception_ptr& failure, dist::Communicator& comm) {
  std::string m = dist::message_of(failure);
  for (char& c : m)
    if (c == '\n' || c == '\r') c = ' ';
  std::cerr << ("xgrad: rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size()) + ": " + m +
                "\n");  // one write: mpirun interleaves the output of its processes
  comm.abort(dist::exit_code_of(failure));
}

// The training loop, in one process or as one rank of the job mpirun/srun started
// (docs/distributed.md); a stop by signal exits 128 + the signal.
void run(const train::TrainOptions& o) {
  g_stop = 0;
  std::unique_ptr<dist::Communicator> comm = dist::launch();  // rank 0 alone reports a failure
  std::optional<StopSignals> guard;
  guard.emplace(comm->rank() > 0);
  train::TrainOptions opts = o;
  opts.stop_signal = &g_stop;
  train::TrainResult r;
  try {
    // Results (the run, samples, files written, RESULT) on stdout; the live progress line and
    // warnings on stderr, so `xgrad train > log` keeps a clean record.
    r = train::run_training(opts, std::cout, std::cerr, *comm);
  } catch (const dist::CollectiveError& e) {
    guard.reset();  // from here a SIGTERM (mpirun ending the job) ends a rank silently
    end_together(e, comm);
  } catch (...) {
    if (comm->size() == 1) throw;
    end_alone(std::current_exception(), *comm);
  }
  if (r.signal != 0) {
    if (comm->rank() == 0)
      std::cerr << ("xgrad: interrupted by signal " + std::to_string(r.signal) + " after step " +
                    std::to_string(r.steps_done) + "; checkpoint written; continue with xgrad train --resume " +
                    (o.resume.empty() ? o.out : o.resume) + "\n");
    throw CLI::RuntimeError(128 + r.signal);
  }
}

}  // namespace

void add_train(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  auto config = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("train", "Train a tiny transformer on a built-in task (the main job)");
  Options opts(*cmd, "train");
  add_train_flags(opts, *o);
  cmd->add_option("--config", *config, "a JSON file of options (keys: the options' names, e.g. \"d_model\"; a run's "
                                        "config.json repeats it); flags given beside it win")
      ->check(non_empty_path());
  opts.example("xgrad train --task text --text corpus/ --steps 500 --out run1", task_defaults());
  // Ranges and choices are the life-cycle's (they apply after the task defaults): no opts.check().
  cmd->callback([o, config, cmd] {
    // The command line only parses; the options module applies the life-cycle rules. Every
    // rank of an MPI job shares them; rank 0 alone reports a failure (cli/main.cpp: the others
    // exit quietly with the same status).
    train::Invocation inv;
    for (const train::OptionSpec& spec : train::option_schema())
      if (!spec.flag.empty() && cmd->count(spec.flag) > 0) inv.given.insert(spec.name);
    inv.resume_flag = cmd->count("--resume") > 0;
    inv.config = *config;
    train::resolve_invocation(*o, inv, std::cerr);
    if (o->resume.empty() && dist::detect_launch().rank == 0) check_run_files(*o, *config);
    run(*o);
  });
}

}  // namespace xg::cli
