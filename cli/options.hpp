// One way to declare the options of every command (docs/cli.md, "Options"). A command's
// options are rows (Flag): the flag, the JSON name, the help, the kind of value with its range
// or choices, the default shown in --help and the old spellings that still work. Options binds
// the rows to a command's variables (CLI11), checks the ranges and choices after parsing, before
// any work (a UsageError naming the command, the flag and the value: exit 2), and gives --help
// its defaults and an example. An option that several commands take is declared once, below
// (shared::...); `xgrad train`'s rows are its option table (train/options.hpp), bound by the
// same code.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
class Option;
}

namespace xg::train {
struct OptionSpec;
}

namespace xg::cli {

// One row: an option of one command, or of several (shared::...).
struct Flag {
  std::string name;  // the JSON name (the key of --config, of the command's JSON output)
  std::string flag;  // "--checkpoint"
  std::string help;
  std::string type_name;  // shown in --help ("FILE", "MODEL"; "" : from the variable's type)
  bool path = false;      // a file or folder: '' is refused
  bool is_required = false;
  std::vector<std::string> choices;  // the values allowed (empty: any)
  // A number's range [lo, hi], with open ends where lo_open / hi_open.
  bool ranged = false;
  double lo = 0, hi = 0;
  bool lo_open = false, hi_open = false;
  std::string default_text;  // shown in --help as =VALUE ("" : the variable's value; "-": none shown)
  bool negated = false;      // a boolean flag that turns its option off (--no-plot)
  std::vector<std::string> old;  // old spellings: still accepted for one release, with a deprecation line

  // Builders, so that a row reads as one line.
  Flag with_help(std::string h) const;
  Flag required() const;
  Flag range(double lo, double hi, bool lo_open = false, bool hi_open = false) const;
  Flag one_of(std::vector<std::string> c) const;
  Flag shown_default(std::string text) const;
  Flag type(std::string name) const;
  Flag was(std::string old_flag) const;
};

// A row of a text value, a path, and a number or switch.
Flag text_flag(std::string name, std::string flag, std::string help);
Flag path_flag(std::string name, std::string flag, std::string help);
Flag value_flag(std::string name, std::string flag, std::string help);
// The row of an option of `xgrad train`'s table (its flag, name, help, range, choices, old spellings).
Flag train_flag(const train::OptionSpec& spec);
Flag train_flag(const std::string& name);

// The options that several commands share, declared once (docs/cli.md has the table).
namespace shared {
// --checkpoint MODEL: a model.safetensors, or a run folder (its final model.safetensors).
Flag checkpoint();
// --json FILE|-: also write the results as JSON to FILE; '-': to stdout, and nothing else there.
Flag json();
// --overwrite: replace outputs that exist (without it every output that exists is refused).
Flag overwrite();
// --threads N: xgrad worker threads, in [0, 1024]; 0 (the default): the cores.
Flag threads();
// --seed, --val-fraction, --text (a path, everywhere), --tokenizer: train's rows.
Flag seed();
Flag val_fraction();
Flag text();
Flag tokenizer();
}  // namespace shared

// The model file a checkpoint argument names: the file itself, or a run folder's final model
// (RUN/model.safetensors). A folder without one is a UsageError naming the command and flag.
std::string model_file(const std::string& command, const std::string& flag, const std::string& path);
// The worker-thread count of --threads: the cores for 0.
int thread_count(std::size_t threads);
// An output that must not replace a file silently: when `path` exists (and is not a folder)
// without --overwrite, a UsageError "FLAG 'PATH' exists; pass --overwrite to replace it";
// then check_output_file. "-" and '' are no file.
void check_new_output(const std::string& command, const std::string& flag, const std::string& path, bool overwrite);

// The rows of one command bound to its variables.
class Options {
 public:
  // `command` as messages name it ("eval", "tokenizer encode").
  Options(CLI::App& app, std::string command);
  // Adds the row's option, writing into `target` (which must outlive parsing).
  template <class T>
  CLI::Option* add(const Flag& f, T& target);
  // Checks the ranges and choices of the rows (after parsing; UsageError naming the flag and value).
  void check() const;
  // The command's action: the checks, then `run`.
  void on_run(std::function<void()> run);
  // --help ends with the note on defaults (`defaults`: more of it, e.g. train's per task) and this example.
  void example(const std::string& line, const std::string& defaults = "");
  CLI::App& app() { return *app_; }

 private:
  CLI::App* app_;
  std::string command_;
  std::vector<std::function<void()>> checks_;
};

// --help's end for a command without Options (demo, the parent commands): the note on defaults
// and an example.
void help_footer(CLI::App& app, const std::string& example, const std::string& defaults = "");

// The old spellings of the flags of `command` (filled as commands add their options): old -> new.
const std::map<std::string, std::string>& deprecated_flags(const std::string& command);
// argv with the old spellings of `command`'s flags (from argument `first` on) replaced by the
// new ones; one line "xgrad: --old is deprecated, use --new" on stderr for each (unless quiet).
std::vector<std::string> rewrite_deprecated(const std::string& command, int argc, char** argv, int first, bool quiet);

}  // namespace xg::cli
