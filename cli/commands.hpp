// Subcommands of the xgrad program, one file each (cli/cmd_<name>.cpp). Each registers
// itself on the CLI11 app; its callback throws CLI::RuntimeError(code) for a non-zero exit.
// Conventions (docs/cli.md): results on stdout, progress and warnings on stderr; a bad flag is
// a UsageError (exit 2), found before any work; anything else that fails exits 1.
#pragma once

#include <exception>
#include <string>
#include <vector>
#include <nlohmann/json_fwd.hpp>

namespace CLI {
class App;
class Validator;
}

namespace xg::cli {

// Registers one subcommand on the app.
using AddCommand = void(CLI::App& app);
// add_<name> is in cli/cmd_<name>.cpp; add_import and add_export are in cli/cmd_llama2c.cpp.
AddCommand add_demo, add_gradcheck, add_train, add_generate, add_inspect, add_visibility, add_convert, add_compare,
    add_eval, add_report, add_tokenizer, add_import, add_export, add_merge;
// Every subcommand, in the order `xgrad --help` lists them.
inline AddCommand* const all_commands[] = {add_demo, add_gradcheck, add_train, add_generate, add_inspect,
                                           add_visibility, add_convert, add_compare, add_eval, add_report,
                                           add_tokenizer, add_import, add_export, add_merge};

// Flag validators (cli/common.cpp).
// For unsigned flags: only digits (CLI11 alone would wrap "-1" around to 2^64 - 1).
const CLI::Validator& non_negative_integer();
// For signed integer flags: an optional '-' and digits (CLI11 alone reads '' as 0).
const CLI::Validator& integer();
// For floating-point flags: the whole text is a number (CLI11 alone reads '' as 0).
const CLI::Validator& number();
// For path flags whose empty value would silently mean "none": the text is not empty.
const CLI::Validator& non_empty_path();

// Output paths, checked before any work (UsageError naming the command and the flag).
// A file: not empty, not a folder, in an existing folder that can be written to.
void check_output_file(const std::string& command, const std::string& flag, const std::string& path);
// A folder: not empty, not an existing non-folder, and creatable (its nearest existing
// ancestor is a folder that can be written to).
void check_output_folder(const std::string& command, const std::string& flag, const std::string& path);

// Whether two paths name the same file however they are spelled (./a, a, dir/../a, a
// symlink to it, a hard link), whether it exists yet or not. "-" (stdout) and '' name no file.
bool same_file(const std::string& a, const std::string& b);

// The files a command reads and writes, named by their flags ("--json", "OUT", ...).
struct FileRole {
  std::string flag, path;
  bool output = true;  // false: an input the command reads
};
// Before any work: a UsageError naming both flags when two outputs, or an output and an
// input, name the same file (an output would replace the other output or the input).
void check_distinct_files(const std::string& command, const std::vector<FileRole>& files);

// A command's JSON document (keys in the order they are set), begun with its "command" and
// "xgrad_version".
nlohmann::ordered_json command_json(const std::string& command);

// Writes a JSON document (text) to `path`, or to stdout for "-" (ValueError naming the
// command and the flag when the write fails).
void write_json(const std::string& command, const std::string& flag, const std::string& path, const std::string& text);

// One line on stderr: "xgrad: warning: <message>".
void warn(const std::string& message);

// --- failures (cli/common.cpp; used by main and by train under mpirun) ---------------------

// The pointer a usage error ends with: " (see 'xgrad <command> --help')".
std::string help_pointer(const std::string& command);
// The exit status (2 for a UsageError, 1 otherwise) and the one line ("xgrad: ...", without
// the newline) xgrad prints for an exception thrown by `command`.
struct Failure {
  int status = 1;
  std::string line;
};
Failure describe_failure(const std::exception_ptr& e, const std::string& command);
// One write of line + "\n" on stderr (newlines inside the line become spaces): under mpirun the
// output of several processes interleaves by writes.
void print_line(const std::string& line);
// Whether this process is rank 1, 2, ... of a job an MPI launcher started (from its
// environment: dist::detect_launch). Such a rank prints no error: rank 0 alone reports. Never
// throws: a bad XGRAD_MPI counts as rank 0 here (`xgrad train` reports it when it launches).
bool quiet_rank();
// What such a rank does before it exits with a failure it did not print: waits (3 s at most)
// for the launcher to end it once rank 0 has reported; mpirun ends the whole job as soon as
// one rank exits non-zero, and rank 0 must not be killed before its line is out.
void linger();

// std::cout writes to stdout through a buffer that remembers why a write failed (first thing
// in main). finish_stdout() flushes it (and C stdio): 0 when everything written there arrived,
// otherwise one line on stderr naming the reason and 1 (e.g. stdout on a full disk, /dev/full).
void install_stdout();
int finish_stdout();

}  // namespace xg::cli
