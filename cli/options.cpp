// The option idiom of every command (cli/options.hpp): rows, their CLI11 wiring, the range and
// choice checks, --help's defaults and example, the shared rows and the old spellings.
#include "options.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>
#include <type_traits>
#include <variant>

#include "commands.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/train/options.hpp>

namespace xg::cli {

namespace fs = std::filesystem;

Flag Flag::with_help(std::string h) const {
  Flag f = *this;
  f.help = std::move(h);
  return f;
}
Flag Flag::required() const {
  Flag f = *this;
  f.is_required = true;
  f.default_text = "-";
  return f;
}
Flag Flag::range(double l, double h, bool lo_o, bool hi_o) const {
  Flag f = *this;
  f.ranged = true;
  f.lo = l;
  f.hi = h;
  f.lo_open = lo_o;
  f.hi_open = hi_o;
  return f;
}
Flag Flag::one_of(std::vector<std::string> c) const {
  Flag f = *this;
  f.choices = std::move(c);
  return f;
}
Flag Flag::shown_default(std::string text) const {
  Flag f = *this;
  f.default_text = std::move(text);
  return f;
}
Flag Flag::type(std::string name) const {
  Flag f = *this;
  f.type_name = std::move(name);
  return f;
}
Flag Flag::was(std::string old_flag) const {
  Flag f = *this;
  f.old.push_back(std::move(old_flag));
  return f;
}

Flag text_flag(std::string name, std::string flag, std::string help) {
  Flag f;
  f.name = std::move(name);
  f.flag = std::move(flag);
  f.help = std::move(help);
  return f;
}
Flag path_flag(std::string name, std::string flag, std::string help) {
  Flag f = text_flag(std::move(name), std::move(flag), std::move(help));
  f.path = true;
  f.type_name = "FILE";
  return f;
}
Flag value_flag(std::string name, std::string flag, std::string help) {
  return text_flag(std::move(name), std::move(flag), std::move(help));
}

Flag train_flag(const train::OptionSpec& s) {
  Flag f = text_flag(s.name, s.flag, s.help);
  f.path = s.name == "init_from";  // the others' '' has a rule of its own (train/lifecycle.hpp)
  f.choices = s.choices;
  f.ranged = s.ranged;
  f.lo = s.lo;
  f.hi = s.hi;
  f.lo_open = s.lo_open;
  f.hi_open = s.hi_open;
  f.negated = s.negated;
  f.old = s.deprecated;
  if (!s.show_default) f.default_text = "-";
  return f;
}

Flag train_flag(const std::string& name) {
  const train::OptionSpec* s = train::find_option(name);
  if (!s) throw ValueError("[cli] no option '" + name + "' in xgrad train's table");
  return train_flag(*s);
}

namespace shared {

Flag checkpoint() {
  return path_flag("checkpoint", "--checkpoint",
                   "a model.safetensors written by xgrad, or a run folder of xgrad train (its final "
                   "model.safetensors)")
      .type("MODEL");
}
Flag json() {
  return path_flag("json", "--json", "also write the results as JSON to FILE ('-': to stdout, and nothing else there)")
      .type("FILE|-");
}
Flag overwrite() {
  return train_flag("overwrite").with_help("replace outputs that exist (without it an output that exists is refused)");
}
Flag threads() {
  return train_flag("threads").with_help("xgrad worker threads, in [0, 1024] (0: the cores)").shown_default("0");
}
Flag seed() { return train_flag("seed"); }
Flag val_fraction() { return train_flag("val_fraction"); }
Flag text() {
  Flag f = train_flag("text").with_help("a text file, or a folder of them (recursively)");
  f.path = true;
  f.type_name = "PATH";
  return f;
}
Flag tokenizer() {
  Flag f = train_flag("tokenizer");
  f.path = true;
  f.type_name = "TOKENIZER";
  f.default_text = "-";
  return f;
}

}  // namespace shared

std::string model_file(const std::string& command, const std::string& flag, const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  const fs::path model = fs::path(path) / "model.safetensors";
  if (!fs::exists(model, ec))
    throw UsageError(op_message(command, flag + " '" + path + "' is a folder without model.safetensors; give a model "
                                                                "file, or the folder of a finished run (its model.safetensors)"));
  return model.string();
}

int thread_count(std::size_t threads) {
  return threads > 0 ? static_cast<int>(threads) : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void check_new_output(const std::string& command, const std::string& flag, const std::string& path, bool overwrite) {
  if (path.empty() || path == "-") return;
  std::error_code ec;
  if (!overwrite && fs::exists(path, ec) && !fs::is_directory(path, ec))
    throw UsageError(op_message(command, flag + " '" + path + "' exists; pass --overwrite to replace it"));
  check_output_file(command, flag, path);
}

namespace {

std::map<std::string, std::map<std::string, std::string>>& registry() {
  static std::map<std::string, std::map<std::string, std::string>> r;
  return r;
}

std::string join_or(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i == 0 ? "" : i + 1 == v.size() ? " or " : ", ") + v[i];
  return s;
}

std::string range_text(const Flag& f, bool integral) {
  auto num = [&](double v) { return integral ? std::to_string(static_cast<long long>(v)) : number_text(v); };
  return (f.lo_open ? "(" : "[") + num(f.lo) + ", " + num(f.hi) + (f.hi_open ? ")" : "]");
}

const char* const kDefaultsNote =
    "Defaults: an option's default follows its type (=VALUE); an option shown without one is off or unset by "
    "default.";

}  // namespace

Options::Options(CLI::App& app, std::string command) : app_(&app), command_(std::move(command)) {}

template <class T>
CLI::Option* Options::add(const Flag& f, T& target) {
  for (const std::string& old : f.old) registry()[command_][old] = f.flag;
  if constexpr (std::is_same_v<T, bool>) {
    return app_->add_flag(f.negated ? f.flag + "{false}" : f.flag, target, f.help);
  } else {
    CLI::Option* opt = app_->add_option(f.flag, target, f.help);
    if (f.is_required) opt->required();
    if (!f.type_name.empty()) opt->type_name(f.type_name);
    if (f.default_text.empty())
      opt->capture_default_str();
    else if (f.default_text != "-")
      opt->default_str(f.default_text);
    if constexpr (std::is_same_v<T, double>)
      opt->check(number());
    else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
      opt->check(integer());
    else if constexpr (std::is_integral_v<T>)
      opt->check(non_negative_integer());
    if (f.path) opt->check(non_empty_path());
    if constexpr (std::is_same_v<T, std::vector<std::string>>) opt->allow_extra_args(false);  // one value a use
    const std::string command = command_;
    if constexpr (std::is_same_v<T, std::string>) {
      if (!f.choices.empty())
        checks_.push_back([command, f, &target] {
          for (const std::string& c : f.choices)
            if (c == target) return;
          throw UsageError(op_message(command, f.flag + " " + shown_value(target.empty() ? "''" : target) +
                                                   ": must be " + join_or(f.choices)));
        });
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (f.ranged)
        checks_.push_back([command, f, &target] {
          const double v = static_cast<double>(target);
          const bool ok = std::isfinite(v) && (f.lo_open ? v > f.lo : v >= f.lo) && (f.hi_open ? v < f.hi : v <= f.hi);
          if (ok) return;
          const bool integral = std::is_integral_v<T>;
          std::string shown;
          if constexpr (std::is_integral_v<T>)
            shown = std::to_string(target);
          else
            shown = number_text(v);
          throw UsageError(op_message(command, f.flag + " " + shown + ": must be " +
                                                   (integral ? "in " : "a number in ") + range_text(f, integral)));
        });
    }
    return opt;
  }
}

template CLI::Option* Options::add<std::string>(const Flag&, std::string&);
template CLI::Option* Options::add<bool>(const Flag&, bool&);
template CLI::Option* Options::add<double>(const Flag&, double&);
template CLI::Option* Options::add<int>(const Flag&, int&);
template CLI::Option* Options::add<std::int64_t>(const Flag&, std::int64_t&);
template CLI::Option* Options::add<std::size_t>(const Flag&, std::size_t&);
template CLI::Option* Options::add<std::vector<std::string>>(const Flag&, std::vector<std::string>&);

void Options::check() const {
  for (const auto& c : checks_) c();
}

void Options::on_run(std::function<void()> run) {
  std::vector<std::function<void()>> checks = checks_;
  app_->callback([checks, run] {
    for (const auto& c : checks) c();
    run();
  });
}

void Options::example(const std::string& line, const std::string& defaults) { help_footer(*app_, line, defaults); }

void help_footer(CLI::App& app, const std::string& example, const std::string& defaults) {
  app.footer(std::string("\n") + kDefaultsNote + (defaults.empty() ? "" : "\n" + defaults) + "\n\nExample:\n  " +
             example + "\n");
}

const std::map<std::string, std::string>& deprecated_flags(const std::string& command) { return registry()[command]; }

std::vector<std::string> rewrite_deprecated(const std::string& command, int argc, char** argv, int first, bool quiet) {
  std::vector<std::string> args(argv, argv + argc);
  const std::map<std::string, std::string>& renames = deprecated_flags(command);
  std::set<std::string> said;
  for (int i = first; i < argc; ++i) {
    std::string& a = args[static_cast<std::size_t>(i)];
    if (a == "--") break;  // operands from here on
    for (const auto& [old, now] : renames) {
      const bool exact = a == old, with_value = a.rfind(old + "=", 0) == 0;
      if (!exact && !with_value) continue;
      a = now + a.substr(old.size());
      if (!quiet && said.insert(old).second) print_line("xgrad: " + old + " is deprecated, use " + now);
      break;
    }
  }
  return args;
}

}  // namespace xg::cli
