// Subcommands of the xgrad program, one file each (cli/cmd_<name>.cpp). Each registers
// itself on the CLI11 app; its callback throws CLI::RuntimeError(code) for a non-zero exit.
// Conventions (docs/cli.md): results on stdout, progress and warnings on stderr; a bad flag is
// a UsageError (exit 2), found before any work; anything else that fails exits 1.
#pragma once

#include <string>

namespace CLI {
class App;
class Validator;
}

namespace xg::cli {

void add_demo(CLI::App& app);       // cli/cmd_demo.cpp
void add_gradcheck(CLI::App& app);  // cli/cmd_gradcheck.cpp
void add_train(CLI::App& app);      // cli/cmd_train.cpp
void add_generate(CLI::App& app);   // cli/cmd_generate.cpp
void add_inspect(CLI::App& app);    // cli/cmd_inspect.cpp
void add_visibility(CLI::App& app); // cli/cmd_visibility.cpp
void add_convert(CLI::App& app);    // cli/cmd_convert.cpp

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

// Writes a JSON document (text) to `path`, or to stdout for "-" (ValueError naming the
// command and the flag when the write fails).
void write_json(const std::string& command, const std::string& flag, const std::string& path, const std::string& text);

// One line on stderr: "xgrad: warning: <message>".
void warn(const std::string& message);

}  // namespace xg::cli
