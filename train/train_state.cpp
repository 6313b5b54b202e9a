#include <xgrad/train/detail/train_state.hpp>
#include <xgrad/io/number.hpp>

#include <algorithm>
#include <filesystem>
#include <set>

#include <xgrad/io/atomic_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/adapters.hpp>
#include <xgrad/train/checkpoint.hpp>

namespace xg::train::detail {

namespace fs = std::filesystem;

namespace {

const std::string kParamPrefix = "model.", kOptimPrefix = "optim.";
// The moments AdamW keeps for every parameter (nn::Adam::update); a checkpoint holds both for each.
const std::vector<std::string> kAdamBuffers = {"exp_avg", "exp_avg_sq"};

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
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

// Names and values of a state file's tensors under `prefix`, the prefix removed.
io::safetensors::NamedArrays with_prefix(const io::safetensors::File& f, const std::string& prefix) {
  io::safetensors::NamedArrays out;
  for (const auto& [name, a] : f.tensors)
    if (name.compare(0, prefix.size(), prefix) == 0) out.emplace_back(name.substr(prefix.size()), a);
  return out;
}

// A state of this xgrad: every parameter with both its moments, and nothing else.
void check_state_names(const io::safetensors::File& state, const std::string& state_path) {
  std::vector<std::string> param_names, moment_names, others;
  for (const auto& named : state.tensors) {
    const std::string& n = named.first;
    (n.rfind(kParamPrefix, 0) == 0 ? param_names : n.rfind(kOptimPrefix, 0) == 0 ? moment_names : others).push_back(n);
  }
  check_state_tensors(param_names, kParamPrefix, moment_names, kOptimPrefix, others, state_path);
}

FormatError model_size_mismatch(const std::string& state_path, std::uint64_t described, std::uint64_t held,
                                const std::string& where) {
  return FormatError("[train] " + state_path + ": the saved options describe a model of " + std::to_string(described) +
                     " parameters, the checkpoint holds " + std::to_string(held) + where);
}

}  // namespace

void save_model(Task& task, const std::string& path, std::int64_t step, const io::safetensors::Metadata& extra) {
  io::safetensors::Metadata meta = model_metadata(task.info());
  meta["step"] = std::to_string(step);
  for (const auto& [k, v] : adapter_metadata(task.module())) meta[k] = v;  // LoRA, frozen weights
  for (const auto& [k, v] : extra) meta[k] = v;
  nn::safetensors::save_module(path, task.module(), meta);
}

void save_checkpoint(Task& task, const TrainOptions& o, int threads, RunIdentity& run, const nn::Optimizer& opt,
                     std::int64_t step, const Generator& data, const Generator& dropout, runs::RunLog& log) {
  // A new run's first checkpoint names the run in the folder before any of its files lands.
  if (!run.id.empty() && !run.on_disk) {
    runs::write_run_id(o.out, run.id);
    run.on_disk = true;
  }
  if (!run.config_on_disk) {  // runs saved before config.json existed get theirs at their next checkpoint
    const std::string path = (fs::path(o.out) / runs::kConfigFile).string();
    io::write_atomically(path, options_json(o, threads), "[train] " + path + ": ");
    run.config_on_disk = true;
  }
  log.commit();
  std::map<std::string, std::string> opts = options_metadata(o);
  io::safetensors::Metadata state(opts.begin(), opts.end());
  state["checkpoint"] = "xgrad-train-2";
  if (!run.id.empty()) state["run_id"] = run.id;
  state["step"] = std::to_string(step);
  state["log_sha256"] = log.digest();  // log.csv as just committed: rows 1..step
  state["optimizer"] = opt.kind();
  state["data_rng"] = data.state();
  state["dropout_rng"] = dropout.state();
  if (threads != 1) state["threads"] = std::to_string(threads);
  for (const auto& [k, v] : task.state_metadata()) state[k] = v;
  io::safetensors::NamedArrays tensors;
  // Only what trains: frozen parameters are in model.safetensors (load_frozen_parameters).
  for (const auto& [name, p] : task.module().named_trainable_parameters())
    tensors.emplace_back(kParamPrefix + name, p.value());
  for (auto& [name, a] : opt.state()) tensors.emplace_back(kOptimPrefix + name, std::move(a));
  io::safetensors::save((fs::path(o.out) / runs::kStateFile).string(), tensors, state);
  save_model(task, (fs::path(o.out) / runs::kModelFile).string(), step);
}

int saved_threads(const io::safetensors::Metadata& state, const std::string& state_path) {
  const auto it = state.find("threads");
  if (it == state.end()) return 1;
  const std::int64_t n = io::parse_int(it->second, "[train] " + state_path + ": metadata 'threads'");
  if (n < 1 || n > 1024)
    throw FormatError("[train] " + state_path + ": metadata 'threads' is " + it->second +
                      ", not a thread count in [1, 1024]");
  return static_cast<int>(n);
}

ResumePoint read_resume_point(const io::safetensors::File& state, const TrainOptions& o, const std::string& state_path,
                              bool root, std::uint64_t n_expected) {
  ResumePoint p;
  p.step = io::parse_int(state.metadata.count("step") ? state.metadata.at("step") : "",
                     "[train] " + state_path + ": metadata 'step'");
  if (p.step < 1 || p.step > o.steps)
    throw FormatError("[train] " + state_path + ": step " + std::to_string(p.step) + " outside [1, " +
                      std::to_string(o.steps) + "]");
  p.params = with_prefix(state, kParamPrefix);
  p.moments = with_prefix(state, kOptimPrefix);
  if (p.params.empty()) {
    p.legacy_pair = true;
    p.moments = state.tensors;
    // A checkpoint of an earlier xgrad: the parameters are in model.safetensors, which must
    // be from the same step (written one after the other, a kill could separate them).
    // Rank 0 reads it; the others receive the parameters by broadcast.
    if (root) {
      const std::string model_path = (fs::path(o.out) / runs::kModelFile).string();
      const io::safetensors::File model = io::safetensors::load(model_path);
      const auto it = model.metadata.find("step");
      if (it == model.metadata.end() || it->second != std::to_string(p.step))
        throw FormatError("[train] " + model_path + " is from step " + (it == model.metadata.end() ? "?" : it->second) +
                          ", " + state_path + " from step " + std::to_string(p.step) +
                          ": not one checkpoint (interrupted while writing?); cannot resume exactly");
      p.params = model.tensors;
    }
  }
  if (!root) return p;
  const auto kind = state.metadata.find("optimizer");
  if (kind != state.metadata.end() && kind->second != "adamw")
    throw FormatError("[train] " + state_path + ": optimizer '" + kind->second + "'; xgrad train uses adamw");
  // Every parameter with both its moments, and nothing else (names as stored).
  if (p.legacy_pair) {
    std::vector<std::string> param_names, moment_names, others;
    for (const auto& named : p.params) param_names.push_back(named.first);
    for (const auto& named : p.moments) moment_names.push_back(named.first);
    check_state_tensors(param_names, "", moment_names, "", others, state_path);
  } else {
    check_state_names(state, state_path);
  }
  std::uint64_t in_file = 0;
  for (const auto& named : p.params) in_file += named.second.size();
  if (in_file != n_expected) throw model_size_mismatch(state_path, n_expected, in_file, "");
  return p;
}

void check_saved_model_size(const io::safetensors::File& state, const TrainOptions& o, const std::string& state_path,
                            std::uint64_t n_expected) {
  std::uint64_t in_state = 0;
  for (const auto& [name, a] : state.tensors)
    if (name.rfind(kParamPrefix, 0) == 0) in_state += a.size();
  if (in_state > 0 && o.lora_rank == 0 && o.freeze.empty()) {
    // Every parameter trains, so the state holds them all: the checks read_resume_point makes
    // (the names first: a missing tensor is named rather than counted).
    check_state_names(state, state_path);
    if (in_state != n_expected) throw model_size_mismatch(state_path, n_expected, in_state, "");
    return;
  }
  // An earlier xgrad's checkpoint, adapters or frozen weights: model.safetensors holds every
  // parameter (adapters too), so it holds at least the model the options describe.
  const std::string model_path = (fs::path(o.out) / runs::kModelFile).string();
  std::uint64_t held = 0;
  for (const io::safetensors::TensorInfo& t : io::safetensors::load_header(model_path).tensors) held += numel(t.shape);
  if (n_expected > held) throw model_size_mismatch(state_path, n_expected, held, " (in " + model_path + ")");
}

void restore(const ResumePoint& point, const io::safetensors::File& state, const std::string& state_path, bool root,
             nn::NamedTensors& params, nn::Optimizer& opt, Generator& data, Generator& dropout) {
  if (root) {
    // The saved parameters' names against the model's (the moments matched them above).
    const std::string shown = point.legacy_pair ? "" : kParamPrefix;
    std::vector<std::string> missing, unexpected;
    std::set<std::string> model_names, saved_names;
    for (const auto& named : params) model_names.insert(named.first);
    for (const auto& named : point.params) saved_names.insert(named.first);
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
    for (const auto& [name, p] : params) {
      const Array* found = nullptr;
      for (const auto& [n, a] : point.params)
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
  }
  for (const auto& [name, a] : point.moments)
    if (a.first_nonfinite() != a.size())
      throw FormatError("[train] " + state_path + ": optimizer state '" + name + "' is not finite");
  try {
    opt.load_state(point.moments, point.step);
    data.set_state(state.metadata.count("data_rng") ? state.metadata.at("data_rng") : "");
    dropout.set_state(state.metadata.count("dropout_rng") ? state.metadata.at("dropout_rng") : "");
  } catch (const Error& e) {
    throw FormatError("[train] " + state_path + ": optimizer or generator state: " + e.what());
  }
}

}  // namespace xg::train::detail
