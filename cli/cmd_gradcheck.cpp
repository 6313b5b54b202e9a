// `xgrad gradcheck`: runs the built-in gradient checks and invariants (checks/) and prints
// the table; --json, --list, --filter, --seed, --dtype, --full, --order (docs/gradcheck.md). The exit
// status is 0 only when no selected check failed and one passed (--order 2 skips checks
// without a second-order form), 1 otherwise; a bad flag (a --filter that matches nothing, an
// unwritable --json path, an --order other than 1 or 2) is a usage error, 2.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include <xgrad/checks/builtin.hpp>
#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/checks/suite_cli.hpp>

namespace xg::cli {

void add_gradcheck(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "gradcheck",
      "Run the gradient-check suite: every op, layer and model against central differences, the spec's closed-form "
      "attention gradients, and the attention invariants");
  auto opts = std::make_shared<RunOptions>();
  auto overwrite = std::make_shared<bool>(false);
  add_gradcheck_options(*cmd, *opts);
  Options o(*cmd, "gradcheck");
  o.add(cli::shared::overwrite().with_help("replace an existing --json FILE"), *overwrite);
  o.example("xgrad gradcheck --filter 'attention/*' --dtype float32 --json -");
  o.on_run([opts, overwrite] {
    cli::check_new_output("gradcheck", "--json", opts->json_path, *overwrite);
    GradcheckSuite suite;
    checks::register_builtin_checks(suite);
    // A UsageError (bad --filter or --json) reaches main: one line, exit 2.
    const int rc = run_gradcheck_command(suite, *opts, std::cout);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xg::cli
