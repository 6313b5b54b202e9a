// `xgrad visibility --out DIR`: draws visibility patterns from the mask builders themselves:
// causal (T = S) and document-causal (block-diagonal) packing, as in Figure 5.1, and causal for
// a suffix of queries over a cached prefix (bottom-right aligned), which illustrates (5.12). Each picture has
// a title, query/key position axes labelled with absolute positions, a legend, and masked
// cells grey; its gnuplot script is written beside it (docs/cli.md).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/nn/visibility.hpp>
#include <xgrad/runs/plots.hpp>

namespace xg::cli {

namespace {

std::vector<std::string> positions(std::size_t from, std::size_t n, const std::string& suffix = "") {
  std::vector<std::string> p;
  for (std::size_t i = 0; i < n; ++i) p.push_back(std::to_string(from + i) + (suffix.empty() ? "" : suffix.substr(i, 1)));
  return p;
}

}  // namespace

void add_visibility(CLI::App& app) {
  auto out = std::make_shared<std::string>("out");
  auto overwrite = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("visibility", "Draw causal and document-causal visibility patterns (Figure 5.1) and a causal suffix ((5.12))");
  Options o(*cmd, "visibility");
  o.add(text_flag("out", "--out", "output folder (created if missing)").type("DIR"), *out);
  o.add(shared::overwrite().with_help("replace the pictures and scripts of an earlier run in --out"), *overwrite);
  o.example("xgrad visibility --out pictures");
  o.on_run([out, overwrite] {
    namespace fs = std::filesystem;
    check_output_folder("visibility", "--out", *out);
    for (const char* f : {"causal.png", "causal.gp", "causal_suffix.png", "causal_suffix.gp", "documents.png", "documents.gp"})
      if (fs::exists(fs::path(*out) / f) && !*overwrite)
        throw UsageError(op_message("visibility", "--out '" + *out + "': " + f +
                                                      " exists (an earlier run's); pass --overwrite to replace it"));
    std::error_code ec;
    fs::create_directories(*out, ec);
    if (ec) throw UsageError(op_message("visibility", "--out '" + *out + "': cannot create the folder: " + ec.message()));
    struct Pattern {
      std::string file;
      nn::Visibility v;
      std::size_t T, S;
      runs::HeatmapLabels labels;
      std::string what;
    };
    // Documents A (positions 0-2), B (3-4), C (5-7): labels carry the document's letter.
    const std::string docs = "AAABBCCC";
    const std::vector<Pattern> patterns = {
        {"causal.png", nn::Visibility::causal(8, 8), 8, 8,
         {"causal visibility: 8 queries x 8 keys\nquery i sees keys 0..i", "key position", "query position",
          positions(0, 8), positions(0, 8)},
         "causal, 8 queries x 8 keys"},
        {"causal_suffix.png", nn::Visibility::causal(3, 8), 3, 8,
         {"causal visibility of 3 new queries over 8 cached keys\nbottom-right aligned: query at position p sees keys 0..p",
          "key position", "query position", positions(0, 8), positions(5, 3)},
         "causal, 3 new queries (positions 5-7) over 8 keys: bottom-right aligned"},
        {"documents.png", nn::Visibility::documents(IndexArray{0, 0, 0, 1, 1, 2, 2, 2}), 8, 8,
         {"document-causal visibility: documents A, B, C packed in one row\ncausal inside each document, nothing "
          "across",
          "key position (document)", "query position (document)", positions(0, 8, docs), positions(0, 8, docs)},
         "document-causal, documents of lengths 3, 2, 3 packed in one row"},
    };
    std::string skipped;
    for (const Pattern& p : patterns) {
      const std::string path = (fs::path(*out) / p.file).string();
      const runs::Picture pic = runs::visibility_png(p.v.expand_allowed("visibility_png", {1, 1, p.T, p.S}), p.T, p.S, p.labels, path);
      if (pic.drawn) {
        std::cout << path << " (" << pic.size.width << "x" << pic.size.height << "): " << p.what << "\n";
      } else {
        std::cout << pic.script << " (gnuplot script only): " << p.what << "\n";
        skipped += (skipped.empty() ? "" : ", ") + p.file;
      }
    }
    if (!skipped.empty())
      warn("gnuplot not found on PATH: skipped " + skipped + " (their .gp scripts are in " + *out +
           "; install gnuplot-nox and run gnuplot on them there)");
  });
}

}  // namespace xg::cli
