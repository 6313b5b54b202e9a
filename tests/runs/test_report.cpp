// xgrad report's readers and page (runs/report.hpp): the gradcheck JSON, a run's result.txt,
// and text from run folders that must stay text inside the page's <script> (a sample or a
// label holding "</script>" may not end the data block).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/runs/report.hpp>

using namespace xg;
namespace fs = std::filesystem;

namespace {


}  // namespace

TEST_CASE("report: a gradcheck JSON report is read with its nulls and a foreign JSON is refused naming the file",
          "[report]") {
  const fs::path dir = xgt::temp_dir("report_gradcheck");
  const fs::path good = dir / "g.json";
  xgt::write_file(good, R"JSON({"tool": "xgrad gradcheck", "dtype": "float64",
    "tolerances": {"eps": 1e-6, "atol": 1e-5, "rtol": 1e-3},
    "checks": [{"check": "ops/add", "kind": "gradient", "configuration": "a (2)", "max_abs_error": 1.5e-10,
                "max_rel_error": null, "worst_element": "a[1]", "status": "passed", "message": ""},
               {"check": "ops/div", "kind": "gradient", "configuration": "", "max_abs_error": null,
                "max_rel_error": 0.5, "worst_element": "b[0]", "status": "failed", "message": "too far"}]})JSON");
  const runs::GradcheckReport r = runs::read_gradcheck(good.string());
  REQUIRE(r.checks.size() == 2);
  CHECK(r.dtype == "float64");
  CHECK(r.atol == 1e-5);
  CHECK(r.rtol == 1e-3);
  CHECK(r.checks[0].check == "ops/add");
  CHECK(r.checks[0].max_abs_error == 1.5e-10);
  CHECK_FALSE(r.checks[0].max_rel_error.has_value());
  CHECK(r.checks[1].status == "failed");
  CHECK_FALSE(r.checks[1].max_abs_error.has_value());
  CHECK(r.checks[1].worst_element == "b[0]");

  const fs::path not_json = dir / "n.json";
  xgt::write_file(not_json, "step,lr\n");
  CHECK_THROWS_WITH(runs::read_gradcheck(not_json.string()),
                    Catch::Contains("n.json") && Catch::Contains("not JSON"));
  const fs::path foreign = dir / "f.json";
  xgt::write_file(foreign, R"({"lr": 0.01})");
  CHECK_THROWS_AS(runs::read_gradcheck(foreign.string()), FormatError);
  const fs::path bad_status = dir / "s.json";
  xgt::write_file(bad_status, R"({"tool": "xgrad gradcheck", "checks": [{"check": "x", "status": "maybe"}]})");
  CHECK_THROWS_WITH(runs::read_gradcheck(bad_status.string()), Catch::Contains("checks[0]") && Catch::Contains("maybe"));
  CHECK(r.order == 1);  // a report without "order" is first order
  // An --order 2 report: its order and a skipped check are read.
  const fs::path order2 = dir / "o2.json";
  xgt::write_file(order2, R"({"tool": "xgrad gradcheck", "dtype": "float64", "order": 2,
    "checks": [{"check": "invariants/x", "status": "skipped", "message": "no second-order form"}]})");
  const runs::GradcheckReport r2 = runs::read_gradcheck(order2.string());
  CHECK(r2.order == 2);
  REQUIRE(r2.checks.size() == 1);
  CHECK(r2.checks[0].status == "skipped");
  CHECK(r2.checks[0].message == "no second-order form");
  const fs::path order3 = dir / "o3.json";
  xgt::write_file(order3, R"({"tool": "xgrad gradcheck", "order": 3, "checks": []})");
  CHECK_THROWS_WITH(runs::read_gradcheck(order3.string()), Catch::Contains("o3.json") && Catch::Contains("order"));
}

TEST_CASE("report: result.txt gives the samples and the RESULT lines and a run without it has none", "[report]") {
  const fs::path dir = xgt::temp_dir("report_result");
  runs::RunSummary run;
  run.dir = dir.string();
  run.options = {{"lr", "0.01"}, {"task", "sort"}};
  runs::RunOutput none = runs::read_run_output(run);
  CHECK_FALSE(none.samples.has_value());
  CHECK(none.result_lines.empty());
  CHECK(none.config_json.find("\"lr\": \"0.01\"") != std::string::npos);  // the options (text), as JSON
  xgt::write_file(dir / "result.txt", "samples:\n  1234| -> 1234  (right)\n  4321| -> 1234  (right)\n"
                                 "RESULT best_val_loss 0.5 step 10\nRESULT heldout_exact_match 1\n");
  const runs::RunOutput out = runs::read_run_output(run);
  REQUIRE(out.samples.has_value());
  CHECK(*out.samples == "  1234| -> 1234  (right)\n  4321| -> 1234  (right)\n");
  CHECK(out.result_lines ==
        std::vector<std::string>{"RESULT best_val_loss 0.5 step 10", "RESULT heldout_exact_match 1"});
}

TEST_CASE("report: samples.jsonl gives the samples at every evaluation and a bad line is refused naming it",
          "[report]") {
  const fs::path dir = xgt::temp_dir("report_eval_samples");
  runs::RunSummary run;
  run.dir = dir.string();
  CHECK(runs::read_run_output(run).eval_samples.empty());  // no file: none
  // A last line without its line end (a kill cut it) is left out.
  xgt::write_file(dir / "samples.jsonl", "{\"step\": 10, \"text\": \"Once|upon\"}\n{\"step\": 20, \"text\": \"a\\nb\"}\n"
                                          "{\"step\": 30, \"te");
  const runs::RunOutput out = runs::read_run_output(run);
  REQUIRE(out.eval_samples.size() == 2);
  CHECK(out.eval_samples[0] == std::pair<std::int64_t, std::string>{10, "Once|upon"});
  CHECK(out.eval_samples[1] == std::pair<std::int64_t, std::string>{20, "a\nb"});
  for (const std::string& bad : {std::string("{\"step\": -1, \"text\": \"x\"}\n"), std::string("{\"step\": 1}\n"),
                                 std::string("{\"step\": 1, \"text\": 2}\n"), std::string("not json\n")}) {
    xgt::write_file(dir / "samples.jsonl", "{\"step\": 10, \"text\": \"ok\"}\n" + bad);
    CHECK_THROWS_WITH(runs::read_run_output(run), Catch::Contains("samples.jsonl:2"));
  }
}

TEST_CASE("report: text from a run folder cannot end the page's data script", "[report]") {
  runs::ReportInput in;
  runs::RunSummary run;
  run.dir = "x";
  run.label = "a</script><b>run";
  runs::LogRow row;
  row.step = 1;
  row.loss = 2.0;
  run.log.rows = {row};
  run.steps = 1;
  run.sessions = 1;
  in.runs = {run};
  runs::RunOutput out;
  out.samples = std::string("</script><script>document.title='x'</script>\n");
  out.config_json = "{}";
  in.outputs = {out};
  in.library = {"/* Dygraph */", "/* css */"};
  const std::string page = runs::report_html(in);
  // The page's own tags: 3 scripts (data, library, page). The run's text is escaped inside.
  std::size_t scripts = 0;
  for (std::size_t at = page.find("</script"); at != std::string::npos; at = page.find("</script", at + 1)) ++scripts;
  CHECK(scripts == 3);
  CHECK(page.find("a\\u003c/script\\u003e\\u003cb\\u003erun") != std::string::npos);
  CHECK(page.find("<script src") == std::string::npos);
}

TEST_CASE("report: a deeply nested --gradcheck file is a FormatError naming the limit and not a crash", "[report]") {
  const fs::path dir = xgt::temp_dir("report_nested");
  const fs::path deep = dir / "deep.json";
  xgt::write_file(deep, std::string(500000, '[') + std::string(500000, ']'));
  CHECK_THROWS_AS(runs::read_gradcheck(deep.string()), FormatError);
  CHECK_THROWS_WITH(runs::read_gradcheck(deep.string()),
                    Catch::Contains("deep.json") && Catch::Contains("nesting deeper than 64"));
  // Inside a report's shape, where the reader shows a field's JSON (which recursed and crashed
  // with signal 11 at this depth).
  const fs::path inner = dir / "inner.json";
  xgt::write_file(inner, R"({"tool": "xgrad gradcheck", "checks": [{"check": "x", "status": "passed", "kind": )" +
                             std::string(200000, '[') + std::string(200000, ']') + "}]}");
  CHECK_THROWS_WITH(runs::read_gradcheck(inner.string()), Catch::Contains("nesting deeper than 64"));
}
