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
#include <xgrad/core/error.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/distributed/data_parallel.hpp>
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

// The text of --config FILE (UsageError if it cannot be read): a regular file of at most
// kConfigLimit bytes (a FIFO or a device is refused by name, before it is opened).
std::string read_config(const std::string& path) {
  return io::read_input_file(path, io::kConfigLimit, "[train] --config");
}

}  // namespace

void add_train(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  auto config = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("train", "Train a tiny transformer on a built-in task (the main job)");
  // Every flag from the option table (train/options.hpp): one row an option.
  for (const train::OptionSpec& spec : train::option_schema()) {
    if (spec.flag.empty()) continue;
    std::visit(
        [&](auto member) {
          auto& value = (*o).*member;
          using T = std::decay_t<decltype(value)>;
          if constexpr (std::is_same_v<T, bool>) {
            cmd->add_flag(spec.negated ? spec.flag + "{false}" : spec.flag, value, spec.help);
          } else {
            CLI::Option* opt = cmd->add_option(spec.flag, value, spec.help);
            if (spec.show_default) opt->capture_default_str();
            if constexpr (std::is_same_v<T, double>)
              opt->check(number());
            else if constexpr (std::is_signed_v<T> && !std::is_same_v<T, std::string>)
              opt->check(integer());
            else if constexpr (!std::is_same_v<T, std::string>)
              opt->check(non_negative_integer());
            if (spec.name == "init_from") opt->check(non_empty_path());
          }
        },
        spec.member);
  }
  cmd->add_option("--config", *config, "a JSON file of options (keys: the options' names, e.g. \"d_model\"; a run's "
                                        "config.json repeats it); flags given beside it win")
      ->check(non_empty_path());
  cmd->callback([o, config, cmd] {
    // Checks of the command line, which every rank of an MPI job shares; rank 0 alone reports
    // a failure (cli/main.cpp: the others exit quietly with the same status).
    // The options given: on the command line, or in --config (the command line wins).
    std::set<std::string> given;
    for (const train::OptionSpec& spec : train::option_schema())
      if (!spec.flag.empty() && cmd->count(spec.flag) > 0) given.insert(spec.name);
    if (!config->empty()) {
      if (!o->resume.empty())
        throw UsageError(op_message("train", "--config cannot be combined with --resume: a resumed run keeps the "
                                             "options saved in " + o->resume));
      train::TrainOptions from_file = *o;
      for (const std::string& name : train::apply_config_json(from_file, read_config(*config), *config)) {
        if (name == "threads" && given.count(name) && from_file.threads != o->threads)
          std::cerr << "xgrad: warning: --threads " << o->threads << ": " << *config << " records "
                    << from_file.threads << (from_file.threads == 1 ? " thread" : " threads")
                    << "; the run repeats, but not bit for bit (sums split among threads round otherwise)\n";
        if (given.count(name)) continue;  // the flag wins
        const train::OptionSpec& spec = *train::find_option(name);
        train::set_option_text(*o, spec, train::option_text(from_file, spec), "--config");
        given.insert(name);
      }
    }
    if (cmd->count("--resume") > 0 && o->resume.empty())
      throw UsageError(op_message("train", "--resume needs the folder of a run, got ''"));
    if (!o->resume.empty()) {
      // A resumed run is the saved run: its options come from the checkpoint.
      std::string allowed;
      for (const std::string& flag : train::session_flags()) allowed += (allowed.empty() ? "" : ", ") + flag;
      for (const std::string& flag : train::run_defining_flags())
        if (cmd->count(flag) > 0)
          throw UsageError(op_message("train", flag + " cannot be combined with --resume: a resumed run keeps the "
                                                      "options saved in " + o->resume + " (it may take " + allowed +
                                                      ")"));
    }
    if (o->resume.empty()) {
      if (!o->init_from.empty()) train::apply_init_from(*o, given);
      train::resolve_task_alias(*o, given);  // --task charlm: the text task with --tokenizer bytes
      // A task may have defaults of its own (charlm, text: model, schedule, regularisation; --arch
      // llama: rotary positions) for the options not given.
      *o = train::with_task_defaults(*o, given);
      // Options that the run's task (or position scheme) does not read would be ignored: refuse them.
      train::check_options_apply(*o, given);
      if (given.count("lr") && o->lr == 0.0)
        throw UsageError(op_message("train", "--lr 0: must be a number in (0, 1] (leave --lr out for the default)"));
      train::validate_options(train::with_defaults(*o));
      // Rank 0 alone writes the run folder (the other ranks, maybe on other machines, need none).
      if (dist::detect_launch().rank == 0) {
        check_output_folder("train", "--out", o->out);
        // The run's files must not replace an input (--config, --init-from, the texts, the
        // tokenizer), nor become its texts (a resume would find them changed).
        if ((o->task == "charlm" || o->task == "text") && same_file(o->text, o->out))
          throw UsageError(op_message("train", "--text '" + o->text + "' is the --out folder '" + o->out +
                                                   "': the run's files would join its texts; give another --out"));
        std::vector<FileRole> files{{"--config", *config, false}, {"--init-from", o->init_from, false}};
        if (o->task == "charlm" || o->task == "text") {
          files.push_back({"--text", o->text, false});
          if (o->task == "text" && o->tokenizer != "bytes") files.push_back({"--tokenizer", o->tokenizer, false});
        }
        for (const char* f : {"model.safetensors", "model_best.safetensors", "train_state.safetensors", "log.csv",
                              "loss.png", "loss.gp", "config.json", "run_id.txt", "train.bin", "val.bin"})
          files.push_back({"--out's " + std::string(f), (std::filesystem::path(o->out) / f).string(), true});
        check_distinct_files("train", files);
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
