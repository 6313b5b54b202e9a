// The xgrad program: `xgrad <command> [options]`, `xgrad <command> --help` for each,
// `xgrad --version`. Every failure reaches the user as one line on stderr: usage errors (a
// bad flag, with a pointer to the command's --help) exit 2, runtime errors (a bad file, a
// failing write, anything else) exit 1; nothing aborts. Conventions: docs/cli.md.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <new>

#include "commands.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/version.hpp>
#include <xgrad/dist/communicator.hpp>

namespace {

const char* const kCommands[] = {"demo", "gradcheck", "train", "generate", "inspect", "visibility", "convert"};

// One line: newlines inside a message (rare, from libraries) become spaces.
int fail(int code, const std::string& message) {
  std::string m = message;
  for (char& c : m)
    if (c == '\n' || c == '\r') c = ' ';
  std::cerr << ("xgrad: " + m + "\n");  // one write: under mpirun, lines of several processes interleave
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // The command named on the command line (its first argument), for the --help pointer.
  std::string command;
  if (argc > 1)
    for (const char* c : kCommands)
      if (std::strcmp(argv[1], c) == 0) command = c;
  const std::string help = command.empty() ? " (see 'xgrad --help')" : " (see 'xgrad " + command + " --help')";
  try {
    CLI::App app{"xgrad: tape-based autodiff with exact attention gradients"};
    app.set_version_flag("--version", std::string("xgrad ") + XGRAD_VERSION_STRING, "Print the version and exit");
    app.require_subcommand(1);
    xg::cli::add_demo(app);
    xg::cli::add_gradcheck(app);
    xg::cli::add_train(app);
    xg::cli::add_generate(app);
    xg::cli::add_inspect(app);
    xg::cli::add_visibility(app);
    xg::cli::add_convert(app);
    try {
      app.parse(argc, argv);
    } catch (const CLI::RuntimeError& e) {  // a subcommand's own exit status (e.g. 130 after Ctrl-C)
      return e.get_exit_code();
    } catch (const CLI::ParseError& e) {
      // Under mpirun/srun every rank parses the same command line: rank 0 alone speaks.
      if (xg::dist::detect_launch().rank > 0) return e.get_exit_code() == 0 ? 0 : 2;
      if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
      if (argc > 1 && command.empty())  // the first argument is not a command
        return fail(2, std::string(argv[1][0] == '-' ? "unknown option '" : "unknown command '") + argv[1] +
                           "' (commands: demo, gradcheck, train, generate, inspect, visibility, convert; see 'xgrad --help')");
      return fail(2, std::string(e.what()) + help);
    }
  } catch (const xg::UsageError& e) {
    return fail(2, e.what() + help);
  } catch (const xg::Error& e) {
    return fail(1, e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    const std::string path = e.path1().empty() ? std::string() : e.path1().string() + ": ";
    return fail(1, path + e.code().message());
  } catch (const std::bad_alloc&) {
    return fail(1, "out of memory");
  } catch (const std::exception& e) {
    return fail(1, std::string("error: ") + e.what());
  } catch (...) {
    return fail(1, "unknown error");
  }
  return 0;
}
