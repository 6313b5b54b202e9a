// `xgrad compare RUN... [--out cmp.png] [--json FILE|-] [--x step|tokens|bytes]
// [--y val_bpb|val_loss|loss]`: several training
// runs side by side: the table of their results and differing options on stdout, their loss
// curves on one picture (--out) and everything as JSON (--json). docs/cli.md, "xgrad compare".
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/runs/compare.hpp>

namespace xg::cli {

namespace {

struct CompareArgs {
  std::vector<std::string> runs;
  std::string out, json_path, x = "step", y = "auto";  // auto: default_y
  bool overwrite = false;
};

void run_compare(const CompareArgs& a) {
  const std::string cmd = "compare";
  // Outputs first, before any run is read: never one of a run's own files, writable, and not
  // replacing a file that exists without --overwrite.
  std::vector<FileRole> files;
  std::string script;
  if (!a.out.empty()) {
    const std::filesystem::path p(a.out);
    if (p.extension() == ".gp")
      throw UsageError(op_message(cmd, "--out '" + a.out + "': the picture would be overwritten by its own gnuplot script; name a .png"));
    script = std::filesystem::path(a.out).replace_extension(".gp").string();
    files.push_back({"--out", a.out, true});
    files.push_back({"--out's gnuplot script", script, true});
  }
  if (!a.json_path.empty() && a.json_path != "-") files.push_back({"--json", a.json_path, true});
  for (const std::string& run : a.runs) {
    runs::check_run_folder(run);
    for (const std::string& f : runs::kRunFolderFiles)
      files.push_back({"RUN's " + f, (std::filesystem::path(run) / f).string(), false});
  }
  check_distinct_files(cmd, files);
  check_new_output(cmd, "--out", a.out, a.overwrite);
  check_new_output(cmd, "--out's gnuplot script", script, a.overwrite);
  check_new_output(cmd, "--json", a.json_path, a.overwrite);

  const runs::CompareX x = a.x == "tokens" ? runs::CompareX::tokens
                           : a.x == "bytes"  ? runs::CompareX::bytes
                                             : runs::CompareX::step;
  const std::vector<runs::RunSummary> runs = runs::read_runs(a.runs);
  const runs::CompareY y = a.y == "loss"       ? runs::CompareY::loss
                           : a.y == "val_loss" ? runs::CompareY::val_loss
                           : a.y == "val_bpb"  ? runs::CompareY::val_bpb
                                               : runs::default_y(runs);
  // The picture's axes must be known for every run (a UsageError), before anything is written;
  // an axis asked for explicitly also without a picture.
  if (!a.out.empty() || a.x != "step") runs::check_x_axis(runs, x);
  if (a.y != "auto") runs::check_y_axis(runs, y);

  const bool table = a.json_path != "-";
  if (table) std::cout << runs::compare_table(runs) << std::flush;
  runs::Picture pic;
  if (!a.out.empty()) {
    pic = runs::compare_png(runs, a.out, x, y);
    if (!pic.drawn)
      warn(pic.note);
    else if (table)
      std::cout << "\nwrote " << pic.png << " (" << pic.size.width << " x " << pic.size.height << "; script "
                << pic.script << ")\n";
  }
  if (!a.json_path.empty())
    write_json(cmd, "--json", a.json_path, runs::compare_json(runs, x, a.out.empty() ? nullptr : &pic, y));
}

}  // namespace

void add_compare(CLI::App& app) {
  auto a = std::make_shared<CompareArgs>();
  CLI::App* cmd = app.add_subcommand("compare", "Compare training runs: results, differing options, loss curves");
  Options o(*cmd, "compare");
  cmd->add_option("RUN", a->runs, "run folders (written by xgrad train --out)")->required()->type_name("DIR");
  o.add(path_flag("out", "--out", "draw the runs' loss curves to this PNG (its gnuplot script beside it)").type("PNG"),
        a->out);
  o.add(shared::json().with_help("also write the comparison as JSON to FILE ('-': stdout, and nothing else there)"),
        a->json_path);
  o.add(text_flag("x", "--x",
                  "the picture's x axis: step, tokens (tokens seen) or bytes (tokens seen x the validation text's "
                  "bytes per token)")
            .one_of({"step", "tokens", "bytes"}),
        a->x);
  o.add(text_flag("y", "--y",
                  "the picture's y axis: val_bpb (validation bits per byte), val_loss (validation loss over the "
                  "training loss), loss (training loss) or auto: val_bpb when the runs' tokenizers differ and all "
                  "have it, else val_loss")
            .one_of({"auto", "val_bpb", "val_loss", "loss"}),
        a->y);
  o.add(shared::overwrite(), a->overwrite);
  o.example("xgrad compare run1 run2 --out cmp.png --json -");
  o.on_run([a] { run_compare(*a); });
}

}  // namespace xg::cli
