// train_module: any nn::Module through the run folder (train/custom_run.hpp). The pieces are
// the trainer's: the folder's files and log (runs/run_folder.hpp), AdamW, clipping and the
// schedule (nn/optim.hpp), atomic files (io/atomic_file.hpp), the report page (runs/report.hpp).
// The step loop is its own: xgrad train's loop is built around its tasks, ranks and option
// table; a module run has one process, one loss function and these options.
#include <xgrad/train/custom_run.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <limits>
#include <ostream>
#include <set>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/detail/json.hpp>
#include <xgrad/io/number.hpp>
#include <xgrad/nn/optim.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/runs/compare.hpp>
#include <xgrad/runs/report.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/train/detail/step.hpp>

namespace xg::train {

namespace fs = std::filesystem;

namespace {

const char* const kOp = "train_module";
const char* const kCheckpointKind = "xgrad-module-1";
const std::string kParamPrefix = "model.", kOptimPrefix = "optim.";

// The run-defining options as text (numbers exact), in a fixed order: config.json's members and
// the state's opt.* metadata, compared on resume.
std::vector<std::pair<std::string, std::string>> run_options(const RunOptions& o) {
  std::vector<std::pair<std::string, std::string>> v = {
      {"task", o.name},
      {"steps", std::to_string(o.steps)},
      {"lr", io::exact_text(o.lr)},
      {"min_lr_ratio", io::exact_text(o.min_lr_ratio)},
      {"warmup", std::to_string(o.warmup)},
      {"weight_decay", io::exact_text(o.weight_decay)},
      {"clip", io::exact_text(o.clip)},
      {"seed", std::to_string(o.seed)},
      {"eval_every", std::to_string(o.eval_every)},
      {"checkpoint_every", std::to_string(o.checkpoint_every)},
      {"tokens_per_step", std::to_string(o.tokens_per_step)}};
  const std::size_t fixed = v.size();
  for (const auto& [k, val] : o.config) {
    for (std::size_t i = 0; i < fixed; ++i)
      if (v[i].first == k)
        throw UsageError(op_message(kOp, "config entry '" + k + "' is one of the run's own options; name it otherwise"));
    v.emplace_back(k, val);
  }
  return v;
}

void validate(const RunOptions& o) {
  const auto bad = [](const std::string& m) { throw UsageError(op_message(kOp, m)); };
  if (o.out.empty()) bad("out: the run folder must be named");
  if (o.steps < 1 || o.steps > 1000000000) bad("steps " + std::to_string(o.steps) + " is not in [1, 1000000000]");
  if (!(o.lr > 0.0) || !std::isfinite(o.lr)) bad("lr must be positive and finite, got " + io::shortest_text(o.lr));
  if (!(o.min_lr_ratio >= 0.0 && o.min_lr_ratio <= 1.0)) bad("min_lr_ratio must be in [0, 1]");
  if (o.warmup < 0 || o.warmup > o.steps) bad("warmup " + std::to_string(o.warmup) + " is not in [0, steps]");
  if (!(o.weight_decay >= 0.0) || !std::isfinite(o.weight_decay)) bad("weight_decay must be >= 0 and finite");
  if (!(o.clip >= 0.0) || !std::isfinite(o.clip)) bad("clip must be >= 0 and finite");
  if (o.eval_every < 0) bad("eval_every must be >= 0");
  if (o.checkpoint_every < 0) bad("checkpoint_every must be >= 0");
  if (o.stop_at < 0 || o.stop_at > o.steps) bad("stop_at " + std::to_string(o.stop_at) + " is not in [0, steps]");
  for (const auto& [k, v] : o.config)
    if (k.empty() || !json::valid_utf8(k) || !json::valid_utf8(v))
      bad("config entries need a non-empty name and UTF-8 text");
  run_options(o);  // a config entry named as an option: refused before anything is written
}

std::string config_json(const RunOptions& o) {
  static const std::set<std::string> text_keys = {"task"};
  std::string text = "{\n";
  const auto v = run_options(o);
  const std::size_t fixed = v.size() - o.config.size();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const bool number = i < fixed && !text_keys.count(v[i].first);
    text += "  " + json::quote(v[i].first) + ": " + (number ? v[i].second : json::quote(v[i].second)) +
            (i + 1 < v.size() ? ",\n" : "\n");
  }
  return text + "}\n";
}

// Files of a run in the folder (another run's, unless resuming).
std::vector<std::string> run_files_in(const fs::path& out) {
  std::vector<std::string> present;
  std::error_code ec;
  for (const char* f : {runs::kStateFile, runs::kModelFile, runs::kBestFile, runs::kLogFile, runs::kRunIdFile,
                        runs::kConfigFile, runs::kResultFile})
    if (fs::exists(out / f, ec)) present.push_back(f);
  return present;
}

struct Run {
  nn::Module& model;
  const RunOptions& o;
  fs::path out;
  std::string run_id;
  Generator data, dropout;
  nn::NamedTensors params;  // trainable
  std::unique_ptr<nn::AdamW> opt;
  std::unique_ptr<runs::RunLog> log;
  std::int64_t start = 0;
  double best = std::numeric_limits<double>::infinity();
  std::int64_t best_step = 0;
  bool named = false;  // run_id.txt and config.json written (at the first checkpoint, as xgrad train)
};

void save_model_file(Run& r, const fs::path& path, std::int64_t step, const io::safetensors::Metadata& extra = {}) {
  io::safetensors::Metadata meta = r.o.model_metadata;
  meta["step"] = std::to_string(step);
  for (const auto& [k, v] : extra) meta[k] = v;
  nn::safetensors::save_module(path.string(), r.model, meta);
}

// The log first (it then holds every step the state holds), the state (the commit point), the model.
void checkpoint(Run& r, std::int64_t step) {
  if (!r.named) {  // a run that fails before its first checkpoint leaves no file of its own
    runs::write_run_id(r.out, r.run_id);
    io::write_atomically((r.out / runs::kConfigFile).string(), config_json(r.o),
                         "[" + std::string(kOp) + "] " + (r.out / runs::kConfigFile).string() + ": ");
    r.named = true;
  }
  r.log->commit();
  io::safetensors::Metadata state;
  for (const auto& [k, v] : run_options(r.o)) state["opt." + k] = v;
  state["checkpoint"] = kCheckpointKind;
  state["run_id"] = r.run_id;
  state["step"] = std::to_string(step);
  state["log_sha256"] = r.log->digest();
  state["optimizer"] = r.opt->kind();
  state["data_rng"] = r.data.state();
  state["dropout_rng"] = r.dropout.state();
  io::safetensors::NamedArrays tensors;
  for (const auto& [name, p] : r.model.named_parameters()) tensors.emplace_back(kParamPrefix + name, p.value());
  for (auto& [name, a] : r.opt->state()) tensors.emplace_back(kOptimPrefix + name, std::move(a));
  io::safetensors::save((r.out / runs::kStateFile).string(), tensors, state);
  save_model_file(r, r.out / runs::kModelFile, step);
}

// --resume: the folder's run, its options, parameters, moments, generators and log.
void restore(Run& r) {
  const std::string path = (r.out / runs::kStateFile).string();
  const io::safetensors::File st = io::safetensors::load(path);
  const auto meta = [&](const std::string& k) -> std::string {
    const auto it = st.metadata.find(k);
    if (it == st.metadata.end()) throw FormatError("[" + std::string(kOp) + "] " + path + ": metadata '" + k + "' is missing");
    return it->second;
  };
  if (meta("checkpoint") != kCheckpointKind)
    throw FormatError("[" + std::string(kOp) + "] " + path + ": checkpoint '" + shown_value(meta("checkpoint")) +
                      "' is not a train_module run's (" + kCheckpointKind + "); an xgrad train run resumes with "
                      "xgrad train --resume");
  r.run_id = meta("run_id");
  runs::check_run_id(r.run_id, r.out, path);
  r.named = true;
  std::vector<std::string> differ;
  for (const auto& [k, v] : run_options(r.o)) {
    const auto it = st.metadata.find("opt." + k);
    const std::string was = it == st.metadata.end() ? "(none)" : it->second;
    if (was != v) differ.push_back(k + " " + shown_value(was, 40) + " -> " + shown_value(v, 40));
  }
  if (!differ.empty()) {
    std::string s;
    for (const auto& d : differ) s += (s.empty() ? "" : ", ") + d;
    throw UsageError(op_message(kOp, "resume " + r.out.string() + ": the run was saved with other options (" + s +
                                         "); give the saved ones"));
  }
  r.start = io::parse_int(meta("step"), "[" + std::string(kOp) + "] " + path + ": metadata 'step'");
  if (r.start < 1 || r.start > r.o.steps)
    throw FormatError("[" + std::string(kOp) + "] " + path + ": step " + std::to_string(r.start) + " is not in [1, " +
                      std::to_string(r.o.steps) + "]");
  // Parameters: exactly the model's (set_weights is strict and changes nothing when it throws).
  io::safetensors::NamedArrays params, moments;
  for (const auto& [name, a] : st.tensors) {
    if (name.compare(0, kParamPrefix.size(), kParamPrefix) == 0)
      params.emplace_back(name.substr(kParamPrefix.size()), a);
    else if (name.compare(0, kOptimPrefix.size(), kOptimPrefix) == 0)
      moments.emplace_back(name.substr(kOptimPrefix.size()), a);
    else
      throw FormatError("[" + std::string(kOp) + "] " + path + ": unexpected tensor '" + shown_value(name) + "'");
  }
  try {
    r.model.set_weights(params);
    r.opt->load_state(moments, r.start);
    r.data.set_state(meta("data_rng"));
    r.dropout.set_state(meta("dropout_rng"));
  } catch (const FormatError&) {
    throw;
  } catch (const Error& e) {
    throw FormatError("[" + std::string(kOp) + "] " + path + ": not this model's checkpoint: " + e.what());
  }
  const std::vector<std::string> kept = runs::rows_up_to(r.out / runs::kLogFile, r.start);
  for (const std::string& row : kept) {
    const std::vector<std::string> f = runs::csv_fields(row);
    if (f.size() > 6 && !f[6].empty() && io::parse_double(f[6], "log.csv") < r.best) {
      r.best = io::parse_double(f[6], "log.csv");
      r.best_step = io::parse_int(f[0], "log.csv");
    }
  }
  r.log = std::make_unique<runs::RunLog>(r.out / runs::kLogFile, kept);
  if (r.log->digest() != meta("log_sha256"))
    throw FormatError("[" + std::string(kOp) + "] " + (r.out / runs::kLogFile).string() + ": rows 1.." +
                      std::to_string(r.start) + " are not the ones the checkpoint saved (sha256 differs)");
}

}  // namespace

ModuleRunResult train_module(nn::Module& model, const LossFn& loss, const RunOptions& o, const ValidationFn& validate_fn) {
  validate(o);
  if (!loss) throw UsageError(op_message(kOp, "the loss function is empty"));
  Run r{model, o, fs::path(o.out), "", Generator(o.seed + 1), Generator(o.seed + 2), {}, nullptr, nullptr, 0,
        std::numeric_limits<double>::infinity(), 0};
  r.params = model.named_trainable_parameters();
  if (r.params.empty()) throw ValueError(op_message(kOp, "the model has no trainable parameters"));
  r.opt = std::make_unique<nn::AdamW>(r.params, o.lr, o.weight_decay);
  std::error_code ec;
  if (fs::exists(r.out, ec) && !fs::is_directory(r.out, ec))
    throw UsageError(op_message(kOp, "out " + o.out + " exists and is not a folder"));
  if (o.resume) {
    if (!fs::exists(r.out / runs::kStateFile, ec))
      throw UsageError(op_message(kOp, "resume: " + o.out + " holds no " + runs::kStateFile));
    restore(r);
  } else {
    const std::vector<std::string> present = run_files_in(r.out);
    if (!present.empty() && !o.overwrite) {
      std::string s;
      for (const auto& f : present) s += (s.empty() ? "" : ", ") + f;
      throw UsageError(op_message(kOp, "out " + o.out + " holds files of another run (" + s +
                                           "); resume it, choose another folder, or set overwrite"));
    }
    runs::prepare_out_folder(o.out);
    for (const char* f : {runs::kBestFile, runs::kResultFile}) fs::remove(r.out / f, ec);  // the old run's
    r.run_id = runs::new_run_id();
    r.log = std::make_unique<runs::RunLog>(r.out / runs::kLogFile, std::vector<std::string>{});
  }
  fs::remove(r.out / runs::kResultFile, ec);  // unfinished again until the end

  ModuleRunResult result;
  result.out = o.out;
  result.steps_done = r.start;
  const auto t0 = std::chrono::steady_clock::now();
  const std::int64_t every = std::max<std::int64_t>(1, o.steps / 20);
  std::optional<double> last_val;
  for (std::int64_t step = r.start + 1; step <= o.steps; ++step) {
    double l = 0, gn = 0;
    {
      Tape tape;
      r.opt->lr = detail::Schedule{o.lr, o.min_lr_ratio, o.warmup, o.steps}.at(step);
      model.train();
      StepInput in{step, r.data, r.dropout};
      Tensor t = loss(model, in);
      if (!t.defined() || t.value().size() != 1)
        throw ValueError(op_message(kOp, "step " + std::to_string(step) + ": the loss must be a scalar, got shape " +
                                             (t.defined() ? shape_str(t.shape()) : std::string("(undefined)"))));
      l = t.item();
      if (!std::isfinite(l)) throw ValueError(op_message(kOp, "the loss is not finite at step " + std::to_string(step)));
      t.backward();
      gn = detail::finish_step(*r.opt, r.params, o.clip);
    }
    result.losses.push_back(l);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = static_cast<double>(o.tokens_per_step) * static_cast<double>(step - r.start) /
                       std::max(elapsed, 1e-9);
    const bool val_now = validate_fn && detail::every_and_last(step, o.eval_every, o.steps);
    double val = 0;
    if (val_now) {
      model.eval();
      {
        NoGradGuard no_grad;
        val = validate_fn(model);
      }
      model.train();
      if (!std::isfinite(val))
        throw ValueError(op_message(kOp, "the validation loss is not finite at step " + std::to_string(step)));
      last_val = val;
      if (val < r.best) {
        r.best = val;
        r.best_step = step;
        save_model_file(r, r.out / runs::kBestFile, step, {{"val_loss", io::exact_text(val)}});
      }
    }
    r.log->row(detail::log_row(step, r.opt->lr, l, gn, tps, elapsed, val_now ? &val : nullptr));
    if (o.progress && (step % every == 0 || step == o.steps || val_now))
      *o.progress << "step " << step << "/" << o.steps << " | loss " << std::setprecision(5) << l
                  << (val_now ? " | val_loss " + io::shortest_text(val) : std::string()) << "\n"
                  << std::flush;
    if (detail::every_and_last(step, o.checkpoint_every, o.steps) || step == o.stop_at)
      checkpoint(r, step);
    result.steps_done = step;
    if (step == o.stop_at) break;
  }
  result.val_loss = last_val;
  if (result.steps_done == o.steps) {  // finished: the RESULT lines for compare and report
    std::ostringstream res;
    if (!result.losses.empty()) {
      const std::size_t n = std::max<std::size_t>(1, result.losses.size() / 20);
      double mean = 0;
      for (std::size_t i = result.losses.size() - n; i < result.losses.size(); ++i)
        mean += result.losses[i] / static_cast<double>(n);
      res << "RESULT train_loss " << io::shortest_text(mean) << "\n";
    }
    if (r.best_step > 0) res << "RESULT best_val_loss " << io::shortest_text(r.best) << " step " << r.best_step << "\n";
    const std::string path = (r.out / runs::kResultFile).string();
    io::write_atomically(path, "samples:\n" + res.str(), "[" + std::string(kOp) + "] " + path + ": ");
  }
  return result;
}

std::string write_report(const std::vector<std::string>& run_dirs, const std::string& html, const std::string& title) {
  runs::ReportInput in;
  in.title = title;
  in.library = runs::load_dygraphs();
  in.runs = runs::read_runs(run_dirs);
  for (const runs::RunSummary& r : in.runs) in.outputs.push_back(runs::read_run_output(r));
  io::write_atomically(html, runs::report_html(in), "[report] " + html + ": ");
  return html;
}

}  // namespace xg::train
