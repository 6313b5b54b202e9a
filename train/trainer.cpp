// The training loop behind `xgrad train`. A call of run_training goes through its phases in
// order: the options (from the command line or the resumed state), the ranks' agreement, the
// task and its model (restored from the checkpoint on --resume), the run folder, the steps,
// and the report. The task (train/task.hpp), the option table (train/options.hpp), the run
// folder (runs/run_folder.cpp) and the checkpoint (train/train_state.cpp) live elsewhere.
#include <xgrad/train/trainer.hpp>
#include <xgrad/train/eval_samples.hpp>
#include <xgrad/io/number.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>
#include <thread>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#endif

#include <xgrad/core/detail/sha256.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/nn/sdpa.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/model_schema.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/train/detail/grad_accum.hpp>
#include <xgrad/train/detail/step.hpp>
#include <xgrad/train/detail/train_state.hpp>
#include <xgrad/train/adapters.hpp>
#include <xgrad/runs/plots.hpp>
#include <xgrad/train/task.hpp>

namespace xg::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace detail;

const std::vector<std::string> kRunDefiningFlags = run_defining_flags();

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string clock_text(double s) {
  const long t = static_cast<long>(std::max(0.0, s) + 0.5);
  std::ostringstream os;
  os << t / 60 << ":" << std::setw(2) << std::setfill('0') << t % 60;
  return os.str();
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The output of ranks other than 0: discarded.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// --threads 0: the cores of this machine divided among the ranks on it, and no more than the
// CPUs this process may run on (mpirun binds each of 2 ranks to one core by default).
int default_threads(int local_ranks) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    const int allowed = CPU_COUNT(&set);
    if (allowed > 0) return std::max(1, std::min(allowed, cores / std::max(1, local_ranks)));
  }
#endif
  return std::max(1, cores / std::max(1, local_ranks));
}

// A saved option value for a message: a number stored with every digit (0.0050000000000000001)
// as the shortest text that reads back as the same double (0.005); anything else as it is.
std::string shown(const std::string& v) {
  if (v.find_first_of(".eE") == std::string::npos) return v;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end != v.c_str() + v.size() || !std::isfinite(d)) return v;
  return io::shortest_text(d);
}

// A new run in `out`: refuse a folder that holds a different run unless --overwrite (the
// same options are the same run: starting it again is harmless).
void check_out_folder(const TrainOptions& o) {
  const fs::path out(o.out);
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw UsageError(op_message("train", "--out " + o.out + " exists and is not a directory"));
  if (o.overwrite) return;
  std::vector<std::string> present;
  for (const char* f : {runs::kStateFile, runs::kModelFile, runs::kBestFile, runs::kLogFile, runs::kRunIdFile, runs::kConfigFile})
    if (fs::exists(out / f, ec)) present.push_back(f);
  if (present.empty()) return;
  const std::string advice = "; continue it with --resume " + o.out + ", choose another --out, or pass --overwrite";
  io::safetensors::Metadata saved;
  try {
    saved = io::safetensors::load((out / runs::kStateFile).string()).metadata;
  } catch (const Error&) {
    throw UsageError(op_message("train", "--out " + o.out + " holds files of another run (" + join(present) + ")" + advice));
  }
  std::vector<std::string> differ;
  for (const auto& [k, v] : options_metadata(o)) {
    auto it = saved.find(k);
    // Runs saved before an option existed have its legacy value (the table's).
    const OptionSpec* spec = find_option(k.substr(4));
    const std::string was = it != saved.end() ? it->second : spec && spec->has_legacy ? spec->legacy : "?";
    if (was != v) differ.push_back(k.substr(4) + " " + shown(was) + " -> " + shown(v));
  }
  if (!differ.empty())
    throw UsageError(op_message("train", "--out " + o.out + " holds a different run (" + join(differ) + ")" + advice));
}

std::string read_bytes(const std::string& path) {
  io::require_input_file(path, "[train] the checkpoint", io::InputError::format);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  if (!in || !(ss << in.rdbuf())) throw FormatError("[train] cannot read " + path);
  return ss.str();
}

// Where a session writes: rank 0 to the caller's streams, the other ranks to nowhere.
struct Console {
  Console(bool root, std::ostream& out_root, std::ostream& progress_root)
      : null_out(&null_buffer), out(root ? out_root : null_out), progress(root ? progress_root : null_out) {
    // The progress line is redrawn in place (\r) only on a terminal, and only rank 0 draws it.
    tty = root && ((&progress_root == &std::cerr || &progress_root == &std::clog)
                       ? ::isatty(STDERR_FILENO) != 0
                       : (&progress_root == &std::cout && ::isatty(STDOUT_FILENO) != 0));
  }
  NullBuffer null_buffer;
  std::ostream null_out;
  std::ostream& out;       // the run's record (rank 0's)
  std::ostream& progress;  // the progress line and warnings (rank 0's)
  bool tty = false;
};

// --resume: the saved state, until it is restored.
struct SavedState {
  io::safetensors::File state;
  std::string path;        // its train_state.safetensors
  std::string log_sha256;  // the state's digest of log.csv ("" for states saved before it)
};

// What is trained: the task (its data and model), the optimizer and the parameters it updates.
struct Model {
  std::unique_ptr<Task> task;
  std::unique_ptr<nn::AdamW> opt;
  nn::NamedTensors params;  // the trainable ones
};

// Validation tasks: the lowest validation loss so far and its step (on resume, from the log),
// and the last one.
struct ValidationRecord {
  double best = std::numeric_limits<double>::infinity();
  std::int64_t best_step = 0;
  double last = 0;  // the validation loss at the last step
  bool have_last = false;
};

// One call of run_training: what its phases share.
struct Session {
  Session(const TrainOptions& opts, dist::Communicator& c, std::ostream& out_root, std::ostream& progress_root)
      : o(with_defaults(opts)),
        comm(c),
        world(c.size()),
        root(c.rank() == 0),
        console(root, out_root, progress_root),
        data(o.seed + 1),
        dropout(o.seed + 2) {}

  TrainOptions o;
  dist::Communicator& comm;
  const int world;
  std::string kernels;  // the "kernels: ..." line (kernels_line), asked for before the run folder opens
  const bool root;
  Console console;
  SavedState resume;
  RunIdentity run;  // rank 0: the run's identity
  Model model;
  Generator data, dropout;  // the data stream's and dropout's random draws
  std::int64_t start = 0;   // the step the run continues from
  AdapterSummary adapters;  // what --lora-* and --freeze did (train/adapters.hpp)
  int threads = 1;
  std::unique_ptr<runs::RunLog> csv;  // rank 0
  ValidationRecord val;
};

// Reads the state to resume (rank 0 reads, the others get its bytes).
void read_resume_state(Session& s) {
  s.resume.path = (fs::path(s.o.resume) / runs::kStateFile).string();
  std::string bytes;
  dist::together(s.comm, [&] {
    if (!s.root) return;
    s.resume.state = io::safetensors::load(s.resume.path);
    if (s.world > 1) bytes = read_bytes(s.resume.path);
  });
  if (s.world > 1) s.comm.broadcast(bytes, 0);
  dist::together(s.comm, [&] {
    if (!s.root) s.resume.state = io::safetensors::load_bytes(bytes, s.resume.path);
  });
}

// The run's options: the command line's, or on --resume the saved run's with this session's
// flags (--threads, --stop-at, --dist-*), checked. A failure is every rank's at once.
void resolve_options(Session& s) {
  // Whether the run resumes decides the collectives that follow (rank 0 sends the state it
  // reads): every rank must agree on it before any of them acts on it.
  if (s.world > 1) {
    const std::string mine = s.o.resume.empty() ? "without" : "with";
    std::string root = mine;
    s.comm.broadcast(root, 0);
    dist::together(s.comm, [&] {
      if (root != mine)
        throw UsageError(op_message("train", "rank " + std::to_string(s.comm.rank()) + " was started " + mine +
                                                 " --resume and rank 0 " + root +
                                                 " it: start every rank with the same command line"));
    });
  }
  if (!s.o.resume.empty()) read_resume_state(s);
  dist::together(s.comm, [&] {
    TrainOptions& o = s.o;
    if (!o.resume.empty() && s.root) {
      // First of all: the state must be the folder's run (a state copied from another run
      // would otherwise continue that run here, over this run's log and model).
      const auto it = s.resume.state.metadata.find("run_id");
      s.run.id = it == s.resume.state.metadata.end() ? "" : it->second;
      runs::check_run_id(s.run.id, o.resume, s.resume.path);
      const auto log = s.resume.state.metadata.find("log_sha256");
      if (log != s.resume.state.metadata.end()) s.resume.log_sha256 = log->second;
    }
    if (!o.resume.empty()) {
      const std::string out_dir = o.resume;
      o = options_from_metadata(s.resume.state.metadata, o, s.resume.path);
      o.out = out_dir;
      TrainOptions saved = o;  // this session's flags are checked as flags
      const TrainOptions defaults;
      for (const OptionSpec& spec : option_schema())
        if (spec.role == OptionRole::session) set_option_text(saved, spec, option_text(defaults, spec), spec.name);
      try {
        validate_options(saved);
      } catch (const UsageError& e) {
        throw FormatError("[train] " + s.resume.path + ": the saved options are invalid: " + e.what());
      }
      validate_session_options(o);
    } else {
      validate_options(o);
      // --doc-separator auto becomes the run's separator, saved (a resumed run has its own:
      // a state saved before the option means none).
      resolve_doc_separator(o);
      if (s.root) {
        check_out_folder(o);
        s.run.id = runs::new_run_id();
      }
    }
    if (o.batch % static_cast<std::size_t>(s.world) != 0)
      throw UsageError(op_message(
          "train", std::string(o.resume.empty() ? "--batch " : "the resumed run's --batch ") + std::to_string(o.batch) +
                       " does not divide among " + std::to_string(s.world) +
                       " ranks: --batch is the global batch, split into equal shards (use a multiple of " +
                       std::to_string(s.world) + ")"));
  });
  s.run.on_disk = !s.o.resume.empty();  // checked against run_id.txt above
  std::error_code ec;
  s.run.config_on_disk = !s.o.resume.empty() && fs::exists(fs::path(s.o.out) / runs::kConfigFile, ec);
}

// The worker threads per rank. A new run: --threads, or 0 for the cores. A resumed run: the
// count its checkpoint saved (1 for a run saved before the count was: the default then), so
// that it continues bit for bit on a machine with another number of cores; a --threads that
// differs is used, with a warning (reductions split by the thread count may round otherwise).
void choose_threads(Session& s) {
  dist::together(s.comm, [&] {
    if (s.o.resume.empty()) {
      s.threads = s.o.threads > 0 ? s.o.threads : default_threads(s.comm.local_size());
      return;
    }
    const int saved = saved_threads(s.resume.state.metadata, s.resume.path);
    s.threads = s.o.threads > 0 ? s.o.threads : saved;
    if (s.threads != saved)
      s.console.progress << "xgrad: warning: --threads " << s.threads << ": the run was saved with " << saved
                 << (saved == 1 ? " thread" : " threads") << "; it continues, but its results may differ in the last "
                 << "bits from an uninterrupted run (leave out --threads to keep the saved count)\n"
                 << std::flush;
  });
}

// Every rank must run the same loop: the same run and the same session options that decide
// which collectives run when (a rank that stopped earlier would leave the others waiting).
// The table says which (--threads, --no-progress, --no-plot and --dist-overlap may differ).
void agree_across_ranks(Session& s) {
  if (s.world == 1) return;
  const std::map<std::string, std::string> mine = options_ranks_agree_on(s.o);
  std::string text;
  for (const auto& [k, v] : mine) text += k + "=" + v + "\n";
  s.comm.broadcast(text, 0);
  dist::together(s.comm, [&] {
    std::vector<std::string> differ;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      const std::string k = line.substr(0, line.find('=')), v = line.substr(line.find('=') + 1);
      if (mine.count(k) && mine.at(k) != v) differ.push_back(k.substr(4) + " " + v + " -> " + mine.at(k));
    }
    if (!differ.empty())
      throw UsageError(op_message("train", "rank " + std::to_string(s.comm.rank()) +
                                               " was started with other options than rank 0 (" + join(differ) +
                                               "): start every rank with the same command line"));
  });
}

// One differing metadata value, theirs against mine, in a few dozen bytes whatever their sizes:
// short values whole; long ones (a tokenizer model, a vocabulary) by size, digest and where
// they first differ (for a vocabulary: the first differing entry).
std::string metadata_difference(const std::string& key, const std::string& theirs, const std::string& mine) {
  constexpr std::size_t kWhole = 40;
  if (theirs.size() <= kWhole && mine.size() <= kWhole) return key + " " + shown_value(theirs) + " vs " + shown_value(mine);
  const auto sized = [](const std::string& v) {
    return std::to_string(v.size()) + " bytes, sha256 " + xg::detail::sha256_hex(v).substr(0, 16);
  };
  std::string where;
  if (key == "vocabulary") {
    try {
      const text::Vocabulary a = text::Vocabulary::from_json(theirs), b = text::Vocabulary::from_json(mine);
      std::size_t i = 0;
      while (i < a.size() && i < b.size() && a.tokens[i] == b.tokens[i]) ++i;
      where = std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " tokens";
      if (i < a.size() && i < b.size())
        where += ", entry " + std::to_string(i) + " '" + shown_value(a.tokens[i], 16) + "' vs '" +
                 shown_value(b.tokens[i], 16) + "'";
    } catch (const Error&) {
      where.clear();
    }
  }
  if (where.empty()) {
    std::size_t i = 0;
    while (i < theirs.size() && i < mine.size() && theirs[i] == mine[i]) ++i;
    where = "first difference at byte " + std::to_string(i);
  }
  return key + " differs (" + sized(theirs) + " vs " + sized(mine) + "; " + where + ")";
}

// --init-from: the checkpoint must describe exactly this model (any metadata key this trainer
// writes), then its weights replace the initial ones. A text run may bring its own tokenizer (one
// that fits the model's vocabulary, train/tasks/text.cpp): the task, the vocabulary and the
// tokenizer's keys are then the run's, not the checkpoint's.
void load_init_from(Session& s) {
  const io::safetensors::Metadata saved = io::safetensors::load(s.o.init_from).metadata;
  std::vector<std::string> differ;
  // A text run may set anew what is not the model's shape: the task word, the vocabulary and
  // every carried field of the model schema (its tokenizer, how it reads its text).
  const auto run_data = [&](const std::string& k) {
    const ModelField* f = find_model_field(k);
    return k == "task" || k == "vocabulary" || (f && f->presence == ModelField::Presence::carried);
  };
  for (const auto& [k, v] : model_metadata(s.model.task->info())) {
    if (s.o.task == "text" && run_data(k)) continue;
    auto it = saved.find(k);
    if (it == saved.end())
      differ.push_back(k + " (missing) vs " + shown_value(v, 40));
    else if (it->second != v)
      differ.push_back(metadata_difference(k, it->second, v));
  }
  if (!differ.empty())
    throw UsageError(op_message("train", "--init-from " + shown_value(s.o.init_from) + " is not the model of this run (" +
                                             join(differ) + ")"));
  nn::safetensors::load_module(s.o.init_from, s.model.task->module());
}

// The task, its model and the optimizer; on --resume, restored from the state.
void build(Session& s) {
  s.model.task = make_task(s.o, s.comm);
  dist::together(s.comm, [&] {
    const TrainOptions& o = s.o;
    Task& task = *s.model.task;
    // Everything that will be saved must be savable before any work is done.
    io::safetensors::check_metadata(model_metadata(task.info()), (fs::path(o.out) / runs::kModelFile).string());
    const std::map<std::string, std::string> opts = options_metadata(o);
    io::safetensors::check_metadata(io::safetensors::Metadata(opts.begin(), opts.end()),
                                    (fs::path(o.out) / runs::kStateFile).string());
    const std::uint64_t n_expected = parameter_count(task.info().kind, task.info().config);
    if (n_expected > 1000000000)
      throw UsageError(op_message("train", "the model would have " + std::to_string(n_expected) +
                                               " parameters; the limit is 1000000000 (reduce --d-model, --layers, --d-ff)"));
    if (!o.resume.empty()) {
      task.check_resume(s.resume.state.metadata, s.resume.path);
      if (s.root) check_saved_model_size(s.resume.state, o, s.resume.path, n_expected);
    }
    Generator init(o.seed);
    task.build_model(init);
    if (o.resume.empty() && !o.init_from.empty() && s.root) load_init_from(s);
    // LoRA adapters and --freeze (train/adapters.hpp), after the base weights are in place.
    s.adapters = apply_adapters(task.module(), o, init);
    // Only trainable parameters get optimizer state (and are saved in train_state.safetensors).
    s.model.params = task.module().named_trainable_parameters();
    s.model.opt = std::make_unique<nn::AdamW>(s.model.params, o.lr, o.weight_decay);
    if (!o.resume.empty()) {
      std::uint64_t n_trainable = 0;
      for (const auto& named : s.model.params) n_trainable += named.second.size();
      const ResumePoint point = read_resume_point(s.resume.state, o, s.resume.path, s.root, n_trainable);
      s.start = point.step;
      restore(point, s.resume.state, s.resume.path, s.root, s.model.params, *s.model.opt, s.data, s.dropout);
      if (s.root && !point.legacy_pair) load_frozen_parameters(task.module(), (fs::path(o.out) / runs::kModelFile).string());
    }
  });
  s.resume.state = {};
  // Every rank starts from rank 0's parameters (the same anyway: same seed, same checkpoint),
  // frozen ones included.
  const nn::NamedTensors all = s.model.task->module().named_parameters();
  dist::broadcast_parameters(s.comm, all, 0);
  dist::check_parameters_agree(s.comm, all, "at the start");
}

// Rank 0's files. log.csv: on resume keep exactly the rows up to the checkpoint, then continue.
void open_run_folder(Session& s) {
  dist::together(s.comm, [&] {
    if (!s.root) return;
    const fs::path out(s.o.out);
    const bool bpb = s.model.task->logs_bits_per_byte();
    const std::vector<std::string> kept =
        s.start > 0 ? runs::rows_up_to(out / runs::kLogFile, s.start, bpb) : std::vector<std::string>{};
    for (const std::string& row : kept) {
      const std::vector<std::string> f = runs::csv_fields(row);
      if (!f[6].empty() && io::parse_double(f[6], "log.csv") < s.val.best) {
        s.val.best = io::parse_double(f[6], "log.csv");
        s.val.best_step = io::parse_int(f[0], "log.csv");
      }
    }
    // The log to continue (nothing written yet): its kept rows must be the ones this run's
    // checkpoint committed (a log.csv copied in from another run has rows of the same form).
    s.csv = std::make_unique<runs::RunLog>(out / runs::kLogFile, kept, bpb);
    if (!s.resume.log_sha256.empty() && s.csv->digest() != s.resume.log_sha256)
      throw FormatError("[train] " + (out / runs::kLogFile).string() + ": its header and rows 1.." + std::to_string(s.start) +
                        " have sha256 " + s.csv->digest().substr(0, 16) + ", the checkpoint of run " + s.run.id +
                        " saved them with sha256 " + shown_value(s.resume.log_sha256, 16) +
                        ": not this run's log (copied from another run?); restore the run's own log.csv");
    // Every check has passed: the files the task prepared join the run folder (a refused run
    // leaves it as it was).
    s.model.task->commit_files();
    runs::prepare_out_folder(s.o.out);
    start_eval_samples(s.o.out, s.start);  // samples.jsonl up to the checkpoint
    // Resuming: bring model.safetensors to the state's step first. It is written after the state,
    // so kills that keep landing between the two would otherwise leave it several steps behind;
    // this keeps it at the state's step or one behind (docs/reliability.md).
    if (s.start > 0) save_model(*s.model.task, (out / runs::kModelFile).string(), s.start);
  });
}

// The kernels chosen on this CPU (docs/performance.md, "GEMM: which library computes the
// products"), as one line. run_training asks for it before the run folder opens: a variable
// that forces a kernel with an unknown value (XGRAD_KERNELS, XGRAD_BF16_ATTENTION, ...) fails
// the run before anything is written or created.
std::string kernels_line(const TrainOptions& o) {
  std::string kernels = "kernels: float32 GEMM " + float32_gemm_kernels();
  if (o.dtype == "float64") kernels += "; float64 GEMM " + float64_gemm_kernels();
  if (o.dtype == "bfloat16")
    kernels += "; bfloat16 products " + bfloat16_gemm_kernels() + "; bfloat16 attention " +
               nn::bfloat16_attention_kernels();
  return kernels;
}

// The lines that say what is trained.
void describe(Session& s, const dist::GradientReducer& reducer, const dist::Shard& shard) {
  const TrainOptions& o = s.o;
  const ModelInfo& info = s.model.task->info();
  const std::string others = describe_options(o);
  // The model's kind as people name it: a decoder of Llama blocks is "llama", not "gpt".
  const std::string kind = info.kind == ModelKind::gpt ? nn::architecture_name(info.config.arch) : model_kind_name(info.kind);
  s.console.out << "xgrad train: task " << o.task << ", " << kind << " d_model " << o.d_model << ", heads " << o.heads
        << "/" << info.config.H_kv << " (q/kv), layers " << o.layers << ", " << s.model.task->module().parameter_count()
        << " parameters; " << o.steps << " steps of batch " << o.batch * o.grad_accum
        << (o.grad_accum > 1 ? " (" + std::to_string(o.grad_accum) + " micro-batches of " + std::to_string(o.batch) + ")"
                             : std::string())
        << ", lr " << number_text(o.lr) << ", seed " << o.seed
        << (others.empty() ? "" : "; " + others) << "; out " << o.out
        << (s.start > 0 ? "; resumed at step " + std::to_string(s.start) : "") << "; " << s.threads
        << (s.threads == 1 ? " thread" : " threads") << (s.world > 1 ? " per rank" : "") << "\n";
  s.console.out << s.kernels << "\n";
  s.console.out << s.model.task->describe_data();
  s.console.out << describe_adapters(s.adapters, o);
  if (o.dtype == "bfloat16" && effective_matmul_dtype() != MatmulDtype::bfloat16)
    s.console.out << "note: --dtype bfloat16 runs in float32 here: " << bfloat16_matmul_unavailable_reason() << "\n";
  if (s.start == 0 && !o.init_from.empty()) {
    const double m = s.model.task->evaluate(s.comm, nullptr);
    s.console.out << "initialised from " << o.init_from << ": " << s.model.task->metric_name() << " " << m << " before training\n";
  }
  if (s.world > 1)
    s.console.out << "data parallel: " << s.comm.description() << "; " << shard.rows() << " sequences per rank per step, "
          << s.threads << (s.threads == 1 ? " thread" : " threads") << " per rank; gradients "
          << reducer.bytes() / 1024 << " KiB in " << reducer.buckets() << (reducer.buckets() == 1 ? " bucket" : " buckets")
          << (o.dist_overlap ? ", overlapped with backward" : "") << "\n";
}

// One optimizer step: the loss of this rank's shard, backward (with the ranks' gradients
// summed), clipping, AdamW. Returns the global batch's mean loss; *grad_norm the clipped
// norm; *signal the stop signal the ranks agree on (several ranks) .
double train_step(Session& s, std::int64_t step, const dist::Shard& shard, dist::GradientReducer& reducer,
                  double* grad_norm, int* signal) {
  Tape tape;
  s.model.opt->lr = detail::Schedule{s.o.lr, s.o.min_lr_ratio, s.o.warmup, s.o.steps}.at(step);
  double l = 0;
  *signal = 0;
  if (s.o.grad_accum > 1) {
    // --grad-accum K: K micro-batches, each differentiated on its own; then the ranks' sums.
    l = accumulate_gradients(*s.model.task, s.o.batch, s.o.grad_accum, s.data, s.dropout, shard);
    if (s.world > 1) {
      reducer.reduce();
      l = s.comm.all_reduce(l, dist::ReduceOp::sum);
    }
  } else {
    double weight = 1.0;
    Tensor loss = s.model.task->loss(s.o.batch, s.data, s.dropout, shard, &weight);
    if (s.world == 1) {
      loss.backward();
      l = loss.item();
    } else {
      // d(weight * loss): the ranks' gradients sum to the gradient of the global batch's mean.
      BackwardOptions bo;
      bo.on_leaf_grad = reducer.hook();
      xg::backward(loss, Array::full(loss.shape(), weight, loss.dtype()), bo);
      reducer.reduce();
      l = s.comm.all_reduce(loss.item() * weight, dist::ReduceOp::sum);
    }
  }
  if (s.world > 1) {
    // A signal on any rank stops every rank after this step.
    const int mine = s.o.stop_signal ? static_cast<int>(*s.o.stop_signal) : 0;
    *signal = static_cast<int>(s.comm.all_reduce(static_cast<double>(mine), dist::ReduceOp::max));
  }
  if (!std::isfinite(l))
    dist::fail_together(s.comm, ValueError(op_message("train", "loss is not finite at step " + std::to_string(step))));
  // The same summed gradients on every rank: the same clipping and step.
  *grad_norm = detail::finish_step(*s.model.opt, s.model.params, s.o.clip);
  return l;
}

// Validation tasks: the validation loss at step `step` (every --eval-every steps and at the
// last), kept as model_best.safetensors when it is the lowest so far. Returns whether it was.
bool validate_at(Session& s, std::int64_t step, double val) {
  if (step == s.o.steps) {
    s.val.last = val;
    s.val.have_last = true;
  }
  if (!(val < s.val.best)) return false;
  s.val.best = val;
  s.val.best_step = step;
  if (s.root) save_model(*s.model.task, (fs::path(s.o.out) / runs::kBestFile).string(), step, {{"val_loss", exact(val)}});
  return true;
}

// The steps from s.start + 1 to the end (or --stop-at, or a signal).
void train_loop(Session& s, dist::GradientReducer& reducer, const dist::Shard& shard, TrainResult& result) {
  const TrainOptions& o = s.o;
  Task& task = *s.model.task;
  const std::int64_t every = std::max<std::int64_t>(1, o.steps / 20);
  const auto t0 = Clock::now();
  task.module().train();
  double recent = 0;
  result.steps_done = s.start;  // a resumed run that had no step left trains none
  for (std::int64_t step = s.start + 1; step <= o.steps; ++step) {
    double gn = 0;
    int agreed_signal = 0;
    const double l = train_step(s, step, shard, reducer, &gn, &agreed_signal);
    result.losses.push_back(l);
    recent = step == s.start + 1 ? l : 0.9 * recent + 0.1 * l;
    const double elapsed = seconds_since(t0);
    const double tps =
        static_cast<double>(task.tokens_per_batch(o.batch * o.grad_accum) * static_cast<std::size_t>(step - s.start)) /
        std::max(elapsed, 1e-9);
    const bool val_now = task.has_validation() && detail::every_and_last(step, o.eval_every, o.steps);
    const double val = val_now ? task.validation_loss(s.comm) : 0.0;
    const bool new_best = val_now && validate_at(s, step, val);
    if (s.csv) {
      std::string row = detail::log_row(step, s.model.opt->lr, l, gn, tps, elapsed, val_now ? &val : nullptr);
      if (task.logs_bits_per_byte()) row += "," + (val_now ? exact(task.metric_of_validation(val)) : std::string());
      s.csv->row(row);
    }
    if (s.csv && val_now) write_eval_sample(task, s.o.out, step);  // samples.jsonl
    if (o.progress && (s.console.tty || step % every == 0 || step == o.steps)) {
      const double eta = elapsed / static_cast<double>(step - s.start) * static_cast<double>(o.steps - step);
      std::ostringstream line;  // own stream: no formatting state leaks into `out`
      line << (s.console.tty ? "\r" : "") << "step " << step << "/" << o.steps << " | loss " << std::fixed
           << std::setprecision(4) << recent << " | " << static_cast<long>(tps) << " tok/s | elapsed "
           << clock_text(elapsed) << " | ETA " << clock_text(eta) << (s.console.tty ? "   " : "\n");
      s.console.progress << line.str() << std::flush;
    }
    if (o.eval_every > 0 && step % o.eval_every == 0 && step != o.steps) {
      const double m = task.has_validation() ? val : task.evaluate(s.comm, nullptr);
      if (s.console.tty && o.progress) s.console.progress << "\n" << std::flush;
      s.console.out << "  eval at step " << step << ": " << (task.has_validation() ? "val_loss " : task.metric_name() + " ")
            << m
            << (task.logs_bits_per_byte() ? ", " + task.metric_name() + " " + std::to_string(task.metric_of_validation(m))
                                          : std::string())
            << (new_best ? " (best so far)" : "") << "\n";
    }
    if (s.world > 1 && o.dist_check_every > 0 && step % o.dist_check_every == 0)
      dist::check_parameters_agree(s.comm, s.model.params, "after step " + std::to_string(step));
    const int sig = s.world > 1 ? agreed_signal : o.stop_signal ? static_cast<int>(*o.stop_signal) : 0;
    if (s.csv && (detail::every_and_last(step, o.checkpoint_every, o.steps) || step == o.stop_at || sig != 0))
      save_checkpoint(task, o, s.threads, s.run, *s.model.opt, step, s.data, s.dropout, *s.csv);
    result.steps_done = step;
    if (sig != 0) {
      result.signal = sig;
      break;
    }
    if (step == o.stop_at) break;
  }
  if (s.console.tty && o.progress) s.console.progress << "\n" << std::flush;
  result.seconds = seconds_since(t0);
}

// loss.png, drawn by gnuplot: a picture of a finished run that never turns it into a failure.
// Returns the picture's path when drawn ("" otherwise).
std::string draw_loss_curve(Session& s) {
  if (!s.o.plot || !s.root) return "";
  const std::string png = (fs::path(s.o.out) / runs::kLossPicture).string();
  try {
    const runs::Picture p = runs::loss_curve_png(s.csv->path().string(), png, "xgrad train: " + s.o.task, s.model.task->has_validation());
    if (p.drawn) return png;
    s.console.progress << "xgrad: warning: " << p.note << "\n" << std::flush;
  } catch (const Error& e) {
    s.console.progress << "xgrad: warning: no loss curve: " << e.what() << "\n" << std::flush;
  }
  return "";
}

// The end of a finished run: the metric, samples, the files, the RESULT lines.
void report(Session& s, TrainResult& result) {
  Task& task = *s.model.task;
  std::ostringstream samples;
  double train_loss = 0;  // validation tasks: the mean training loss of the last 5% of this session's steps
  if (task.has_validation()) {
    const double val = s.val.have_last ? s.val.last : task.validation_loss(s.comm);
    result.metric = task.metric_of_validation(val);
    if (s.root) task.sample(samples);
    const std::size_t n = std::min(std::max<std::size_t>(1, result.losses.size() / 20), result.losses.size());
    for (std::size_t i = result.losses.size() - n; i < result.losses.size(); ++i)
      train_loss += result.losses[i] / static_cast<double>(n);
    if (s.val.best_step == 0 || val < s.val.best) {  // a resumed run that had nothing left to do
      s.val.best = val;
      s.val.best_step = result.steps_done;
    }
    s.console.out << "samples:\n" << samples.str();
    s.console.out << "validation loss " << val << ", perplexity " << std::exp(val);
    if (task.logs_bits_per_byte()) s.console.out << ", bits per byte " << result.metric;
    if (!result.losses.empty())
      s.console.out << "; training loss " << train_loss << " (mean of the last steps"
            << (s.o.dropout > 0 ? ", dropout " + number_text(s.o.dropout) + " on)" : ")");
    s.console.out << "\nbest validation loss " << s.val.best << " at step " << s.val.best_step << ": "
          << (fs::path(s.o.out) / runs::kBestFile).string() << "\n";
  } else {
    result.metric = task.evaluate(s.comm, s.root ? &samples : nullptr);
    s.console.out << "samples:\n" << samples.str();
  }
  result.metric_name = task.metric_name();
  // Rank 0 alone has the log (csv) and writes files.
  std::string written = s.root ? (fs::path(s.o.out) / runs::kModelFile).string() + ", " + s.csv->path().string() : "";
  const std::string png = draw_loss_curve(s);
  if (!png.empty()) written += ", " + png;
  s.console.out << "wrote " << written << "\n";
  std::ostringstream timing;
  timing << "trained " << result.steps_done - s.start << " steps in " << std::fixed << std::setprecision(1)
         << result.seconds << " s";
  if (s.world > 1)
    timing << " on " << s.world << " ranks (gradient all-reduce " << std::setprecision(2) << result.allreduce_seconds
           << " s)";
  s.console.out << timing.str() << "\n";
  std::ostringstream results;  // the RESULT lines, also kept in the run folder's result.txt
  if (task.has_validation()) {
    if (!result.losses.empty()) results << "RESULT train_loss " << train_loss << "\n";
    results << "RESULT best_val_loss " << s.val.best << " step " << s.val.best_step << "\n";
  }
  results << "RESULT " << result.metric_name << " " << result.metric << "\n";
  s.console.out << results.str();
  // result.txt: what the run printed at its end, for xgrad report (samples, RESULT lines).
  if (s.root) {
    const std::string path = (fs::path(s.o.out) / runs::kResultFile).string();
    try {
      io::write_atomically(path, "samples:\n" + samples.str() + results.str(), "[train] " + path + ": ");
    } catch (const Error& e) {
      s.console.progress << "xgrad: warning: " << e.what() << "\n" << std::flush;
    }
  }
}

}  // namespace

TrainResult run_training(const TrainOptions& opts, std::ostream& out) { return run_training(opts, out, out); }

TrainResult run_training(const TrainOptions& opts, std::ostream& out, std::ostream& progress) {
  const std::unique_ptr<dist::Communicator> local = dist::make_local();
  return run_training(opts, out, progress, *local);
}

TrainResult run_training(const TrainOptions& opts, std::ostream& out, dist::Communicator& comm) {
  return run_training(opts, out, out, comm);
}

TrainResult run_training(const TrainOptions& opts, std::ostream& out_root, std::ostream& progress_root,
                         dist::Communicator& comm) {
  // Setup: a failure in any phase is every rank's at once (dist::together): one rank reports
  // it, every rank exits with its status.
  Session s(opts, comm, out_root, progress_root);
  resolve_options(s);
  agree_across_ranks(s);
  choose_threads(s);
  set_num_threads(s.threads);
  // --dtype bfloat16: the run's float32 matmuls take bfloat16 inputs (restored when the run ends).
  const MatmulDtypeScope matmul_dtype(s.o.dtype == "bfloat16" ? MatmulDtype::bfloat16 : MatmulDtype::float32);
  // Every rank: the same variables fail every rank at once; rank 0's measured choices are
  // every rank's.
  dist::agree_on_kernel_choices(s.comm, [&s] { s.kernels = kernels_line(s.o); });
  build(s);
  open_run_folder(s);

  const dist::Shard shard = dist::shard_of(s.o.batch * s.o.grad_accum, comm.rank(), s.world);
  dist::GradientReducer::Options ro;
  ro.bucket_bytes = s.o.dist_bucket_kib * 1024;
  ro.overlap = s.o.dist_overlap;
  dist::GradientReducer reducer(comm, s.model.params, ro);
  describe(s, reducer, shard);

  TrainResult result;
  result.ranks = s.world;
  result.threads = s.threads;
  if (s.root) {  // a resumed run is unfinished again until report() writes its new result.txt
    std::error_code ec;
    fs::remove(fs::path(s.o.out) / runs::kResultFile, ec);
  }
  train_loop(s, reducer, shard, result);
  result.allreduce_seconds = reducer.total_seconds();
  dist::check_parameters_agree(comm, s.model.params, "at the end");
  if (result.signal == 0 && s.o.stop_signal && *s.o.stop_signal && s.world == 1)
    result.signal = static_cast<int>(*s.o.stop_signal);
  if (result.signal != 0) {
    s.console.out << "interrupted by signal " << result.signal << " after step " << result.steps_done
          << "; checkpoint and log in " << s.o.out << "; continue with: xgrad train --resume " << s.o.out << "\n"
          << std::flush;
    return result;
  }
  if (result.steps_done < s.o.steps && s.o.stop_at > 0) {
    s.console.out << "stopped at step " << result.steps_done << " (checkpoint in " << s.o.out << ")\n";
    return result;
  }
  report(s, result);
  return result;
}

}  // namespace xg::train
