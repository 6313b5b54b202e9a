// The xgrad program: `xgrad <command> [options]`, `xgrad <command> --help` for each.
// Every failure reaches the user as one line on stderr: usage errors (a bad flag) exit 2,
// runtime errors (a bad file, a failing write, anything else) exit 1; nothing aborts.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>
#include <new>

#include "commands.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/dist/communicator.hpp>

namespace {

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
  try {
    CLI::App app{"xgrad: tape-based autodiff with exact attention gradients"};
    app.require_subcommand(1);
    xg::cli::add_demo(app);
    xg::cli::add_gradcheck(app);
    xg::cli::add_train(app);
    xg::cli::add_generate(app);
    xg::cli::add_inspect(app);
    xg::cli::add_visibility(app);
    try {
      app.parse(argc, argv);
    } catch (const CLI::RuntimeError& e) {  // a subcommand's own exit status (e.g. 130 after Ctrl-C)
      return e.get_exit_code();
    } catch (const CLI::ParseError& e) {
      // Under mpirun/srun every rank parses the same command line: rank 0 alone speaks.
      if (xg::dist::detect_launch().rank > 0) return e.get_exit_code() == 0 ? 0 : 2;
      if (e.get_exit_code() == 0) return app.exit(e);  // --help
      if (argc > 1 && argv[1][0] != '-') {
        bool known = false;
        for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->get_name() == argv[1];
        if (!known)
          return fail(2, std::string("unknown command '") + argv[1] +
                             "' (demo, gradcheck, train, generate, inspect, visibility; see xgrad --help)");
      }
      return fail(2, std::string(e.what()) + " (see xgrad --help)");
    }
  } catch (const xg::UsageError& e) {
    return fail(2, e.what());
  } catch (const xg::Error& e) {
    return fail(1, e.what());
  } catch (const std::bad_alloc&) {
    return fail(1, "out of memory");
  } catch (const std::exception& e) {
    return fail(1, std::string("error: ") + e.what());
  } catch (...) {
    return fail(1, "unknown error");
  }
  return 0;
}
