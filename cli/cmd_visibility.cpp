// `xgrad visibility --out DIR`: renders visibility patterns from the mask builders themselves:
// causal (T = S) and document-causal (block-diagonal) packing, as in Figure 5.1, and causal for
// a suffix of queries over a cached prefix (bottom-right aligned), which illustrates (5.12).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/nn/visibility.hpp>
#include <xgrad/train/plots.hpp>

namespace xg::cli {

void add_visibility(CLI::App& app) {
  auto out = std::make_shared<std::string>("out");
  CLI::App* cmd = app.add_subcommand("visibility", "Draw causal and document-causal visibility patterns (Figure 5.1) and a causal suffix ((5.12))");
  cmd->add_option("--out", *out, "output directory")->capture_default_str();
  cmd->callback([out] {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (out->empty()) throw UsageError(op_message("visibility", "--out must name a folder, got ''"));
    if (fs::exists(*out, ec) && !fs::is_directory(*out, ec))
      throw UsageError(op_message("visibility", "--out " + *out + " exists and is not a directory"));
    if (!fs::create_directories(*out, ec) && ec)
      throw Error(op_message("visibility", "--out " + *out + ": cannot create the folder: " + ec.message()));
    struct Pattern {
      std::string file;
      nn::Visibility v;
      std::size_t T, S;
      std::string what;
    };
    const std::vector<Pattern> patterns = {
        {"causal.png", nn::Visibility::causal(8, 8), 8, 8, "causal, 8 queries x 8 keys"},
        {"causal_suffix.png", nn::Visibility::causal(3, 8), 3, 8,
         "causal, 3 new queries (positions 5-7) over 8 keys: bottom-right aligned"},
        {"documents.png", nn::Visibility::documents(IndexArray{0, 0, 0, 1, 1, 2, 2, 2}), 8, 8,
         "document-causal, documents of lengths 3, 2, 3 packed in one row"},
    };
    for (const Pattern& p : patterns) {
      const std::string path = (fs::path(*out) / p.file).string();
      const auto size = train::visibility_png(p.v, p.T, p.S, path);
      std::cout << path << " (" << size.width << "x" << size.height << "): " << p.what << "\n";
    }
  });
}

}  // namespace xg::cli
