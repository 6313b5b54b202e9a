// `xgrad report RUN... [--checkpoint M --prompt TEXT] [--gradcheck REPORT.json] --out report.html`:
// one self-contained HTML page about training runs: curves, the runs and their options, the
// attention weights of every layer and head for a prompt, a gradient-check report, samples and
// configuration. docs/cli.md, "xgrad report".
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/runs/report.hpp>
#include <xgrad/train/attention_report.hpp>

namespace xg::cli {

namespace {

struct ReportArgs {
  std::vector<std::string> runs;
  std::string checkpoint, prompt, gradcheck, out, title = "xgrad report";
  bool overwrite = false;
};

// compare.hpp's readers name their command ("[compare] ..."): the same failure under this one.
std::string renamed(const std::string& what) {
  const std::string from = "[compare]";
  return what.rfind(from, 0) == 0 ? "[report]" + what.substr(from.size()) : what;
}

// Runs f(), renaming compare's failures as this command's.
template <class F>
auto as_report(F f) -> decltype(f()) {
  try {
    return f();
  } catch (const UsageError& e) {
    throw UsageError(renamed(e.what()));
  } catch (const FormatError& e) {
    throw FormatError(renamed(e.what()));
  }
}

void run_report(const ReportArgs& a, const CLI::App& cmd) {
  const std::string c = "report";
  const auto usage = [&](const std::string& m) { throw UsageError(op_message(c, m)); };
  // Flags alone.
  if (cmd.count("--checkpoint") != cmd.count("--prompt"))
    usage(cmd.count("--checkpoint") ? "--checkpoint needs --prompt TEXT (the tokens whose attention is shown)"
                                    : "--prompt needs --checkpoint MODEL (the model whose attention is shown)");
  const std::filesystem::path out(a.out);
  if (out.extension() != ".html" && out.extension() != ".htm")
    usage("--out '" + a.out + "': must name an .html file");
  // The page may replace no file it reads.
  std::vector<FileRole> files{{"--out", a.out, true}};
  for (const std::string& run : a.runs) {
    as_report([&] { runs::check_run_folder(run); });
    for (const std::string& f : runs::kRunFolderFiles)
      files.push_back({"RUN's " + f, (std::filesystem::path(run) / f).string(), false});
  }
  if (!a.checkpoint.empty()) files.push_back({"--checkpoint", a.checkpoint, false});
  if (!a.gradcheck.empty()) files.push_back({"--gradcheck", a.gradcheck, false});
  check_distinct_files(c, files);
  check_new_output(c, "--out", a.out, a.overwrite);
  if (!a.gradcheck.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(a.gradcheck, ec)) usage("--gradcheck '" + a.gradcheck + "' does not exist");
    if (std::filesystem::is_directory(a.gradcheck, ec))
      usage("--gradcheck '" + a.gradcheck + "' is a folder, not an xgrad gradcheck --json report");
    io::require_input_file(a.gradcheck, "[report] --gradcheck");  // a FIFO or a device: refused by name
  }

  runs::ReportInput in;
  in.title = a.title;
  in.library = runs::load_dygraphs();  // before any work: a missing package is the first thing said
  in.runs = as_report([&] { return runs::read_runs(a.runs); });
  for (const runs::RunSummary& r : in.runs) in.outputs.push_back(runs::read_run_output(r));
  if (!a.gradcheck.empty()) in.gradcheck = runs::read_gradcheck(a.gradcheck);
  if (!a.checkpoint.empty()) in.attention = train::attention_report(a.checkpoint, a.prompt);
  const std::string page = runs::report_html(in);
  io::write_atomically(a.out, page, "[report] --out " + a.out + ": ");
  std::cout << "wrote " << a.out << " (" << page.size() / 1024 << " KiB: " << in.runs.size()
            << (in.runs.size() == 1 ? " run" : " runs");
  if (in.attention)
    std::cout << ", attention of " << in.attention->layers << " layers x " << in.attention->heads << " heads over "
              << in.attention->tokens.size() << " tokens";
  if (in.gradcheck) std::cout << ", " << in.gradcheck->checks.size() << " gradient checks";
  std::cout << ")\n";
}

}  // namespace

void add_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Write one self-contained HTML report of training runs");
  Options o(*cmd, "report");
  cmd->add_option("RUN", a->runs, "run folders (written by xgrad train --out)")->required()->type_name("DIR");
  o.add(path_flag("out", "--out", "the HTML file to write").required().type("HTML"), a->out);
  o.add(shared::checkpoint().with_help("a GPT checkpoint (or a run folder: its final model.safetensors) whose attention "
                                       "weights over --prompt are shown, every layer and head"),
        a->checkpoint);
  o.add(text_flag("prompt", "--prompt", "the prompt for --checkpoint's attention weights").type("TEXT").shown_default("-"),
        a->prompt);
  o.add(path_flag("gradcheck", "--gradcheck", "an xgrad gradcheck --json report to show as a table").type("JSON"),
        a->gradcheck);
  o.add(text_flag("title", "--title", "the page's title"), a->title);
  o.add(shared::overwrite(), a->overwrite);
  o.example("xgrad report run1 run2 --checkpoint run1 --prompt 'The ' --out report.html");
  o.on_run([a, cmd] { run_report(*a, *cmd); });
}

}  // namespace xg::cli
