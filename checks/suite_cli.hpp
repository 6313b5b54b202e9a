/// \file
/// The command-line side of the gradient-check suite, for programs only: the flags of
/// `xgrad gradcheck` on a CLI11 app, and a main() that takes flags of your own. Only this
/// header names CLI11 (CLI::App is declared here; include <CLI/CLI.hpp> to add options);
/// <xgrad/checks/suite.hpp> and its gradcheck_main(suite, argc, argv) need no CLI11.
#pragma once

#include <functional>
#include <string>

#include <xgrad/checks/suite.hpp>

/// CLI11, the command-line parser that add_gradcheck_options and gradcheck_main fill.
namespace CLI {
class App;
}

namespace xg {

/// The flags `--json`, `--list`, `--filter`, `--seed`, `--dtype`, `--full`, `--order` on a CLI11 app,
/// writing into opts (which must outlive parsing). Shared by `xgrad gradcheck` and
/// gradcheck_main.
void add_gradcheck_options(CLI::App& app, RunOptions& opts);

/// gradcheck_main with flags of your own: `extra` adds them to the app before parsing;
/// `description` heads `--help`. Otherwise as gradcheck_main(suite, argc, argv).
int gradcheck_main(const GradcheckSuite& suite, int argc, char** argv, const std::function<void(CLI::App&)>& extra,
                   const std::string& description = "Gradient checks");

}  // namespace xg
