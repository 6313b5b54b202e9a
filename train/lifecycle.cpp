#include <xgrad/train/lifecycle.hpp>

#include <xgrad/core/error.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/train/adapters.hpp>

namespace xg::train {

namespace {

[[noreturn]] void refuse(const std::string& message) { throw UsageError(op_message("train", message)); }

// --config FILE: its options onto `o` where no flag was given; their names join `given`.
void merge_config(TrainOptions& o, const std::string& config, std::set<std::string>& given, std::ostream& warnings) {
  TrainOptions from_file = o;
  for (const std::string& name : apply_config_json(from_file, read_config_file(config), config)) {
    if (name == "threads" && given.count(name) && from_file.threads != o.threads)
      warnings << "xgrad: warning: --threads " << o.threads << ": " << config << " records " << from_file.threads
               << (from_file.threads == 1 ? " thread" : " threads")
               << "; the run repeats, but not bit for bit (sums split among threads round otherwise)\n";
    if (given.count(name)) continue;  // the flag wins
    const OptionSpec& spec = *find_option(name);
    set_option_text(o, spec, option_text(from_file, spec), "--config");
    given.insert(name);
  }
}

// A resumed run is the saved run: its options come from the checkpoint, only session options
// may be given.
void check_resume(const TrainOptions& o, const std::set<std::string>& given) {
  std::string allowed;
  for (const std::string& flag : session_flags()) allowed += (allowed.empty() ? "" : ", ") + flag;
  for (const std::string& flag : run_defining_flags())
    for (const OptionSpec& s : option_schema())
      if (s.flag == flag && given.count(s.name))
        refuse(flag + " cannot be combined with --resume: a resumed run keeps the options saved in " + o.resume +
               " (it may take " + allowed + ")");
}

// A new run: its options from --init-from, the task's alias and defaults, then every rule.
void resolve_new_run(TrainOptions& o, const std::set<std::string>& given) {
  if (!o.init_from.empty()) apply_init_from(o, given);
  resolve_task_alias(o, given);  // --task charlm: the text task with --tokenizer bytes
  // A task may have defaults of its own (charlm, text: model, schedule, regularisation; --arch
  // llama: rotary positions) for the options not given.
  o = with_task_defaults(o, given);
  // Options that the run's task (or position scheme) does not read would be ignored: refuse them.
  check_options_apply(o, given);
  if (given.count("lr") && o.lr == 0.0) refuse("--lr 0: must be a number in (0, 1] (leave --lr out for the default)");
  validate_options(with_defaults(o));
}

}  // namespace

std::string read_config_file(const std::string& path) {
  return io::read_input_file(path, io::kConfigLimit, "[train] --config");
}

std::set<std::string> resolve_invocation(TrainOptions& o, const Invocation& inv, std::ostream& warnings) {
  std::set<std::string> given = inv.given;
  if (!inv.config.empty()) {
    if (!o.resume.empty())
      refuse("--config cannot be combined with --resume: a resumed run keeps the options saved in " + o.resume);
    merge_config(o, inv.config, given, warnings);
  }
  if (inv.resume_flag && o.resume.empty()) refuse("--resume needs the folder of a run, got ''");
  if (!o.resume.empty())
    check_resume(o, given);
  else {
    resolve_new_run(o, given);
    // --lora-*, --freeze (train/adapters.cpp): against the flags of the command line (a
    // --config file, e.g. a run's config.json, holds every option, defaults included).
    check_adapter_options(o, inv.given);
  }
  return given;
}

}  // namespace xg::train
