// The xgrad program: `xgrad <command> [options]`, `xgrad <command> --help` for each.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "cli/commands.hpp"
#include "core/error.hpp"
#include "core/runtime.hpp"

int main(int argc, char** argv) {
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
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const xg::Error& e) {
    std::cerr << "xgrad: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
