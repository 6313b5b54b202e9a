// Subcommands of the xgrad program, one file each (cli/cmd_<name>.cpp). Each registers
// itself on the CLI11 app; its callback throws CLI::RuntimeError(code) for a non-zero exit.
#pragma once

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

// For unsigned flags: only digits (CLI11 alone would wrap "-1" around to 2^64 - 1).
const CLI::Validator& non_negative_integer();  // cli/cmd_train.cpp
// For floating-point flags: the whole text is a number (CLI11 alone reads '' as 0).
const CLI::Validator& number();  // cli/cmd_train.cpp

}  // namespace xg::cli
