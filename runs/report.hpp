/// \file
/// `xgrad report`: one self-contained HTML page about training runs (docs/cli.md, "xgrad
/// report"): their curves (dygraphs, inlined from the Debian package libjs-dygraphs), a table
/// of the runs and their options, every layer's and head's attention weights of a checkpoint
/// for a prompt, an `xgrad gradcheck --json` report as a sortable table, the samples and the
/// RESULT lines the runs printed, and their configuration as JSON. The runs are read as
/// `xgrad compare` reads them (compare.hpp); the page needs no network and no server.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/runs/compare.hpp>

namespace xg::runs {

/// Where libjs-dygraphs installs the minified library (Debian 12: 2.2.1); its style sheet is
/// beside it (dygraph.min.css).
extern const char* const kDygraphsPath;

/// The plotting library, as inlined into the page.
struct PlotLibrary {
  std::string js;   ///< dygraph.min.js, without its source-map comment (the page loads nothing).
  std::string css;  ///< dygraph.min.css, the same.
};

/// Reads the plotting library: the file named by the environment variable XGRAD_DYGRAPHS_JS
/// when set, else kDygraphsPath, and the .css beside it. UsageError naming the file and the
/// package (`apt-get install libjs-dygraphs`, or scripts/setup.sh) when either cannot be read
/// or is not the library (the script must define Dygraph; neither may hold `</script` or
/// `</style`).
PlotLibrary load_dygraphs();

/// Every layer's and head's attention weights of a GPT checkpoint over a prompt.
struct AttentionReport {
  std::string checkpoint;           ///< The checkpoint file.
  std::string prompt;               ///< The prompt as given.
  std::vector<std::string> tokens;  ///< Each prompt token's label (tick_label of its text).
  std::size_t layers = 0;           ///< The model's layers.
  std::size_t heads = 0;            ///< Query heads per layer.
  std::size_t kv_heads = 0;         ///< Key/value heads per layer.
  /// weights[layer * heads + head]: the T x T weights, row-major (query rows, key columns).
  std::vector<std::vector<double>> weights;
  /// allowed[layer]: the T x T cells the layer lets a query see (causal, and its sliding window).
  std::vector<std::vector<unsigned char>> allowed;
  std::vector<std::size_t> windows;  ///< Each layer's sliding window (0: none).
};


/// One check of an `xgrad gradcheck --json` report.
struct GradcheckRow {
  std::string check;          ///< The check's name, e.g. "ops/softmax".
  std::string kind;           ///< "gradient", "reference", "invariant", ...
  std::string configuration;  ///< Its one-line configuration.
  std::string status;         ///< "passed", "failed" or "skipped" (no form at the run's `--order`).
  std::string message;        ///< Details (empty when it passed).
  std::string worst_element;  ///< Where the error is largest, e.g. "x[1, 2]".
  std::string mode;           ///< "full", "projection", "property", "mixed" or "error".
  std::optional<double> max_abs_error;  ///< Empty: null in the report (NaN, inf or not applicable).
  std::optional<double> max_rel_error;  ///< Empty: null in the report (NaN, inf or not applicable).
};

/// An `xgrad gradcheck --json` report (checks/suite.cpp, report_json).
struct GradcheckReport {
  std::string path;   ///< The file it was read from.
  std::string dtype;  ///< The precision of the run: "float64" or "float32".
  int order = 1;      ///< The derivative order checked (`--order`; 1 for reports without the field).
  double atol = 0;    ///< The absolute tolerance the checks were run with.
  double rtol = 0;    ///< The relative tolerance the checks were run with.
  double eps = 0;     ///< The relative finite-difference step.
  std::vector<GradcheckRow> checks;    ///< In the report's order.
};

/// Reads an `xgrad gradcheck --json` report. FormatError naming the file for text that is not
/// JSON, or JSON without the report's members (tool, tolerances, checks with check and status).
GradcheckReport read_gradcheck(const std::string& path);

/// What a run printed at its end (its samples and RESULT lines), from the run folder's
/// result.txt (written by xgrad train when a run finishes, since this command exists); empty for a run that has
/// none (older, or still training).
struct RunOutput {
  std::optional<std::string> samples;      ///< The text after "samples:" up to the next report line.
  std::vector<std::string> result_lines;   ///< The lines starting "RESULT ".
  std::string config_json;                 ///< config.json's text, or the options as a JSON object.
  /// The samples written at every evaluation (samples.jsonl: step and text), in the file's order.
  std::vector<std::pair<std::int64_t, std::string>> eval_samples;
};

/// Reads a run's result.txt (when it has one), samples.jsonl (when it has one; a last line
/// without its line end, cut by a kill, is left out; FormatError naming `file:line` for a line
/// that is not {"step": S, "text": "..."}) and config.json (or renders its options).
RunOutput read_run_output(const RunSummary& run);

/// Everything the page shows.
struct ReportInput {
  std::vector<RunSummary> runs;                ///< The runs, in the order given.
  std::vector<RunOutput> outputs;              ///< One per run.
  std::optional<AttentionReport> attention;    ///< With --checkpoint and --prompt.
  std::optional<GradcheckReport> gradcheck;    ///< With --gradcheck.
  PlotLibrary library;                         ///< load_dygraphs()'s text.
  std::string title = "xgrad report";          ///< The page's title.
};

/// The HTML page: one file, the data inlined as JSON, the library and the page's own script
/// and style inline.
std::string report_html(const ReportInput& input);

}  // namespace xg::runs
