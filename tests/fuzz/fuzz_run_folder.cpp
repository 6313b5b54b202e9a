// libFuzzer target: the run folder readers of `xgrad compare` and `xgrad report`
// (runs/compare.cpp: read_run, read_log; runs/report.cpp: read_run_output, read_gradcheck) on
// arbitrary files, then the table, the JSON document and the HTML page made from what they read.
//
// The input is split at the line "=====" (kSeparator) into the folder's files, in this order:
// log.csv, config.json, run_id.txt, result.txt, samples.jsonl, a gradcheck report and
// train_state.safetensors (last: its binary header may hold any bytes). A missing or empty part
// leaves its file out, but log.csv and train_state.safetensors are then empty files
// (check_run_folder wants both). Any outcome but success or an xg::Error is a finding, and
// so is a page whose inlined data holds a '<' (it could end its <script> element).
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>
#include <unistd.h>

#include <xgrad/core/error.hpp>
#include <xgrad/runs/compare.hpp>
#include <xgrad/runs/report.hpp>
#include "fuzz_input.hpp"

namespace {

namespace fs = std::filesystem;

const char* const kFiles[] = {"log.csv",       "config.json",    "run_id.txt",
                              "result.txt",    "samples.jsonl",  "gradcheck.json",
                              "train_state.safetensors"};
constexpr std::size_t kParts = sizeof(kFiles) / sizeof(kFiles[0]);
constexpr std::size_t kGradcheck = 5, kState = 6;
const std::string kSeparator = "\n=====\n";

// This process's folder, removed when the fuzzer exits (its runs end with exit()).
struct Folder {
  fs::path path = fs::temp_directory_path() / ("xgrad_fuzz_run_folder_" + std::to_string(::getpid()));
  pid_t owner = ::getpid();
  ~Folder() {
    std::error_code ec;
    if (::getpid() == owner) fs::remove_all(path, ec);
  }
};

// The page's inlined JSON must hold no '<': script_safe escapes every one.
void check_page(const std::string& page) {
  const std::string open = "<script id=\"report-data\" type=\"application/json\">";
  const std::size_t start = page.find(open);
  if (start == std::string::npos) __builtin_trap();
  const std::size_t end = page.find("</script>", start + open.size());
  if (end == std::string::npos) __builtin_trap();
  if (page.find('<', start + open.size()) != end) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Folder folder;
  std::error_code ec;
  fs::remove_all(folder.path, ec);
  if (!fs::create_directories(folder.path, ec)) return 0;
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts(kParts);
  std::size_t from = 0;
  for (std::size_t k = 0; k < kParts && from <= input.size(); ++k) {
    const std::size_t at = k + 1 < kParts ? input.find(kSeparator, from) : std::string::npos;
    parts[k] = input.substr(from, at == std::string::npos ? std::string::npos : at - from);
    from = at == std::string::npos ? input.size() + 1 : at + kSeparator.size();
  }
  for (std::size_t k = 0; k < kParts; ++k) {
    const bool required = k == 0 || k == kState;
    if ((required || !parts[k].empty()) &&
        !xgfuzz::write_file((folder.path / kFiles[k]).string(), parts[k].data(), parts[k].size()))
      return 0;
  }
  using namespace xg::runs;
  std::optional<GradcheckReport> gradcheck;
  try {
    if (!parts[kGradcheck].empty()) gradcheck = read_gradcheck((folder.path / kFiles[kGradcheck]).string());
  } catch (const xg::Error&) {
  }
  try {
    RunSummary run = read_run(folder.path.string());
    // What read_log promises: steps 1..N, finite numbers in the first six columns.
    for (std::size_t r = 0; r < run.log.rows.size(); ++r) {
      const LogRow& row = run.log.rows[r];
      if (row.step != static_cast<std::int64_t>(r) + 1) __builtin_trap();
      for (double v : {row.lr, row.loss, row.grad_norm, row.tokens_per_s, row.elapsed_s})
        if (!std::isfinite(v)) __builtin_trap();
    }
    if (run.log.rows.empty() || run.steps != run.log.rows.back().step) __builtin_trap();
    ReportInput input;
    input.outputs.push_back(read_run_output(run));
    input.runs.push_back(run);
    (void)compare_table(input.runs);
    (void)compare_json(input.runs, CompareX::step, nullptr, default_y(input.runs));
    for (CompareX x : {CompareX::tokens, CompareX::bytes}) {
      try {
        check_x_axis(input.runs, x);
        (void)compare_json(input.runs, x, nullptr);
      } catch (const xg::Error&) {
      }
    }
    input.gradcheck = gradcheck;
    input.library = {"var Dygraph = function() {};", ".dygraph-legend {}"};
    check_page(report_html(input));
  } catch (const xg::Error&) {
  }
  return 0;
}
