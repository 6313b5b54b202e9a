#include <xgrad/train/trainer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#endif

#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/dist/communicator.hpp>
#include <xgrad/dist/data_parallel.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/generate.hpp>
#include <xgrad/train/plots.hpp>

namespace xg::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

// A double as text that reads back to the same double (std::to_string keeps 6 decimals).
std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The options that define a run, saved with its state so --resume continues the same run.
nn::safetensors::Metadata options_metadata(const TrainOptions& o) {
  nn::safetensors::Metadata m = {{"opt.task", o.task},
          {"opt.text", o.text},
          {"opt.steps", std::to_string(o.steps)},
          {"opt.batch", std::to_string(o.batch)},
          {"opt.lr", exact(o.lr)},
          {"opt.min_lr_ratio", exact(o.min_lr_ratio)},
          {"opt.warmup", std::to_string(o.warmup)},
          {"opt.weight_decay", exact(o.weight_decay)},
          {"opt.clip", exact(o.clip)},
          {"opt.dtype", o.dtype},
          {"opt.d_model", std::to_string(o.d_model)},
          {"opt.heads", std::to_string(o.heads)},
          {"opt.kv_heads", std::to_string(o.kv_heads)},
          {"opt.layers", std::to_string(o.layers)},
          {"opt.d_ff", std::to_string(o.d_ff)},
          {"opt.dropout", exact(o.dropout)},
          {"opt.pos", o.pos},
          {"opt.rope_base", exact(o.rope_base)},
          {"opt.rope_fraction", exact(o.rope_fraction)},
          {"opt.rope_layout", o.rope_layout},
          {"opt.context", std::to_string(o.context)},
          {"opt.n_digits", std::to_string(o.n_digits)},
          {"opt.min_len", std::to_string(o.min_len)},
          {"opt.max_len", std::to_string(o.max_len)},
          {"opt.seed", std::to_string(o.seed)},
          {"opt.eval_every", std::to_string(o.eval_every)},
          {"opt.checkpoint_every", std::to_string(o.checkpoint_every)},
          {"opt.heldout", std::to_string(o.heldout)},
          {"opt.window", std::to_string(o.window)}};
  if (!o.init_from.empty()) m["opt.init_from"] = o.init_from;  // only then: earlier runs lack it
  return m;
}

TrainOptions options_from_metadata(const nn::safetensors::Metadata& m, TrainOptions o, const std::string& path) {
  auto get = [&](const std::string& k) {
    auto it = m.find("opt." + k);
    if (it == m.end()) throw FormatError("[train] " + path + ": state lacks option '" + k + "'");
    return it->second;
  };
  auto where = [&](const std::string& k) { return "[train] " + path + ": metadata 'opt." + k + "'"; };
  auto i64 = [&](const std::string& k) { return parse_int(get(k), where(k)); };
  auto size = [&](const std::string& k) {
    const std::uint64_t v = parse_uint(get(k), where(k));
    if (v > (std::uint64_t(1) << 40)) throw FormatError(where(k) + " = " + get(k) + " is out of range");
    return static_cast<std::size_t>(v);
  };
  auto real = [&](const std::string& k) { return parse_double(get(k), where(k)); };
  o.task = get("task");
  o.text = get("text");
  o.steps = i64("steps");
  o.batch = size("batch");
  o.lr = real("lr");
  o.min_lr_ratio = real("min_lr_ratio");
  o.warmup = i64("warmup");
  o.weight_decay = real("weight_decay");
  o.clip = real("clip");
  // Runs saved before --dtype existed trained in float32.
  o.dtype = m.count("opt.dtype") ? get("dtype") : "float32";
  o.d_model = size("d_model");
  o.heads = size("heads");
  o.kv_heads = size("kv_heads");
  o.layers = size("layers");
  o.d_ff = size("d_ff");
  o.dropout = real("dropout");
  // Runs saved before --pos existed had learned position embeddings.
  if (m.count("opt.pos")) {
    o.pos = get("pos");
    o.rope_base = real("rope_base");
    o.rope_fraction = real("rope_fraction");
    o.rope_layout = get("rope_layout");
  }
  o.context = size("context");
  o.n_digits = size("n_digits");
  o.min_len = size("min_len");
  o.max_len = size("max_len");
  o.seed = parse_uint(get("seed"), where("seed"));
  o.eval_every = i64("eval_every");
  o.checkpoint_every = i64("checkpoint_every");
  o.heldout = size("heldout");
  // Runs saved before --window existed had no window.
  o.window = m.count("opt.window") ? size("window") : 0;
  o.init_from = m.count("opt.init_from") ? get("init_from") : "";
  return o;
}

// Rows [shard.begin, shard.end) of a [B, ...] index array.
IndexArray rows_of(const IndexArray& a, const dist::Shard& shard) {
  const std::size_t row = a.shape.empty() || a.shape[0] == 0 ? 0 : a.size() / a.shape[0];
  Shape shape = a.shape;
  shape[0] = shard.rows();
  return IndexArray(shape, std::vector<std::int64_t>(a.data.begin() + static_cast<long>(shard.begin * row),
                                                     a.data.begin() + static_cast<long>(shard.end * row)));
}

// Targets that take part in the loss.
std::size_t targets_in(const IndexArray& targets) {
  std::size_t n = 0;
  for (std::int64_t t : targets.data) n += t != kIgnore;
  return n;
}

// Everything a run needs, built from the options.
struct Run {
  TrainOptions o;
  std::unique_ptr<SortTask> sort;
  std::unique_ptr<ReverseTask> reverse;
  std::unique_ptr<CharLMTask> charlm;
  ModelInfo info;
  std::unique_ptr<nn::GPT> gpt;
  std::unique_ptr<nn::EncoderDecoder> encdec;
  std::vector<std::vector<std::int64_t>> heldout;
  std::string corpus;  // charlm: CharLMTask::fingerprint of the texts, saved with the state
  // The run's identity (rank 0): a random id made when the run is created, saved in the state
  // and in the folder's run_id.txt. Empty for a run saved before run ids existed (it stays so).
  std::string run_id;
  bool run_id_on_disk = false;  // run_id.txt holds run_id (resumed, or written at the first checkpoint)

  nn::Module& module() { return gpt ? static_cast<nn::Module&>(*gpt) : static_cast<nn::Module&>(*encdec); }

  // corpus: the charlm texts (read by rank 0, the same on every rank).
  Run(const TrainOptions& opts, const std::vector<TextFile>& corpus) : o(opts) {
    nn::TransformerConfig c;
    c.dtype = o.dtype == "float64" ? DType::float64 : DType::float32;
    c.d_model = o.d_model;
    c.H_q = o.heads;
    c.H_kv = o.kv_heads;
    c.layers = o.layers;
    c.d_ff = o.d_ff;
    c.dropout = o.dropout;
    c.window = o.window;
    c.pos = nn::position_scheme_from_name(o.pos);
    c.rope.base = o.rope_base;
    c.rope.fraction = o.rope_fraction;
    c.rope.layout = ops::rope_layout_from_name(o.rope_layout);
    info.task = o.task;
    if (o.task == "sort") {
      sort = std::make_unique<SortTask>(o.n_digits);
      info.vocab = sort->vocab();
      c.context = sort->context();
      info.task_params = {{"n_digits", std::to_string(o.n_digits)}, {"n_values", "10"}};
      heldout = sort->heldout(o.heldout, o.seed + 1000);
      sort->exclude(heldout);
    } else if (o.task == "reverse") {
      reverse = std::make_unique<ReverseTask>(o.min_len, o.max_len);
      info.vocab = reverse->vocab();
      c.context = reverse->context();
      info.task_params = {{"min_len", std::to_string(o.min_len)}, {"max_len", std::to_string(o.max_len)}};
      heldout = reverse->heldout(o.heldout, o.seed + 1000);
      reverse->exclude(heldout);
    } else if (o.task == "charlm") {
      charlm = std::make_unique<CharLMTask>(o.text, o.context, corpus);
      info.vocab = charlm->vocab();
      c.context = o.context;
    } else {
      throw ValueError(op_message("train", "unknown task '" + o.task + "' (sort, reverse, charlm)"));
    }
    c.V_vocab = info.vocab.size();
    info.config = c.resolved();
    info.kind = reverse ? "encoder_decoder" : "gpt";
  }

  // Allocates the model (after its size was checked against the limits and the checkpoint).
  void build_model() {
    Generator init(o.seed);
    if (reverse)
      encdec = std::make_unique<nn::EncoderDecoder>(info.config, init);
    else
      gpt = std::make_unique<nn::GPT>(info.config, init);
  }

  // Training loss of this rank's rows of one global batch drawn from `data` (every rank
  // draws the whole batch: the data stream is the one of a single process). The loss is the
  // mean over the shard's targets; *weight receives shard targets / global targets, the
  // factor that makes the ranks' weighted losses sum to the mean over the global batch.
  // One process: the whole batch, weight 1.
  Tensor loss(Generator& data, Generator& dropout, const dist::Shard& shard, double* weight) {
    ops::DropoutRowOffset rows(shard.begin);  // dropout masks by global row
    *weight = 1.0;
    if (sort || charlm) {
      LMBatch b = sort ? sort->batch(o.batch, data) : charlm->batch(o.batch, data);
      if (shard.rows() != o.batch) {
        const double global = static_cast<double>(targets_in(b.targets));
        b = LMBatch{rows_of(b.tokens, shard), rows_of(b.targets, shard)};
        *weight = static_cast<double>(targets_in(b.targets)) / global;
      }
      return gpt->loss(b.tokens, b.targets, kIgnore, &dropout);
    }
    Seq2SeqBatch b = reverse->batch(o.batch, data);
    if (shard.rows() != o.batch) {
      const double global = static_cast<double>(targets_in(b.tgt_out));
      b = Seq2SeqBatch{rows_of(b.src, shard),
                       std::vector<std::size_t>(b.src_lengths.begin() + static_cast<long>(shard.begin),
                                                b.src_lengths.begin() + static_cast<long>(shard.end)),
                       rows_of(b.tgt_in, shard), rows_of(b.tgt_out, shard)};
      *weight = static_cast<double>(targets_in(b.tgt_out)) / global;
    }
    return encdec->loss(b.src, b.src_lengths, b.tgt_in, b.tgt_out, kIgnore, &dropout);
  }

  std::size_t tokens_per_batch() const {
    if (sort) return o.batch * 2 * sort->n();
    if (charlm) return o.batch * o.context;
    return o.batch * (reverse->max_len() * 2 + 1);
  }

  // charlm: the mean loss over a fixed validation set (the same 10 batches of --batch windows
  // of the validation split at every call), sharded over the ranks and summed (a collective).
  double val_loss(dist::Communicator& comm) {
    module().eval();
    NoGradGuard ng;
    const std::size_t R = static_cast<std::size_t>(comm.size());
    Generator eval_gen(o.seed + 2000);
    double sum = 0;
    const int batches = 10;
    const dist::Shard shard = dist::shard_of(o.batch, comm.rank(), comm.size());
    for (int i = 0; i < batches; ++i) {
      LMBatch b = charlm->batch(o.batch, eval_gen, true);
      double weight = 1.0;
      if (R > 1) {  // the mean over the global batch, as the training loss
        const double global = static_cast<double>(targets_in(b.targets));
        b = LMBatch{rows_of(b.tokens, shard), rows_of(b.targets, shard)};
        weight = static_cast<double>(targets_in(b.targets)) / global;
      }
      sum += R > 1 ? gpt->loss(b.tokens, b.targets).item() * weight : gpt->loss(b.tokens, b.targets).item();
    }
    module().train();
    return comm.all_reduce(sum, dist::ReduceOp::sum) / batches;
  }

  // Held-out exact match (sort, reverse) or validation loss (charlm), sharded over the ranks
  // and summed (a collective: every rank calls it); prints a few samples of rank 0's shard
  // (samples: null on the other ranks).
  double evaluate(dist::Communicator& comm, std::ostream* samples) {
    module().eval();
    double metric = 0;
    const std::size_t R = static_cast<std::size_t>(comm.size()), r = static_cast<std::size_t>(comm.rank());
    if (sort || reverse) {
      // Held-out problems [n r / R, n (r + 1) / R): shards differ by at most one.
      const std::size_t n = heldout.size(), first = n * r / R, last = n * (r + 1) / R;
      const std::vector<std::vector<std::int64_t>> mine(heldout.begin() + static_cast<long>(first),
                                                        heldout.begin() + static_cast<long>(last));
      std::size_t right = 0;
      if (sort && !mine.empty()) {
        std::vector<std::vector<std::int64_t>> prompts;
        for (const auto& d : mine) prompts.push_back(sort->prompt(d));
        const Generation g = generate(*gpt, prompts, sort->n());
        for (std::size_t i = 0; i < mine.size(); ++i) {
          const auto want = sort->answer(mine[i]);
          const bool ok = g.tokens[i] == want;
          right += ok;
          if (samples && i < 4)
            *samples << "  " << info.vocab.decode(prompts[i]) << " -> " << info.vocab.decode(g.tokens[i])
                     << (ok ? "  (right)" : "  (expected " + info.vocab.decode(want) + ")") << "\n";
        }
      } else if (reverse && !mine.empty()) {
        const Seq2SeqBatch b = reverse->make_batch(mine);
        SampleOptions so;
        so.stop_token = reverse->eos();
        const Generation g = generate(*encdec, b.src, b.src_lengths, reverse->bos(), reverse->max_len() + 1, so);
        for (std::size_t i = 0; i < mine.size(); ++i) {
          std::vector<std::int64_t> want(mine[i].rbegin(), mine[i].rend());
          want.push_back(reverse->eos());
          const bool ok = g.tokens[i] == want;
          right += ok;
          if (samples && i < 4)
            *samples << "  " << info.vocab.decode(mine[i]) << " -> " << info.vocab.decode(g.tokens[i])
                     << (ok ? "  (right)" : "  (expected " + info.vocab.decode(want) + ")") << "\n";
        }
      }
      metric = comm.all_reduce(static_cast<double>(right), dist::ReduceOp::sum) / static_cast<double>(n);
    } else {
      metric = val_loss(comm);
      if (samples) sample(*samples);
    }
    module().train();
    return metric;
  }

  // charlm: a sample of the model, 240 characters continuing a prompt taken from the
  // validation split. Past the context, each piece continues the last context/2 characters.
  void sample(std::ostream& samples) {
    module().eval();
    Generator sample_gen(o.seed + 3000);
    const LMBatch b = charlm->batch(1, sample_gen, true);
    const std::size_t p = std::min<std::size_t>(16, o.context / 2);  // prompt, then room to write
    const std::vector<std::int64_t> prompt(b.tokens.data.begin(), b.tokens.data.begin() + static_cast<long>(p));
    SampleOptions so;
    so.temperature = 0.8;
    so.generator = &sample_gen;
    std::vector<std::int64_t> text = prompt, written;
    while (written.size() < 240) {
      const std::size_t keep = std::min(text.size(), std::max<std::size_t>(1, o.context / 2));
      const std::vector<std::int64_t> window(text.end() - static_cast<long>(keep), text.end());
      const std::size_t n = std::min<std::size_t>(240 - written.size(), o.context - keep);
      const Generation g = generate(*gpt, {window}, n, so);
      text.insert(text.end(), g.tokens[0].begin(), g.tokens[0].end());
      written.insert(written.end(), g.tokens[0].begin(), g.tokens[0].end());
    }
    samples << "  sample: \"" << info.vocab.decode(prompt) << "|" << info.vocab.decode(written) << "\"\n";
    module().train();
  }
};

// log.csv, written so that it never runs ahead of nor lags behind the checkpoint: rows are
// held in memory and committed (written, flushed, fsynced) just before each checkpoint. The
// first commit writes the whole file under a temporary name and renames it into place, so an
// earlier run's log stays intact until the new run has a checkpoint of its own.
class RunLog {
 public:
  // val_loss: the validation loss at the steps that evaluated it (charlm), empty elsewhere.
  static constexpr const char* kHeader = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss";
  // The header of logs written before the val_loss column (their rows are read with it empty).
  static constexpr const char* kHeaderV1 = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s";

  RunLog(fs::path path, std::vector<std::string> kept) : path_(std::move(path)) {
    pending_ = std::string(kHeader) + "\n";
    for (const auto& row : kept) pending_ += row + "\n";
  }
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;
  ~RunLog() {
    if (file_) std::fclose(file_);
  }

  void row(const std::string& r) { pending_ += r + "\n"; }

  void commit() {
    if (!file_) {
      const std::string tmp = path_.string() + ".tmp." + std::to_string(::getpid());
      std::FILE* f = std::fopen(tmp.c_str(), "wb");
      if (!f) throw FormatError("[train] cannot write " + tmp + ": " + std::strerror(errno));
      const bool ok = write_sync(f);
      if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path_.c_str()) != 0) {
        std::remove(tmp.c_str());
        throw FormatError("[train] writing " + path_.string() + " failed: " + std::strerror(errno));
      }
      file_ = std::fopen(path_.c_str(), "ab");
      if (!file_) throw FormatError("[train] cannot append to " + path_.string() + ": " + std::strerror(errno));
    } else if (!write_sync(file_)) {
      throw FormatError("[train] writing " + path_.string() + " failed: " + std::strerror(errno));
    }
    pending_.clear();
  }

  const fs::path& path() const { return path_; }

 private:
  bool write_sync(std::FILE* f) {
    return std::fwrite(pending_.data(), 1, pending_.size(), f) == pending_.size() && std::fflush(f) == 0 &&
           ::fsync(::fileno(f)) == 0;
  }

  fs::path path_;
  std::string pending_;
  std::FILE* file_ = nullptr;
};

// The comma-separated fields of a line, empty ones included ("1,2," has 3).
std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> fields(1);
  for (char c : line) {
    if (c == ',')
      fields.emplace_back();
    else
      fields.back() += c;
  }
  return fields;
}

// The rows of an earlier log.csv up to the checkpoint's step: exactly steps 1..step, each a
// complete row of numbers; rows after the step (written after the checkpoint) are dropped.
std::vector<std::string> rows_up_to(const fs::path& path, std::int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FormatError("[train] " + path.string() + ": cannot read the log of the run to resume");
  std::string line;
  std::vector<std::string> rows;
  if (!std::getline(in, line) || (line != RunLog::kHeader && line != RunLog::kHeaderV1))
    throw FormatError("[train] " + path.string() + ":1: not the header of a training log");
  const bool v1 = line == RunLog::kHeaderV1;
  const std::size_t columns = v1 ? 6 : 7;
  for (std::int64_t n = 2; static_cast<std::int64_t>(rows.size()) < step; ++n) {
    const std::string where = "[train] " + path.string() + ":" + std::to_string(n);
    if (!std::getline(in, line))
      throw FormatError(where + ": the log ends at step " + std::to_string(rows.size()) + ", the checkpoint is at step " +
                        std::to_string(step));
    const std::vector<std::string> fields = csv_fields(line);
    if (fields.size() != columns)
      throw FormatError(where + ": expected " + std::to_string(columns) + " comma-separated fields, found " +
                        std::to_string(fields.size()));
    const std::int64_t s = parse_int(fields[0], where + ": step");
    if (s != static_cast<std::int64_t>(rows.size()) + 1)
      throw FormatError(where + ": step " + fields[0] + " where step " + std::to_string(rows.size() + 1) + " belongs");
    for (std::size_t i = 1; i < fields.size(); ++i)
      if (i != 6 || !fields[i].empty()) parse_double(fields[i], where + ": field " + std::to_string(i + 1));
    rows.push_back(v1 ? line + "," : line);
  }
  return rows;
}

const char* const kStateFile = "train_state.safetensors";
const char* const kModelFile = "model.safetensors";
const char* const kBestFile = "model_best.safetensors";  // charlm: the model at the lowest validation loss
const char* const kRunIdFile = "run_id.txt";  // the folder's run: the id of the run its files belong to
const std::string kParamPrefix = "model.", kOptimPrefix = "optim.";
// The moments AdamW keeps for every parameter (nn::Adam::update); a checkpoint holds both for each.
const std::vector<std::string> kAdamBuffers = {"exp_avg", "exp_avg_sq"};

// A new run's identity: 128 random bits as 32 lowercase hex digits. Random (not derived from
// the options), so two runs with the same flags have different ids.
std::string new_run_id() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    id += buf;
  }
  return id;
}

bool is_run_id(const std::string& id) {
  if (id.size() != 32) return false;
  for (char c : id)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The run id in DIR/run_id.txt; empty if the file does not exist (a folder of a run saved
// before run ids). FormatError if it exists but does not hold one id.
std::string read_run_id(const fs::path& dir) {
  const fs::path path = dir / kRunIdFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  std::ifstream in(path, std::ios::binary);
  std::string text;
  if (!in || !std::getline(in, text))
    throw FormatError("[train] " + path.string() + ": cannot read the run id");
  std::string rest;
  if (!is_run_id(text) || std::getline(in, rest))
    throw FormatError("[train] " + path.string() + ": not a run id (one line of 32 hex digits)");
  return text;
}

// Writes DIR/run_id.txt atomically (temporary file, fsync, rename).
void write_run_id(const fs::path& dir, const std::string& id) {
  const fs::path path = dir / kRunIdFile;
  const std::string tmp = path.string() + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw FormatError("[train] cannot write " + tmp + ": " + std::strerror(errno));
  const std::string text = id + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0 &&
                  ::fsync(::fileno(f)) == 0;
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw FormatError("[train] writing " + path.string() + " failed: " + std::strerror(errno));
  }
}

std::string describe_run_id(const std::string& id) { return id.empty() ? "none (saved before run ids)" : id; }

// --resume: the state must belong to the run whose files are in the folder. Checked before
// anything in the folder changes.
void check_run_id(const std::string& state_id, const fs::path& dir, const std::string& state_path) {
  if (!state_id.empty() && !is_run_id(state_id))
    throw FormatError("[train] " + state_path + ": metadata 'run_id' = '" + state_id + "' is not a run id (32 hex digits)");
  const std::string folder_id = read_run_id(dir);
  if (state_id == folder_id) return;
  throw FormatError("[train] " + state_path + " is from run " + describe_run_id(state_id) + ", but " +
                    (dir / kRunIdFile).string() +
                    (folder_id.empty() ? " does not exist (the folder's files are of no known run)"
                                       : " says the folder holds run " + folder_id) +
                    ": the state belongs to another run; refusing to resume (nothing changed)");
}

// The tensors of a checkpoint must be exactly each parameter and its AdamW moments: a missing
// moment would resume silently from zeros, a stray tensor means the file is not this run's.
// `params` and `moments` are the names as stored, with their prefixes (shown that way);
// `others` are tensors that are neither. A parameter missing beside both its moments is named
// as missing; moments of no parameter otherwise are unexpected.
void check_state_tensors(const std::vector<std::string>& params, const std::string& param_prefix,
                         const std::vector<std::string>& moments, const std::string& moment_prefix,
                         const std::vector<std::string>& others, const std::string& path) {
  std::set<std::string> have_params;
  for (const std::string& p : params) have_params.insert(p.substr(param_prefix.size()));
  const std::set<std::string> have_moments(moments.begin(), moments.end());
  auto moment = [&](const std::string& param, const std::string& b) { return moment_prefix + param + "." + b; };
  auto complete = [&](const std::string& param) {  // both moments of `param` are in the file
    for (const std::string& b : kAdamBuffers)
      if (!have_moments.count(moment(param, b))) return false;
    return true;
  };
  std::vector<std::string> missing, unexpected = others;
  std::set<std::string> lost_params;
  for (const std::string& m : moments) {
    const std::string rest = m.substr(moment_prefix.size());
    const std::size_t dot = rest.rfind('.');
    const std::string owner = dot == std::string::npos ? "" : rest.substr(0, dot);
    const bool adam = dot != std::string::npos &&
                      std::find(kAdamBuffers.begin(), kAdamBuffers.end(), rest.substr(dot + 1)) != kAdamBuffers.end();
    if (adam && have_params.count(owner)) continue;
    if (adam && complete(owner))
      lost_params.insert(param_prefix + owner);
    else
      unexpected.push_back(m);
  }
  for (const std::string& p : have_params) {
    bool none = true;
    for (const std::string& b : kAdamBuffers) none = none && !have_moments.count(moment(p, b));
    if (none && !lost_params.empty()) {  // a parameter renamed: it is the stray one, its moments are not missing
      unexpected.push_back(param_prefix + p);
      continue;
    }
    for (const std::string& b : kAdamBuffers)
      if (!have_moments.count(moment(p, b))) missing.push_back(moment(p, b));
  }
  missing.insert(missing.end(), lost_params.begin(), lost_params.end());
  if (missing.empty() && unexpected.empty()) return;
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", '" : "'") + v[i] + "'";
    if (v.size() > 8) s += " and " + std::to_string(v.size() - 8) + " more";
    return s;
  };
  std::string what;
  if (!missing.empty()) what += "missing tensor" + std::string(missing.size() > 1 ? "s " : " ") + list(missing);
  if (!unexpected.empty())
    what += (what.empty() ? "" : "; ") + std::string("unexpected tensor") + (unexpected.size() > 1 ? "s " : " ") +
            list(unexpected) + " (matches no parameter of the model or its moments)";
  throw FormatError("[train] " + path + ": not a complete checkpoint: " + what + "; cannot resume exactly");
}

// One checkpoint: the log first (so it holds every step the checkpoint holds), then the
// state, which holds everything resume needs and is replaced atomically (the commit point),
// then the model alone for generate/inspect.
void save_checkpoint(Run& run, const nn::Optimizer& opt, std::int64_t step, const Generator& data,
                     const Generator& dropout, RunLog& log) {
  // A new run's first checkpoint names the run in the folder before any of its files lands.
  if (!run.run_id.empty() && !run.run_id_on_disk) {
    write_run_id(run.o.out, run.run_id);
    run.run_id_on_disk = true;
  }
  log.commit();
  nn::safetensors::Metadata state = options_metadata(run.o);
  state["checkpoint"] = "xgrad-train-2";
  if (!run.run_id.empty()) state["run_id"] = run.run_id;
  state["step"] = std::to_string(step);
  state["optimizer"] = opt.kind();
  state["data_rng"] = data.state();
  state["dropout_rng"] = dropout.state();
  if (!run.corpus.empty()) state["corpus"] = run.corpus;
  nn::safetensors::NamedArrays tensors;
  for (const auto& [name, p] : run.module().named_parameters()) tensors.emplace_back(kParamPrefix + name, p.value());
  for (auto& [name, a] : opt.state()) tensors.emplace_back(kOptimPrefix + name, std::move(a));
  nn::safetensors::save((fs::path(run.o.out) / kStateFile).string(), tensors, state);
  nn::safetensors::Metadata meta = model_metadata(run.info);
  meta["step"] = std::to_string(step);
  nn::safetensors::save_module((fs::path(run.o.out) / kModelFile).string(), run.module(), meta);
}

// Names and values of a state file's tensors under `prefix`, the prefix removed.
nn::safetensors::NamedArrays with_prefix(const nn::safetensors::File& f, const std::string& prefix) {
  nn::safetensors::NamedArrays out;
  for (const auto& [name, a] : f.tensors)
    if (name.compare(0, prefix.size(), prefix) == 0) out.emplace_back(name.substr(prefix.size()), a);
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
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
  for (const char* f : {kStateFile, kModelFile, kBestFile, "log.csv", kRunIdFile})
    if (fs::exists(out / f, ec)) present.push_back(f);
  if (present.empty()) return;
  const std::string advice = "; continue it with --resume " + o.out + ", choose another --out, or pass --overwrite";
  nn::safetensors::Metadata saved;
  try {
    saved = nn::safetensors::load((out / kStateFile).string()).metadata;
  } catch (const Error&) {
    throw UsageError(op_message("train", "--out " + o.out + " holds files of another run (" + join(present) + ")" + advice));
  }
  std::vector<std::string> differ;
  for (const auto& [k, v] : options_metadata(o)) {
    auto it = saved.find(k);
    // Runs saved before --dtype (--pos, --rope-*, --window) existed have that option's default.
    const TrainOptions defaults;
    const std::map<std::string, std::string> before = {{"opt.dtype", "float32"},
                                                       {"opt.window", "0"},
                                                       {"opt.pos", defaults.pos},
                                                       {"opt.rope_base", exact(defaults.rope_base)},
                                                       {"opt.rope_fraction", exact(defaults.rope_fraction)},
                                                       {"opt.rope_layout", defaults.rope_layout}};
    const std::string was = it != saved.end() ? it->second : before.count(k) ? before.at(k) : "?";
    if (was != v) differ.push_back(k.substr(4) + " " + was + " -> " + v);
  }
  if (!differ.empty())
    throw UsageError(op_message("train", "--out " + o.out + " holds a different run (" + join(differ) + ")" + advice));
}

}  // namespace

const std::vector<std::string> kRunDefiningFlags = {
    "--task", "--text", "--out", "--steps", "--batch", "--lr", "--warmup", "--weight-decay", "--clip", "--dtype",
    "--d-model", "--heads", "--kv-heads", "--layers", "--d-ff", "--dropout", "--context", "--digits",
    "--pos", "--rope-base", "--rope-fraction", "--rope-layout",
    "--seed", "--eval-every", "--checkpoint-every", "--overwrite", "--window", "--init-from"};

void apply_init_from(TrainOptions& o, const std::function<bool(const std::string&)>& given) {
  const std::string& path = o.init_from;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UsageError(op_message("train", "--init-from '" + path + "' does not exist"));
  if (fs::is_directory(path, ec))
    throw UsageError(op_message("train", "--init-from '" + path + "' is a folder; give a model.safetensors"));
  const ModelInfo info = model_info(nn::safetensors::load(path).metadata, path);
  const nn::TransformerConfig& c = info.config;
  if (info.kind == "encoder_decoder" && c.encoder_layers != c.layers)
    throw FormatError("[train] --init-from " + path + ": " + std::to_string(c.encoder_layers) + " encoder and " +
                      std::to_string(c.layers) + " decoder layers; xgrad train makes both the same");
  auto param = [&](const char* key) -> std::size_t {
    auto it = info.task_params.find(key);
    if (it == info.task_params.end()) throw FormatError("[train] --init-from " + path + ": metadata lacks '" + key + "'");
    return static_cast<std::size_t>(parse_uint(it->second, "[train] --init-from " + path + ": metadata '" + key + "'"));
  };
  // flag, the value the run would use, the checkpoint's value, and where it goes.
  auto take = [&](const std::string& flag, const std::string& mine, const std::string& theirs, const std::string& what) {
    if (given(flag) && mine != theirs)
      throw UsageError(op_message("train", flag + " " + mine + " conflicts with --init-from " + path + " (" + what +
                                               " " + theirs + "); leave " + flag + " out"));
  };
  take("--task", o.task, info.task, "task");
  take("--d-model", std::to_string(o.d_model), std::to_string(c.d_model), "d_model");
  take("--heads", std::to_string(o.heads), std::to_string(c.H_q), "H_q");
  take("--kv-heads", std::to_string(o.kv_heads == 0 ? o.heads : o.kv_heads), std::to_string(c.H_kv), "H_kv");
  take("--layers", std::to_string(o.layers), std::to_string(c.layers), "layers");
  take("--d-ff", std::to_string(o.d_ff == 0 ? 4 * o.d_model : o.d_ff), std::to_string(c.d_ff), "d_ff");
  take("--dtype", o.dtype, dtype_name(c.dtype), "dtype");
  o.task = info.task;
  o.d_model = c.d_model;
  o.heads = c.H_q;
  o.kv_heads = c.H_kv;
  o.layers = c.layers;
  o.d_ff = c.d_ff;
  o.dtype = dtype_name(c.dtype);
  // The sliding window and the position scheme are part of the model too.
  take("--window", std::to_string(o.window), std::to_string(c.window), "window");
  o.window = c.window;
  take("--pos", o.pos, nn::position_scheme_name(c.pos), "pos");
  o.pos = nn::position_scheme_name(c.pos);
  if (c.pos == nn::PositionScheme::rope) {
    take("--rope-base", exact(o.rope_base), exact(c.rope.base), "rope_base");
    take("--rope-fraction", exact(o.rope_fraction), exact(c.rope.fraction), "rope_fraction");
    take("--rope-layout", o.rope_layout, ops::rope_layout_name(c.rope.layout), "rope_layout");
    o.rope_base = c.rope.base;
    o.rope_fraction = c.rope.fraction;
    o.rope_layout = ops::rope_layout_name(c.rope.layout);
  }
  if (info.task == "sort") {
    if (param("n_values") != 10)
      throw FormatError("[train] --init-from " + path + ": sort with " + std::to_string(param("n_values")) +
                        " values; xgrad train sorts 10");
    take("--digits", std::to_string(o.n_digits), std::to_string(param("n_digits")), "n_digits");
    o.n_digits = param("n_digits");
  } else if (info.task == "reverse") {
    o.min_len = param("min_len");
    o.max_len = param("max_len");
  } else {
    take("--context", std::to_string(o.context), std::to_string(c.context), "context");
    o.context = c.context;
  }
}

void validate_options(const TrainOptions& o) {
  auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw UsageError(op_message("train", flag + " " + value + ": " + rule));
  };
  auto count = [&](const std::string& flag, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
    if (v < lo || v > hi) bad(flag, std::to_string(v), "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  auto real = [&](const std::string& flag, double v, double lo, double hi, bool lo_open, bool hi_open) {
    const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) bad(flag, exact(v), std::string("must be a number in ") + (lo_open ? "(" : "[") + exact(lo) + ", " + exact(hi) + (hi_open ? ")" : "]"));
  };
  if (o.task != "sort" && o.task != "reverse" && o.task != "charlm") bad("--task", o.task, "must be sort, reverse or charlm");
  if (o.steps < 1 || o.steps > 100000000) bad("--steps", std::to_string(o.steps), "must be in [1, 100000000]");
  count("--batch", o.batch, 1, 65536);
  real("--lr", o.lr, 0.0, 1.0, true, false);
  real("min_lr_ratio", o.min_lr_ratio, 0.0, 1.0, false, false);
  if (o.warmup < 0 || o.warmup > 100000000) bad("--warmup", std::to_string(o.warmup), "must be in [0, 100000000]");
  real("--weight-decay", o.weight_decay, 0.0, 10.0, false, false);
  real("--clip", o.clip, 0.0, 1e6, true, false);
  if (o.dtype != "float32" && o.dtype != "float64") bad("--dtype", o.dtype, "must be float32 or float64");
  count("--d-model", o.d_model, 1, 8192);
  count("--heads", o.heads, 1, o.d_model);
  if (o.d_model % o.heads != 0)
    bad("--heads", std::to_string(o.heads), "must divide --d-model " + std::to_string(o.d_model));
  count("--kv-heads", o.kv_heads, 0, o.heads);
  if (o.kv_heads != 0 && o.heads % o.kv_heads != 0)
    bad("--kv-heads", std::to_string(o.kv_heads), "must divide --heads " + std::to_string(o.heads));
  count("--layers", o.layers, 1, 256);
  count("--d-ff", o.d_ff, 0, 65536);
  real("--dropout", o.dropout, 0.0, 1.0, false, true);
  if (o.pos != "learned" && o.pos != "rope" && o.pos != "alibi" && o.pos != "none")
    bad("--pos", o.pos, "must be learned, rope, alibi or none");
  if (o.pos != "learned" && o.task == "reverse")
    bad("--pos", o.pos, "the reverse task's encoder-decoder has learned position embeddings only (--pos learned)");
  if (!(std::isfinite(o.rope_base) && o.rope_base > 1.0 && o.rope_base <= 1e12))
    bad("--rope-base", exact(o.rope_base), "must be a number in (1, 1e12]");
  real("--rope-fraction", o.rope_fraction, 0.0, 1.0, true, false);
  if (o.rope_layout != "interleaved" && o.rope_layout != "half-split")
    bad("--rope-layout", o.rope_layout, "must be interleaved or half-split");
  if (o.pos == "rope") {
    const std::size_t d_h = o.d_model / o.heads;
    const auto r = static_cast<std::size_t>(std::floor(o.rope_fraction * static_cast<double>(d_h)));
    if (r < 2)
      bad("--rope-fraction", exact(o.rope_fraction),
          "rotates floor(fraction * d_h) = " + std::to_string(r) + " features of a head of width d_h = " +
              std::to_string(d_h) + " (--d-model / --heads); RoPE needs at least 2");
  }
  count("--context", o.context, 2, 8192);
  count("--window", o.window, 0, 65536);
  if (o.task == "sort") {
    count("--digits", o.n_digits, 1, 32);
    if (std::pow(10.0, static_cast<double>(o.n_digits)) < 2.0 * static_cast<double>(o.heldout))
      bad("--digits", std::to_string(o.n_digits),
          "too few distinct problems for a held-out set of " + std::to_string(o.heldout) +
              " and training (the held-out set may take at most half of the 10^digits problems; use --digits >= 3)");
  }
  count("min_len", o.min_len, 1, 32);
  count("max_len", o.max_len, o.min_len, 32);
  count("heldout", o.heldout, 1, 100000);
  if (o.eval_every < 0) bad("--eval-every", std::to_string(o.eval_every), "must be >= 0");
  if (o.checkpoint_every < 0) bad("--checkpoint-every", std::to_string(o.checkpoint_every), "must be >= 0");
  if (o.out.empty()) bad("--out", "''", "must name a folder");
  validate_session_options(o);
}

void validate_session_options(const TrainOptions& o) {
  auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw UsageError(op_message("train", flag + " " + value + ": " + rule));
  };
  if (o.threads < 0 || o.threads > 1024) bad("--threads", std::to_string(o.threads), "must be in [0, 1024]");
  if (o.dist_check_every < 0 || o.dist_check_every > 100000000)
    bad("--dist-check-every", std::to_string(o.dist_check_every), "must be in [0, 100000000]");
  if (o.dist_bucket_kib < 1 || o.dist_bucket_kib > (std::size_t(1) << 20))
    bad("--dist-bucket-kib", std::to_string(o.dist_bucket_kib), "must be in [1, 1048576]");
  if (o.stop_at != -1 && (o.stop_at < 1 || o.stop_at > o.steps))
    bad("--stop-at", std::to_string(o.stop_at), "must be in [1, --steps " + std::to_string(o.steps) + "]");
}

namespace {
// --task charlm's defaults (with_charlm_defaults).
constexpr std::int64_t kCharlmSteps = 2000, kCharlmWarmup = 100, kCharlmEvalEvery = 100;
constexpr double kCharlmLr = 5e-3, kCharlmDropout = 0.1, kCharlmWeightDecay = 0.1;
constexpr std::size_t kCharlmBatch = 32, kCharlmContext = 64, kCharlmDModel = 64, kCharlmLayers = 2;
}  // namespace

TrainOptions with_defaults(TrainOptions o) {
  // Defaults with a wide margin on this machine: sort reaches 100% held-out exact match by
  // about 300 steps, reverse by about 600.
  if (o.steps == 0) o.steps = o.task == "charlm" ? kCharlmSteps : (o.task == "reverse" ? 1500 : 1000);
  if (o.lr == 0.0) o.lr = 3e-3;
  return o;
}

TrainOptions with_charlm_defaults(TrainOptions o, const std::function<bool(const std::string& flag)>& given) {
  // Tuned for about 3 minutes of one core on the licence texts (docs/cli.md has the numbers).
  if (!given("--steps")) o.steps = kCharlmSteps;
  if (!given("--lr")) o.lr = kCharlmLr;
  if (!given("--batch")) o.batch = kCharlmBatch;
  if (o.init_from.empty()) {  // with --init-from the model's shape comes from the file
    if (!given("--context")) o.context = kCharlmContext;
    if (!given("--d-model")) o.d_model = kCharlmDModel;
    if (!given("--layers")) o.layers = kCharlmLayers;
  }
  if (!given("--dropout")) o.dropout = kCharlmDropout;
  if (!given("--weight-decay")) o.weight_decay = kCharlmWeightDecay;
  if (!given("--warmup")) o.warmup = kCharlmWarmup;
  if (!given("--eval-every")) o.eval_every = kCharlmEvalEvery;
  return o;
}


namespace {

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

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  if (!in || !(ss << in.rdbuf())) throw FormatError("[train] cannot read " + path);
  return ss.str();
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

TrainResult run_training(const TrainOptions& opts_in, std::ostream& out_root, std::ostream& progress_root,
                         dist::Communicator& comm) {
  const int world = comm.size();
  const bool root = comm.rank() == 0;
  NullBuffer null_buffer;
  std::ostream null_out(&null_buffer);
  std::ostream& out = root ? out_root : null_out;
  std::ostream& progress = root ? progress_root : null_out;

  // Setup. Rank 0 alone reads the run folder and the text; every rank gets the same bytes.
  // A failure in any of these steps is every rank's at once (dist::together): one rank
  // reports it, every rank exits with its status.
  TrainOptions o = with_defaults(opts_in);
  nn::safetensors::File resume_state;
  std::string state_path;
  if (!o.resume.empty()) {
    state_path = (fs::path(o.resume) / kStateFile).string();
    std::string bytes;
    dist::together(comm, [&] {
      if (!root) return;
      resume_state = nn::safetensors::load(state_path);
      if (world > 1) bytes = read_bytes(state_path);
    });
    if (world > 1) comm.broadcast(bytes, 0);
    dist::together(comm, [&] {
      if (!root) resume_state = nn::safetensors::load_bytes(bytes, state_path);
    });
  }
  std::string run_id;  // rank 0: the run's identity (Run::run_id)
  dist::together(comm, [&] {
    if (!o.resume.empty() && root) {
      // First of all: the state must be the folder's run (a state copied from another run
      // would otherwise continue that run here, over this run's log and model).
      const auto it = resume_state.metadata.find("run_id");
      run_id = it == resume_state.metadata.end() ? "" : it->second;
      check_run_id(run_id, o.resume, state_path);
    }
    if (!o.resume.empty()) {
      const std::string out_dir = o.resume;
      o = options_from_metadata(resume_state.metadata, o, state_path);
      o.out = out_dir;
      TrainOptions saved = o;  // this session's flags (--threads, --stop-at, --dist-*) are checked as flags
      const TrainOptions defaults;
      saved.threads = defaults.threads;
      saved.stop_at = defaults.stop_at;
      saved.dist_check_every = defaults.dist_check_every;
      saved.dist_bucket_kib = defaults.dist_bucket_kib;
      try {
        validate_options(saved);
      } catch (const UsageError& e) {
        throw FormatError("[train] " + state_path + ": the saved options are invalid: " + e.what());
      }
      validate_session_options(o);
    } else {
      validate_options(o);
      if (root) {
        check_out_folder(o);
        run_id = new_run_id();
      }
    }
    if (o.batch % static_cast<std::size_t>(world) != 0)
      throw UsageError(op_message(
          "train", std::string(o.resume.empty() ? "--batch " : "the resumed run's --batch ") + std::to_string(o.batch) +
                       " does not divide among " + std::to_string(world) +
                       " ranks: --batch is the global batch, split into equal shards (use a multiple of " +
                       std::to_string(world) + ")"));
  });
  if (world > 1) {
    // Every rank must run the same loop: the same run and the same session options that
    // decide which collectives run when (a rank that stopped earlier would leave the others
    // waiting). --threads, --no-progress, --no-plot and --dist-overlap may differ.
    nn::safetensors::Metadata mine = options_metadata(o);
    mine["opt.stop_at"] = std::to_string(o.stop_at);
    mine["opt.dist_check_every"] = std::to_string(o.dist_check_every);
    mine["opt.dist_bucket_kib"] = std::to_string(o.dist_bucket_kib);
    std::string text;
    for (const auto& [k, v] : mine) text += k + "=" + v + "\n";
    comm.broadcast(text, 0);
    dist::together(comm, [&] {
      std::vector<std::string> differ;
      std::istringstream in(text);
      for (std::string line; std::getline(in, line);) {
        const std::string k = line.substr(0, line.find('=')), v = line.substr(line.find('=') + 1);
        if (mine.count(k) && mine.at(k) != v) differ.push_back(k.substr(4) + " " + v + " -> " + mine.at(k));
      }
      if (!differ.empty())
        throw UsageError(op_message("train", "rank " + std::to_string(comm.rank()) + " was started with other options than rank 0 (" +
                                                 join(differ) + "): start every rank with the same command line"));
    });
  }
  const int threads = o.threads > 0 ? o.threads : default_threads(comm.local_size());
  set_num_threads(threads);

  std::vector<TextFile> corpus;  // charlm
  if (o.task == "charlm") {
    dist::together(comm, [&] {
      if (root) corpus = CharLMTask::read_corpus(o.text);
    });
    if (world > 1) {
      std::string count = std::to_string(corpus.size());
      comm.broadcast(count, 0);
      corpus.resize(static_cast<std::size_t>(std::stoull(count)));
      for (TextFile& f : corpus) {
        comm.broadcast(f.name, 0);
        comm.broadcast(f.text, 0);
      }
    }
  }

  std::unique_ptr<Run> run_ptr;
  std::unique_ptr<nn::AdamW> opt_ptr;
  nn::NamedTensors params;
  Generator data(o.seed + 1), dropout(o.seed + 2);
  std::int64_t start = 0;
  dist::together(comm, [&] {
    run_ptr = std::make_unique<Run>(o, corpus);
    if (run_ptr->charlm) run_ptr->corpus = CharLMTask::fingerprint(corpus);
    run_ptr->run_id = run_id;
    run_ptr->run_id_on_disk = !o.resume.empty();  // checked against run_id.txt above
    Run& run = *run_ptr;
    // Everything that will be saved must be savable before any work is done.
    nn::safetensors::check_metadata(model_metadata(run.info), (fs::path(o.out) / kModelFile).string());
    nn::safetensors::check_metadata(options_metadata(o), (fs::path(o.out) / kStateFile).string());
    const std::uint64_t n_expected = parameter_count(run.info.kind, run.info.config);
    if (n_expected > 1000000000)
      throw UsageError(op_message("train", "the model would have " + std::to_string(n_expected) +
                                               " parameters; the limit is 1000000000 (reduce --d-model, --layers, --d-ff)"));
    nn::safetensors::NamedArrays saved_params, saved_optim;
    if (!o.resume.empty() && run.charlm && resume_state.metadata.count("corpus") &&
        resume_state.metadata.at("corpus") != run.corpus)
      throw FormatError("[train] " + state_path + ": the texts of " + o.text +
                        " changed since the run was saved (saved corpus " + resume_state.metadata.at("corpus") +
                        "; now " + run.corpus + "); cannot resume exactly");
    if (!o.resume.empty()) {
      start = parse_int(resume_state.metadata.count("step") ? resume_state.metadata.at("step") : "",
                        "[train] " + state_path + ": metadata 'step'");
      if (start < 1 || start > o.steps)
        throw FormatError("[train] " + state_path + ": step " + std::to_string(start) + " outside [1, " +
                          std::to_string(o.steps) + "]");
      saved_params = with_prefix(resume_state, kParamPrefix);
      saved_optim = with_prefix(resume_state, kOptimPrefix);
      if (saved_params.empty()) {
        saved_optim = resume_state.tensors;
        // A checkpoint of an earlier xgrad: the parameters are in model.safetensors, which must
        // be from the same step (written one after the other, a kill could separate them).
        // Rank 0 reads it; the others receive the parameters by broadcast.
        if (root) {
          const std::string model_path = (fs::path(o.out) / kModelFile).string();
          const nn::safetensors::File model = nn::safetensors::load(model_path);
          const auto it = model.metadata.find("step");
          if (it == model.metadata.end() || it->second != std::to_string(start))
            throw FormatError("[train] " + model_path + " is from step " + (it == model.metadata.end() ? "?" : it->second) +
                              ", " + state_path + " from step " + std::to_string(start) +
                              ": not one checkpoint (interrupted while writing?); cannot resume exactly");
          saved_params = model.tensors;
        }
      }
      if (root) {
        const auto kind = resume_state.metadata.find("optimizer");
        if (kind != resume_state.metadata.end() && kind->second != "adamw")
          throw FormatError("[train] " + state_path + ": optimizer '" + kind->second + "'; xgrad train uses adamw");
        // Every parameter with both its moments, and nothing else (names as stored).
        std::vector<std::string> param_names, moment_names, others;
        if (with_prefix(resume_state, kParamPrefix).empty()) {  // an earlier xgrad's pair (see above)
          for (const auto& named : saved_params) param_names.push_back(named.first);
          for (const auto& named : saved_optim) moment_names.push_back(named.first);
          check_state_tensors(param_names, "", moment_names, "", others, state_path);
        } else {
          for (const auto& named : resume_state.tensors) {
            const std::string& n = named.first;
            (n.rfind(kParamPrefix, 0) == 0 ? param_names : n.rfind(kOptimPrefix, 0) == 0 ? moment_names : others)
                .push_back(n);
          }
          check_state_tensors(param_names, kParamPrefix, moment_names, kOptimPrefix, others, state_path);
        }
        std::uint64_t in_file = 0;
        for (const auto& named : saved_params) in_file += named.second.size();
        if (in_file != n_expected)
          throw FormatError("[train] " + state_path + ": the saved options describe a model of " +
                            std::to_string(n_expected) + " parameters, the checkpoint holds " + std::to_string(in_file));
      }
    }
    run.build_model();
    if (o.resume.empty() && !o.init_from.empty() && root) {
      // --init-from: the checkpoint must describe exactly this model (any metadata key this
      // trainer writes), then its weights replace the initial ones.
      const nn::safetensors::Metadata saved = nn::safetensors::load(o.init_from).metadata;
      std::vector<std::string> differ;
      for (const auto& [k, v] : model_metadata(run.info)) {
        auto it = saved.find(k);
        if (it == saved.end() || it->second != v)
          differ.push_back(k + " " + (it == saved.end() ? "(missing)" : it->second) + " vs " + v);
      }
      if (!differ.empty())
        throw UsageError(op_message("train", "--init-from " + o.init_from + " is not the model of this run (" +
                                                 join(differ) + ")"));
      nn::safetensors::load_module(o.init_from, run.module());
    }
    params = run.module().named_parameters();
    opt_ptr = std::make_unique<nn::AdamW>(params, o.lr, o.weight_decay);
    if (!o.resume.empty()) {
      if (root) {
        // The saved parameters' names against the model's (the moments matched them above).
        const std::string shown = with_prefix(resume_state, kParamPrefix).empty() ? "" : kParamPrefix;
        std::vector<std::string> missing, unexpected;
        std::set<std::string> model_names, saved_names;
        for (const auto& named : params) model_names.insert(named.first);
        for (const auto& named : saved_params) saved_names.insert(named.first);
        for (const std::string& n : model_names)
          if (!saved_names.count(n)) missing.push_back(shown + n);
        for (const std::string& n : saved_names)
          if (!model_names.count(n)) unexpected.push_back(shown + n);
        if (!missing.empty() || !unexpected.empty())
          throw FormatError("[train] " + state_path + ": not a complete checkpoint of this model: " +
                            (missing.empty() ? "" : "missing tensors " + join(missing)) +
                            (missing.empty() || unexpected.empty() ? "" : "; ") +
                            (unexpected.empty() ? "" : "unexpected tensors " + join(unexpected) +
                                                           " (matches no parameter of the model)") +
                            "; cannot resume exactly");
      }
      if (root)
        for (const auto& [name, p] : params) {
          const Array* found = nullptr;
          for (const auto& [n, a] : saved_params)
            if (n == name) found = &a;
          if (!found || found->shape() != p.shape() || found->dtype() != p.dtype())
            throw FormatError("[train] " + state_path + ": parameter '" + name + "' is missing or has another shape");
          const std::size_t bad = found->first_nonfinite();
          if (bad != found->size())
            throw FormatError("[train] " + state_path + ": parameter '" + name + "' element " + std::to_string(bad) +
                              " is not finite");
          Tensor target = p;
          target.set_value(*found);
        }
      for (const auto& [name, a] : saved_optim)
        if (a.first_nonfinite() != a.size())
          throw FormatError("[train] " + state_path + ": optimizer state '" + name + "' is not finite");
      try {
        opt_ptr->load_state(saved_optim, start);
        data.set_state(resume_state.metadata.count("data_rng") ? resume_state.metadata.at("data_rng") : "");
        dropout.set_state(resume_state.metadata.count("dropout_rng") ? resume_state.metadata.at("dropout_rng") : "");
      } catch (const Error& e) {
        throw FormatError("[train] " + state_path + ": optimizer or generator state: " + e.what());
      }
    }
  });
  Run& run = *run_ptr;
  nn::AdamW& opt = *opt_ptr;
  resume_state = {};
  // Every rank starts from rank 0's parameters (the same anyway: same seed, same checkpoint).
  dist::broadcast_parameters(comm, params, 0);
  dist::check_parameters_agree(comm, params, "at the start");

  // Rank 0's files. log.csv: on resume keep exactly the rows up to the checkpoint, then continue.
  // charlm: the lowest validation loss so far and its step (on resume, from the log's rows).
  std::unique_ptr<RunLog> csv;
  double best_val = std::numeric_limits<double>::infinity();
  std::int64_t best_step = 0;
  dist::together(comm, [&] {
    if (!root) return;
    const std::vector<std::string> kept =
        start > 0 ? rows_up_to(fs::path(o.out) / "log.csv", start) : std::vector<std::string>{};
    for (const std::string& row : kept) {
      const std::vector<std::string> f = csv_fields(row);
      if (!f[6].empty() && parse_double(f[6], "log.csv") < best_val) {
        best_val = parse_double(f[6], "log.csv");
        best_step = parse_int(f[0], "log.csv");
      }
    }
    csv = std::make_unique<RunLog>(fs::path(o.out) / "log.csv", kept);
    try {
      fs::create_directories(o.out);
    } catch (const fs::filesystem_error& e) {
      throw UsageError(op_message("train", "--out " + o.out + ": cannot create the folder: " + e.code().message()));
    }

    // Temporary files of a checkpoint that a kill interrupted (never read; the rename is the commit).
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(o.out, ec)) {
      const std::string name = entry.path().filename().string();
      for (const std::string base : {kStateFile, kModelFile, kBestFile, "log.csv", kRunIdFile})
        if (name.rfind(base + ".tmp.", 0) == 0) fs::remove(entry.path(), ec);
    }

    // Resuming: bring model.safetensors to the state's step first. It is written after the state,
    // so kills that keep landing between the two would otherwise leave it several steps behind;
    // this keeps it at the state's step or one behind (docs/reliability.md).
    if (start > 0) {
      nn::safetensors::Metadata meta = model_metadata(run.info);
      meta["step"] = std::to_string(start);
      nn::safetensors::save_module((fs::path(o.out) / kModelFile).string(), run.module(), meta);
    }
  });

  const std::size_t n_params = run.module().parameter_count();
  const dist::Shard shard = dist::shard_of(o.batch, comm.rank(), world);
  out << "xgrad train: task " << o.task << ", " << run.info.kind << " d_model " << o.d_model << ", heads " << o.heads
      << "/" << run.info.config.H_kv << " (q/kv), layers " << o.layers
      << (o.pos == "learned" ? std::string()
                             : ", positions " + o.pos +
                                   (o.pos == "rope" ? " (" + o.rope_layout + ", fraction " + exact(o.rope_fraction) +
                                                          ", base " + exact(o.rope_base) + ")"
                                                    : std::string()))
      << (o.window ? ", window " + std::to_string(o.window) : "") << ", " << n_params << " parameters"
      << (o.dtype == "float32" ? "" : " (" + o.dtype + ")") << "; " << o.steps << " steps of batch " << o.batch
      << ", lr " << o.lr << ", seed " << o.seed << "; out " << o.out
      << (start > 0 ? "; resumed at step " + std::to_string(start) : "") << "\n";
  if (run.charlm) {
    // The texts, by name: the full list with sizes and checksums is in the state's metadata.
    std::string names;
    std::size_t texts = 0;
    for (std::size_t i = 0; i < run.corpus.size();) {
      const std::size_t end = std::min(run.corpus.find(';', i), run.corpus.size());
      names += (texts++ ? ", " : "") + run.corpus.substr(i, run.corpus.find(':', i) - i);
      i = end + 1;
    }
    out << "corpus: " << o.text << ": " << texts << (texts == 1 ? " text" : " texts") << " (" << names << "), "
        << run.charlm->train_size() + run.charlm->validation_size() << " bytes; training "
        << run.charlm->train_size() << ", validation " << run.charlm->validation_size()
        << " characters (the last 10% of each text)\n";
  }
  if (start == 0 && !o.init_from.empty()) {
    const double m = run.evaluate(comm, nullptr);
    out << "initialised from " << o.init_from << ": " << (run.charlm ? "val_loss " : "heldout_exact_match ") << m
        << " before training\n";
  }
  dist::GradientReducer::Options ro;
  ro.bucket_bytes = o.dist_bucket_kib * 1024;
  ro.overlap = o.dist_overlap;
  dist::GradientReducer reducer(comm, params, ro);
  if (world > 1)
    out << "data parallel: " << comm.description() << "; " << shard.rows() << " sequences per rank per step, "
        << threads << (threads == 1 ? " thread" : " threads") << " per rank; gradients "
        << reducer.bytes() / 1024 << " KiB in " << reducer.buckets() << (reducer.buckets() == 1 ? " bucket" : " buckets")
        << (o.dist_overlap ? ", overlapped with backward" : "") << "\n";

  // The progress line is redrawn in place (\r) only on a terminal, and only rank 0 draws it.
  const bool tty = root && ((&progress_root == &std::cerr || &progress_root == &std::clog)
                                ? ::isatty(STDERR_FILENO) != 0
                                : (&progress_root == &std::cout && ::isatty(STDOUT_FILENO) != 0));
  const std::int64_t every = std::max<std::int64_t>(1, o.steps / 20);
  TrainResult result;
  result.ranks = world;
  const auto t0 = Clock::now();
  run.module().train();
  double recent = 0;
  double final_val = 0;  // charlm: the validation loss at the last step
  bool have_final_val = false;
  for (std::int64_t s = start + 1; s <= o.steps; ++s) {
    Tape tape;
    opt.lr = nn::warmup_cosine(s - 1, o.warmup, o.steps, o.lr, o.lr * o.min_lr_ratio);
    double weight = 1.0;
    Tensor loss = run.loss(data, dropout, shard, &weight);
    double l = 0;
    int agreed_signal = 0;
    if (world == 1) {
      loss.backward();
      l = loss.item();
    } else {
      // d(weight * loss): the ranks' gradients sum to the gradient of the global batch's mean.
      BackwardOptions bo;
      bo.on_leaf_grad = reducer.hook();
      xg::backward(loss, Array::full(loss.shape(), weight, loss.dtype()), bo);
      reducer.reduce();
      l = comm.all_reduce(loss.item() * weight, dist::ReduceOp::sum);
      // A signal on any rank stops every rank after this step.
      const int mine = o.stop_signal ? static_cast<int>(*o.stop_signal) : 0;
      agreed_signal = static_cast<int>(comm.all_reduce(static_cast<double>(mine), dist::ReduceOp::max));
    }
    if (!std::isfinite(l))
      dist::fail_together(comm, ValueError(op_message("train", "loss is not finite at step " + std::to_string(s))));
    const double gn = nn::clip_grad_norm(params, o.clip);  // the same summed gradients on every rank
    opt.step();
    opt.zero_grad();
    result.losses.push_back(l);
    recent = s == start + 1 ? l : 0.9 * recent + 0.1 * l;
    const double elapsed = seconds_since(t0);
    const double tps = static_cast<double>(run.tokens_per_batch() * (s - start)) / std::max(elapsed, 1e-9);
    // charlm: the validation loss every --eval-every steps and at the last step, logged in the row.
    const bool val_now = run.charlm && ((o.eval_every > 0 && s % o.eval_every == 0) || s == o.steps);
    const double val = val_now ? run.val_loss(comm) : 0.0;
    if (val_now && s == o.steps) {
      final_val = val;
      have_final_val = true;
    }
    if (csv) {
      std::ostringstream row;
      row << s << "," << exact(opt.lr) << "," << exact(l) << "," << exact(gn) << "," << tps << "," << elapsed << ","
          << (val_now ? exact(val) : "");
      csv->row(row.str());
    }
    const bool new_best = val_now && val < best_val;
    if (new_best) {
      best_val = val;
      best_step = s;
      if (root) {
        nn::safetensors::Metadata meta = model_metadata(run.info);
        meta["step"] = std::to_string(s);
        meta["val_loss"] = exact(val);
        nn::safetensors::save_module((fs::path(o.out) / kBestFile).string(), run.module(), meta);
      }
    }
    if (o.progress && (tty || s % every == 0 || s == o.steps)) {
      const double eta = elapsed / static_cast<double>(s - start) * static_cast<double>(o.steps - s);
      std::ostringstream line;  // own stream: no formatting state leaks into `out`
      line << (tty ? "\r" : "") << "step " << s << "/" << o.steps << " | loss " << std::fixed << std::setprecision(4)
           << recent << " | " << static_cast<long>(tps) << " tok/s | elapsed " << clock_text(elapsed) << " | ETA "
           << clock_text(eta) << (tty ? "   " : "\n");
      progress << line.str() << std::flush;
    }
    if (o.eval_every > 0 && s % o.eval_every == 0 && s != o.steps) {
      const double m = run.charlm ? val : run.evaluate(comm, nullptr);
      if (tty && o.progress) progress << "\n" << std::flush;
      out << "  eval at step " << s << ": " << (run.charlm ? "val_loss " : "heldout_exact_match ")
          << m << (new_best ? " (best so far)" : "") << "\n";
    }
    if (world > 1 && o.dist_check_every > 0 && s % o.dist_check_every == 0)
      dist::check_parameters_agree(comm, params, "after step " + std::to_string(s));
    const int sig = world > 1 ? agreed_signal : o.stop_signal ? static_cast<int>(*o.stop_signal) : 0;
    if (csv && ((o.checkpoint_every > 0 && s % o.checkpoint_every == 0) || s == o.steps || s == o.stop_at || sig != 0))
      save_checkpoint(run, opt, s, data, dropout, *csv);
    result.steps_done = s;
    if (sig != 0) {
      result.signal = sig;
      break;
    }
    if (s == o.stop_at) break;
  }
  if (tty && o.progress) progress << "\n" << std::flush;
  result.seconds = seconds_since(t0);
  result.allreduce_seconds = reducer.total_seconds();
  dist::check_parameters_agree(comm, params, "at the end");
  if (result.signal == 0 && o.stop_signal && *o.stop_signal && world == 1) result.signal = static_cast<int>(*o.stop_signal);
  if (result.signal != 0) {
    out << "interrupted by signal " << result.signal << " after step " << result.steps_done << "; checkpoint and log in "
        << o.out << "; continue with: xgrad train --resume " << o.out << "\n" << std::flush;
    return result;
  }
  if (result.steps_done < o.steps && o.stop_at > 0) {
    out << "stopped at step " << result.steps_done << " (checkpoint in " << o.out << ")\n";
    return result;
  }

  std::ostringstream samples;
  double train_loss = 0;  // charlm: the mean training loss of the last 5% of this session's steps
  if (run.charlm) {
    result.metric = have_final_val ? final_val : run.val_loss(comm);
    if (root) run.sample(samples);
    const std::size_t n = std::max<std::size_t>(1, result.losses.size() / 20);
    for (std::size_t i = result.losses.size() - std::min(n, result.losses.size()); i < result.losses.size(); ++i)
      train_loss += result.losses[i] / static_cast<double>(std::min(n, result.losses.size()));
    if (best_step == 0 || result.metric < best_val) {  // a resumed run that had nothing left to do
      best_val = result.metric;
      best_step = result.steps_done;
    }
  } else {
    result.metric = run.evaluate(comm, root ? &samples : nullptr);
  }
  result.metric_name = run.charlm ? "val_loss" : "heldout_exact_match";
  out << "samples:\n" << samples.str();
  if (run.charlm) {
    out << "validation loss " << result.metric << ", perplexity " << std::exp(result.metric);
    if (!result.losses.empty()) out << "; training loss " << train_loss << " (mean of the last steps, dropout on)";
    out << "\nbest validation loss " << best_val << " at step " << best_step << ": "
        << (fs::path(o.out) / kBestFile).string() << "\n";
  }
  // Rank 0 alone has the log (csv) and writes files.
  std::string written = root ? (fs::path(o.out) / kModelFile).string() + ", " + csv->path().string() : "";
  if (o.plot && root) {
    // The loss curve is a picture of a finished run: it never turns the run into a failure.
    const std::string png = (fs::path(o.out) / "loss.png").string();
    try {
      const Picture p = loss_curve_png(csv->path().string(), png, "xgrad train: " + o.task, run.charlm != nullptr);
      if (p.drawn)
        written += ", " + png;
      else
        progress << "xgrad: warning: " << p.note << "\n" << std::flush;
    } catch (const Error& e) {
      progress << "xgrad: warning: no loss curve: " << e.what() << "\n" << std::flush;
    }
  }
  out << "wrote " << written << "\n";
  std::ostringstream timing;
  timing << "trained " << result.steps_done - start << " steps in " << std::fixed << std::setprecision(1)
         << result.seconds << " s";
  if (world > 1) timing << " on " << world << " ranks (gradient all-reduce " << std::setprecision(2) << result.allreduce_seconds << " s)";
  out << timing.str() << "\n";
  if (run.charlm) {
    if (!result.losses.empty()) out << "RESULT train_loss " << train_loss << "\n";
    out << "RESULT best_val_loss " << best_val << " step " << best_step << "\n";
  }
  out << "RESULT " << result.metric_name << " " << result.metric << "\n";
  return result;
}

}  // namespace xg::train
