// The command-line side of the gradient-check suite (checks/suite_cli.hpp): CLI11 flags and
// gradcheck_main. The only file of xgrad::checks that includes CLI11.
#include <xgrad/checks/suite_cli.hpp>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <xgrad/core/error.hpp>

namespace xg {

void add_gradcheck_options(CLI::App& app, RunOptions& opts) {
  app.add_option("--json", opts.json_path, "Also write the report as JSON to FILE ('-': to stdout, in place of the table)")
      ->type_name("FILE|-")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must name a file, got ''") : ""; },
                             "FILE"));
  app.add_flag("--list", opts.list, "List the checks (name, kind, configuration) without running them");
  app.add_option("--filter", opts.filter,
                 "Run only the checks whose name matches: a substring, or a glob with * ? [...]; "
                 "several patterns separated by commas")
      ->type_name("PATTERN");
  app.add_option("--seed", opts.seed, "Seed for every check's inputs, cotangents and directions")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {  // digits only: CLI11 alone wraps -1 and reads '' as 0
            if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
              return "must be a non-negative integer, got '" + v + "'";
            errno = 0;
            (void)std::strtoull(v.c_str(), nullptr, 10);
            return errno == ERANGE ? "'" + v + "' is out of range" : std::string();
          },
          "UINT"));
  app.add_option_function<std::string>(
         "--dtype", [&opts](const std::string& s) { opts.dtype = s == "float32" ? DType::float32 : DType::float64; },
         "Precision of the checks: float64 (step 1e-6, atol 1e-5, rtol 1e-3) or float32 (step 5e-3, atol 1e-2, "
         "rtol 1e-2; see docs/gradcheck.md)")
      ->check(CLI::IsMember({"float32", "float64"}))
      ->default_str("float64")
      ->type_name("DTYPE");
  app.add_flag("--full", opts.full, "Larger sweeps: bigger shapes and more random configurations");
  app.add_option_function<std::string>(
         "--order", [&opts](const std::string& s) { opts.order = s == "2" ? 2 : 1; },
         "Derivative order checked: 1 (gradcheck) or 2 (second derivatives: gradgradcheck and the forward-mode "
         "jvpcheck; checks without a second-order form are skipped; float32 uses atol and rtol 5e-2)")
      ->check(CLI::Validator(
          [](std::string& v) { return v == "1" || v == "2" ? std::string() : "must be 1 or 2, got '" + v + "'"; },
          "1|2"))
      ->default_str("1")
      ->type_name("ORDER");
}

int gradcheck_main(const GradcheckSuite& suite, int argc, char** argv, const std::function<void(CLI::App&)>& extra,
                   const std::string& description) {
  CLI::App app{description};
  RunOptions opts;
  add_gradcheck_options(app, opts);
  if (extra) extra(app);
  // Failures are one line on stderr, "<program>: <message>": a bad flag exits 2 (with a
  // pointer to --help), any other error 1, as the xgrad program does.
  const std::string program = argc > 0 && argv[0][0] != '\0' ? std::filesystem::path(argv[0]).filename().string()
                                                              : std::string("gradcheck");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << program << ": " << e.what() << " (see '" << program << " --help')\n";
    return 2;
  }
  try {
    return run_gradcheck_command(suite, opts, std::cout);
  } catch (const UsageError& e) {
    std::cerr << program << ": " << e.what() << " (see '" << program << " --help')\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  }
}

int gradcheck_main(const GradcheckSuite& suite, int argc, char** argv) {
  return gradcheck_main(suite, argc, argv, {}, "Gradient checks");
}

int gradcheck_main(int argc, char** argv) { return gradcheck_main(default_gradcheck_suite(), argc, argv); }

}  // namespace xg
