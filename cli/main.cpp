// The xgrad program: `xgrad <command> [options]`, `xgrad <command> --help` for each,
// `xgrad --version`. Every failure reaches the user as one line on stderr: usage errors (a
// bad flag, with a pointer to the command's --help) exit 2, runtime errors (a bad file, a
// failing write, anything else) exit 1; nothing aborts. Conventions: docs/cli.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <vector>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <exception>
#include <string>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/nn/sdpa.hpp>
#include <xgrad/version.hpp>

namespace {

const char* const kCommands[] = {"demo",    "gradcheck", "train",   "generate", "inspect",  "visibility",
                                 "convert", "compare",   "eval",    "report",   "tokenizer", "import", "export",
                                 "merge"};

// Under mpirun/srun every rank runs the same command line and would print the same error:
// rank 0 alone reports it (docs/distributed.md); the others exit with the same status.
int report(int code, const std::string& line) {
  if (xg::cli::quiet_rank())
    xg::cli::linger();
  else
    xg::cli::print_line(line);
  return code;
}

int fail(int code, const std::string& message) { return report(code, "xgrad: " + message); }

int fail(const std::exception_ptr& e, const std::string& command) {
  const xg::cli::Failure f = xg::cli::describe_failure(e, command);
  return report(f.status, f.line);
}

int run(int argc, char** argv) {
  // The command named on the command line (its first argument), for the --help pointer.
  std::string command;
  if (argc > 1)
    for (const char* c : kCommands)
      if (std::strcmp(argv[1], c) == 0) command = c;
  // `xgrad tokenizer train|encode|decode|export`: the pointer names the subcommand's own help.
  if (command == "tokenizer" && argc > 2)
    for (const char* sub : {"train", "encode", "decode", "export"})
      if (std::strcmp(argv[2], sub) == 0) command += std::string(" ") + sub;
  // `xgrad import llama2c`, `xgrad export llama2c` likewise.
  if ((command == "import" || command == "export") && argc > 2 && std::strcmp(argv[2], "llama2c") == 0)
    command += " llama2c";
  // `xgrad --version --verbose` (either order): the version line, then the BLAS libraries and
  // the GEMM kernels chosen on this CPU (`xgrad --version` alone prints the version line only).
  if (argc == 3 && ((std::strcmp(argv[1], "--version") == 0 && std::strcmp(argv[2], "--verbose") == 0) ||
                    (std::strcmp(argv[1], "--verbose") == 0 && std::strcmp(argv[2], "--version") == 0))) {
    if (xg::cli::quiet_rank()) return 0;
    std::string text;
    try {  // all of it before any is printed: a bad XGRAD_FLOAT64_GEMM, XGRAD_FLOAT32_GEMV,
           // XGRAD_BF16_ATTENTION or XGRAD_HUGE_PAGES fails with its one line alone
      text = std::string("xgrad ") + XGRAD_VERSION_STRING + "\nOpenBLAS core: " + xg::openblas_core() + " (" +
             xg::openblas_config() + ")\nfloat32 GEMM: " + xg::float32_gemm_kernels() +
             "\nfloat32 matrix-vector: " + xg::float32_gemv_kernels() + "\nfloat64 GEMM: " + xg::float64_gemm_kernels() +
             "\nbfloat16 products: " + xg::bfloat16_gemm_kernels() +
             "\nbfloat16 attention: " + xg::nn::bfloat16_attention_kernels() +
             "\nhuge pages: " + (xg::huge_pages() ? "on" : "off") + "\ncalibration cache: " +
             (xg::calibration_cache_path().empty() ? std::string("off (XGRAD_CACHE_DIR=off or no HOME)")
                                                   : xg::calibration_cache_path()) +
             "\n";
    } catch (...) {
      return fail(std::current_exception(), command);
    }
    std::cout << text;
    return 0;
  }
  try {
    CLI::App app{"xgrad: tape-based autodiff with exact attention gradients"};
    app.set_version_flag("--version", std::string("xgrad ") + XGRAD_VERSION_STRING,
                         "Print the version and exit (with --verbose: also OpenBLAS's core and the float32 and "
                         "float64 GEMM kernels chosen on this CPU, and the calibration cache)");
    app.require_subcommand(1);
    for (auto* add : xg::cli::all_commands) add(app);
    xg::cli::help_footer(app, "xgrad train --task text --text corpus/ --out run1   (then: xgrad <command> --help)");
    // Old spellings of renamed flags still work for one release, with a deprecation line each.
    const int first = 1 + static_cast<int>(std::count(command.begin(), command.end(), ' ')) + (command.empty() ? 0 : 1);
    std::vector<std::string> args = xg::cli::rewrite_deprecated(command, argc, argv, first, xg::cli::quiet_rank());
    std::vector<char*> arg_ptrs;
    for (std::string& a : args) arg_ptrs.push_back(a.data());
    try {
      app.parse(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
    } catch (const CLI::RuntimeError& e) {  // a subcommand's own exit status (e.g. 130 after Ctrl-C)
      return e.get_exit_code();
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) {  // --help, --version
        if (xg::cli::quiet_rank()) return 0;
        return app.exit(e);
      }
      if (argc > 1 && command.empty())  // the first argument is not a command
        return fail(2, std::string(argv[1][0] == '-' ? "unknown option '" : "unknown command '") + argv[1] +
                           "' (commands: demo, gradcheck, train, generate, inspect, visibility, convert, compare, eval, report, tokenizer, import, export, merge; see 'xgrad --help')");
      // `xgrad import FORMAT` (export too) without a format it knows: name the formats.
      if ((command == "import" || command == "export") && (argc < 3 || argv[2][0] != '-'))
        return fail(2, "[" + command + "] " +
                           (argc < 3 ? std::string("needs a format")
                                     : "unknown format '" + xg::shown_value(argv[2]) + "'") +
                           ": the formats xgrad " + command + " knows are: llama2c (xgrad " + command +
                           " llama2c IN OUT)" + xg::cli::help_pointer(command));
      // CLI11's own messages (a missing or unknown flag, a value its validator refuses) name the
      // command as every other error does: `[train] --steps: ...`.
      const std::string what = e.what();
      const std::string prefix = command.empty() || what.rfind('[', 0) == 0 ? "" : "[" + command + "] ";
      return fail(2, prefix + what + xg::cli::help_pointer(command));
    }
  } catch (...) {
    return fail(std::current_exception(), command);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  xg::cli::install_stdout();
  const int status = run(argc, argv);
  if (status != 0) return status;  // already reported: one line
  // Results on stdout that never arrived (a full disk, /dev/full) are a failed
  // write: exit 1 with a message, not 0 (docs/cli.md).
  return xg::cli::finish_stdout();
}
