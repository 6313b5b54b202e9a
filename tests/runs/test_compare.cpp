// `xgrad compare` (runs/compare.cpp) on run folders written by hand: log.csv and a
// train_state.safetensors whose header carries the options (bytes written here, not by
// xgrad's writer). Final and best validation loss and bits per byte, tokens seen, wall time
// over resumed sessions, labels of clashing folder names, the same run given twice, differing
// options, the table, the JSON document, the gnuplot script; also the header-only safetensors
// reader and the JSON writer's indented form that compare uses.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/helpers.hpp"
#include <xgrad/io/detail/json.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/runs/compare.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {


// A safetensors file by hand: one F32 tensor "w" of shape [2] (values 1, 2) and `meta` as
// __metadata__ (keys and values without characters that need escaping).
std::string safetensors_bytes(const std::map<std::string, std::string>& meta, std::size_t trailing = 0) {
  std::string header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : meta) {
    header += (first ? "\"" : ",\"") + k + "\":\"" + v + "\"";
    first = false;
  }
  header += "}}";
  std::string bytes(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  bytes += header;
  const float data[2] = {1.0f, 2.0f};
  bytes.append(reinterpret_cast<const char*>(data), sizeof data);
  bytes.append(trailing, '\0');
  return bytes;
}

std::map<std::string, std::string> sort_options(const std::string& lr = "0.0030000000000000001") {
  return {{"opt.task", "sort"}, {"opt.batch", "8"}, {"opt.n_digits", "4"}, {"opt.lr", lr}, {"opt.seed", "1"},
          {"step", "40"}, {"xgrad_version", "0.2.0"}};
}

const char* const kHeader = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss";

// The six first fields of a log row as the trainer writes them: tokens_per_s =
// tokens_per_step * (steps into the session) / elapsed_s, both with 6 significant digits.
std::string base_row(int step, double loss, int in_session, double elapsed, double tokens_per_step) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%d,0.001,%.17g,0.5,%g,%g", step, loss, tokens_per_step * in_session / elapsed, elapsed);
  return buf;
}

// A row of a log with val_loss (`val`, maybe empty) and `extra` after it.
std::string row(int step, double loss, int in_session, double elapsed, double tokens_per_step,
                const std::string& val = "", const std::string& extra = "") {
  return base_row(step, loss, in_session, elapsed, tokens_per_step) + "," + val + extra + "\n";
}

// A run folder `dir` with this log text and state metadata (and run_id.txt when `id` is set).
void make_run(const fs::path& dir, const std::string& log, const std::map<std::string, std::string>& meta,
              const std::string& id = "") {
  fs::create_directories(dir);
  write_file(dir / "log.csv", log);
  write_file(dir / "train_state.safetensors", safetensors_bytes(meta));
  if (!id.empty()) write_file(dir / "run_id.txt", id + "\n");
}

// 40 steps of the sort task (64 tokens per step): steps 1-25 in a first session (elapsed
// 0.1 .. 2.5 s), steps 26-40 after a resume (elapsed restarts: 0.2 .. 3.0 s); validation loss
// at steps 10 (2.0), 20 (1.5), 30 (1.75), 40 (1.625); training loss 3 - step/20 but 1.25 and
// 1.75 at the last two steps.
std::string resumed_log() {
  std::string log = std::string(kHeader) + "\n";
  const std::map<int, std::string> val = {{10, "2"}, {20, "1.5"}, {30, "1.75"}, {40, "1.625"}};
  for (int s = 1; s <= 40; ++s) {
    const double loss = s == 39 ? 1.25 : s == 40 ? 1.75 : 3.0 - s / 20.0;
    const bool first = s <= 25;
    const int in_session = first ? s : s - 25;
    const double elapsed = first ? 0.1 * s : 0.2 * (s - 25);
    log += row(s, loss, in_session, elapsed, 64, val.count(s) ? val.at(s) : "");
  }
  return log;
}

}  // namespace

TEST_CASE("compare: a run's final and best validation loss plus tokens seen and wall time summed over a resume",
          "[compare]") {
  const fs::path dir = temp_dir("compare_values");
  make_run(dir / "A", resumed_log(), sort_options(), "0123456789abcdef0123456789abcdef");
  const runs::RunSummary r = runs::read_run((dir / "A").string());
  CHECK(r.label == "A");
  CHECK(r.run_id == "0123456789abcdef0123456789abcdef");
  CHECK(r.options_source == "train_state.safetensors");
  CHECK(r.options.at("task") == "sort");
  CHECK(r.options.at("lr") == "0.0030000000000000001");
  CHECK(r.options.count("step") == 0);  // metadata that is not an opt.* key is not an option
  CHECK(r.steps == 40);
  REQUIRE(r.tokens_per_step);
  CHECK(*r.tokens_per_step == 8 * 2 * 4);
  REQUIRE(r.tokens);
  CHECK(*r.tokens == 40 * 64);
  CHECK(r.sessions == 2);
  CHECK(r.wall_s == Approx(2.5 + 3.0).epsilon(1e-12));
  CHECK(r.final_train_loss == Approx((1.25 + 1.75) / 2).epsilon(1e-12));  // 5% of 40 rows: the last 2
  REQUIRE(r.final_val_loss);
  CHECK(*r.final_val_loss == 1.625);
  REQUIRE(r.best_val_loss);
  CHECK(*r.best_val_loss == 1.5);
  CHECK(r.best_val_step == 20);
  CHECK_FALSE(r.final_val_bpb);  // this log has no val_bpb column
  CHECK_FALSE(r.best_val_bpb);
  fs::remove_all(dir);
}

TEST_CASE("compare: a resumed session whose first step outlasts the whole session before it still counts",
          "[compare]") {
  // Session 1: 3 fast steps (0.01 .. 0.03 s); session 2 starts with a slow step (0.5 s), so
  // elapsed_s never decreases: only tokens_per_s * elapsed_s = one step's tokens marks it.
  std::string log = std::string(kHeader) + "\n";
  log += row(1, 2.0, 1, 0.01, 64) + row(2, 2.0, 2, 0.02, 64) + row(3, 2.0, 3, 0.03, 64);
  log += row(4, 2.0, 1, 0.5, 64) + row(5, 2.0, 2, 0.6, 64) + row(6, 2.0, 3, 0.7, 64);
  const fs::path dir = temp_dir("compare_slow_resume");
  make_run(dir / "A", log, sort_options());
  const runs::RunSummary r = runs::read_run((dir / "A").string());
  CHECK(r.sessions == 2);
  CHECK(r.wall_s == Approx(0.03 + 0.7).epsilon(1e-12));
  // Without the tokens per step, only a clock that goes back marks a session.
  CHECK(runs::session_starts(r.log.rows, std::nullopt) == std::vector<std::size_t>{0});
  CHECK(runs::session_starts(r.log.rows, 64) == std::vector<std::size_t>{0, 3});
  fs::remove_all(dir);
}

TEST_CASE("compare: validation bits per byte are read from a val_bpb column and the best from the best loss's row",
          "[compare]") {
  std::string log = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_bpb\n";
  log += row(1, 3.0, 1, 0.1, 256, "2.5", ",3.5");
  log += row(2, 2.0, 2, 0.2, 256, "", ",");
  log += row(3, 1.5, 3, 0.3, 256, "1.25", ",1.75");
  log += row(4, 1.5, 4, 0.4, 256, "1.5", ",2.25");
  const fs::path dir = temp_dir("compare_bpb");
  make_run(dir / "T", log, {{"opt.task", "text"}, {"opt.batch", "4"}, {"opt.context", "64"}});
  const runs::RunSummary r = runs::read_run((dir / "T").string());
  CHECK(r.log.val_bpb_column == 8);
  CHECK(*r.tokens_per_step == 4 * 64);
  CHECK(*r.final_val_loss == 1.5);
  CHECK(*r.final_val_bpb == 2.25);
  CHECK(*r.best_val_loss == 1.25);
  CHECK(r.best_val_step == 3);
  CHECK(*r.best_val_bpb == 1.75);
  CHECK_THAT(runs::compare_table({r}), Catch::Contains("val bpb") && Catch::Contains("2.2500") &&
                                            Catch::Contains("1.7500"));
  fs::remove_all(dir);
}

TEST_CASE("compare: a log of the six-column format has no validation loss / old and unknown tasks",
          "[compare]") {
  const fs::path dir = temp_dir("compare_old");
  std::string log = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s\n";
  for (int s = 1; s <= 3; ++s) log += base_row(s, 1.0 * s, s, 0.1 * s, 8 * 17) + "\n";
  make_run(dir / "R", log, {{"opt.task", "reverse"}, {"opt.batch", "8"}, {"opt.max_len", "8"}});
  const runs::RunSummary r = runs::read_run((dir / "R").string());
  CHECK(r.log.val_loss_column == 0);
  CHECK_FALSE(r.final_val_loss);
  CHECK_FALSE(r.best_val_loss);
  CHECK(r.best_val_step == 0);
  CHECK(*r.tokens_per_step == 8 * (2 * 8 + 1));
  CHECK(r.final_train_loss == 3.0);  // 5% of 3 rows, rounded up: the last one

  make_run(dir / "C", std::string(kHeader) + "\n" + row(1, 1.0, 1, 0.1, 10), {{"opt.task", "charlm"}, {"opt.batch", "2"}, {"opt.context", "5"}});
  CHECK(*runs::read_run((dir / "C").string()).tokens_per_step == 10);
  // A task compare does not know, or a missing size: tokens unknown (and --x tokens refused).
  make_run(dir / "U", std::string(kHeader) + "\n" + row(1, 1.0, 1, 0.1, 10), {{"opt.task", "future"}, {"opt.batch", "2"}});
  make_run(dir / "M", std::string(kHeader) + "\n" + row(1, 1.0, 1, 0.1, 10), {{"opt.task", "sort"}, {"opt.batch", "2"}});
  for (const char* name : {"U", "M"}) {
    const runs::RunSummary u = runs::read_run((dir / name).string());
    CHECK_FALSE(u.tokens_per_step);
    CHECK_FALSE(u.tokens);
    CHECK_NOTHROW(runs::check_x_axis({u}, runs::CompareX::step));
    CHECK_THROWS_AS(runs::check_x_axis({u}, runs::CompareX::tokens), UsageError);
  }
  CHECK_THROWS_WITH(runs::check_x_axis({runs::read_run((dir / "U").string())}, runs::CompareX::tokens),
                    Catch::Contains("--x tokens") && Catch::Contains("'U'") && Catch::Contains("future"));
  // A size that is not a number is a bad state, named.
  make_run(dir / "B", std::string(kHeader) + "\n" + row(1, 1.0, 1, 0.1, 10), {{"opt.task", "sort"}, {"opt.batch", "x"}, {"opt.n_digits", "4"}});
  CHECK_THROWS_WITH(runs::read_run((dir / "B").string()),
                    Catch::Contains("train_state.safetensors") && Catch::Contains("'batch'"));
  fs::remove_all(dir);
}

TEST_CASE("compare: config.json when present gives the options (nested members flattened)", "[compare]") {
  const fs::path dir = temp_dir("compare_config");
  make_run(dir / "A", std::string(kHeader) + "\n" + row(1, 1.0, 1, 0.1, 96), sort_options());
  write_file(dir / "A" / "config.json",
             R"({"task": "sort", "batch": 12, "n_digits": 4, "lr": 0.01, "model": {"d_model": 32, "arch": "gpt"},
                 "progress": false, "tags": [1, 2], "note": null})");
  const runs::RunSummary r = runs::read_run((dir / "A").string());
  CHECK(r.options_source == "config.json");
  const std::map<std::string, std::string> want = {{"task", "sort"}, {"batch", "12"},       {"n_digits", "4"},
                                                   {"lr", "0.01"},   {"model.d_model", "32"}, {"model.arch", "gpt"},
                                                   {"progress", "false"}, {"tags", "[1,2]"}, {"note", "null"}};
  CHECK(r.options == want);
  CHECK(*r.tokens_per_step == 12 * 8);

  write_file(dir / "A" / "config.json", "{\"task\": ");
  CHECK_THROWS_WITH(runs::read_run((dir / "A").string()), Catch::Contains("config.json") && Catch::Contains("JSON"));
  write_file(dir / "A" / "config.json", "[1]");
  CHECK_THROWS_WITH(runs::read_run((dir / "A").string()), Catch::Contains("config.json") && Catch::Contains("object"));
  fs::remove_all(dir);
}

TEST_CASE("compare: labels are folder names or the shortest path suffixes that tell clashing names apart",
          "[compare]") {
  CHECK(runs::unique_labels({"/x/exp1/A", "/x/exp2/A", "/x/B/"}) == std::vector<std::string>{"exp1/A", "exp2/A", "B"});
  CHECK(runs::unique_labels({"/a/b", "/x/a/b"}) == std::vector<std::string>{"/a/b", "x/a/b"});
  CHECK(runs::unique_labels({"/p/q/r/A", "/p/s/r/A", "/t/A"}) == std::vector<std::string>{"q/r/A", "s/r/A", "t/A"});

  const fs::path dir = temp_dir("compare_labels");
  make_run(dir / "exp1" / "A", resumed_log(), sort_options(), "0123456789abcdef0123456789abcdef");
  make_run(dir / "exp2" / "A", resumed_log(), sort_options("0.01"), "fedcba9876543210fedcba9876543210");
  make_run(dir / "B", resumed_log(), sort_options());
  const std::vector<runs::RunSummary> runs =
      runs::read_runs({(dir / "exp1" / "A").string(), (dir / "exp2" / "A/").string(), (dir / "B").string()});
  REQUIRE(runs.size() == 3);
  CHECK(runs[0].label == "exp1/A");
  CHECK(runs[1].label == "exp2/A");
  CHECK(runs[2].label == "B");
  fs::remove_all(dir);
}

TEST_CASE("compare: the same run given twice (by path or by run id) is a usage error naming both", "[compare]") {
  const fs::path dir = temp_dir("compare_same");
  make_run(dir / "A", resumed_log(), sort_options(), "0123456789abcdef0123456789abcdef");
  const std::string a = (dir / "A").string();
  CHECK_THROWS_AS(runs::read_runs({a, a}), UsageError);
  CHECK_THROWS_WITH(runs::read_runs({a, (dir / "A" / ".." / "A" / ".").string()}),
                    Catch::Contains("same folder") && Catch::Contains(a));
  fs::create_directory_symlink(dir / "A", dir / "link");
  CHECK_THROWS_WITH(runs::read_runs({a, (dir / "link").string()}), Catch::Contains("same folder"));
  fs::copy(dir / "A", dir / "copy", fs::copy_options::recursive);
  CHECK_THROWS_WITH(runs::read_runs({a, (dir / "copy").string()}),
                    Catch::Contains("same run") && Catch::Contains("0123456789abcdef0123456789abcdef") &&
                        Catch::Contains("copy"));
  // A copy with an id of its own is another run; runs without ids are never taken for one another.
  write_file(dir / "copy" / "run_id.txt", "fedcba9876543210fedcba9876543210\n");
  CHECK(runs::read_runs({a, (dir / "copy").string()}).size() == 2);
  fs::remove(dir / "A" / "run_id.txt");
  fs::remove(dir / "copy" / "run_id.txt");
  CHECK(runs::read_runs({a, (dir / "copy").string()}).size() == 2);
  write_file(dir / "copy" / "run_id.txt", "not an id\n");
  CHECK_THROWS_WITH(runs::read_runs({a, (dir / "copy").string()}), Catch::Contains("run_id.txt") && Catch::Contains("not a run id"));
  fs::remove_all(dir);
}

TEST_CASE("compare: a path that is not a run folder is a usage error naming it and what is missing", "[compare]") {
  const fs::path dir = temp_dir("compare_notrun");
  CHECK_THROWS_AS(runs::read_runs({}), UsageError);
  CHECK_THROWS_WITH(runs::check_run_folder((dir / "nope").string()), Catch::Contains("nope") && Catch::Contains("does not exist"));
  write_file(dir / "file", "x");
  CHECK_THROWS_WITH(runs::check_run_folder((dir / "file").string()), Catch::Contains("is a file"));
  fs::create_directories(dir / "empty");
  CHECK_THROWS_WITH(runs::check_run_folder((dir / "empty").string()),
                    Catch::Contains("empty") && Catch::Contains("log.csv and train_state.safetensors are missing"));
  make_run(dir / "A", resumed_log(), sort_options());
  fs::remove(dir / "A" / "train_state.safetensors");
  CHECK_THROWS_WITH(runs::check_run_folder((dir / "A").string()),
                    Catch::Contains("train_state.safetensors is missing") && !Catch::Contains("log.csv"));
  CHECK_THROWS_AS(runs::read_run((dir / "A").string()), UsageError);
  // Every folder is checked before any is read: a bad log in the first is not reported first.
  make_run(dir / "B", "garbage\n", sort_options());
  CHECK_THROWS_AS(runs::read_runs({(dir / "B").string(), (dir / "A").string()}), UsageError);
  fs::remove_all(dir);
}

TEST_CASE("compare: a bad log.csv is a format error naming the file and line", "[compare]") {
  const fs::path dir = temp_dir("compare_badlog");
  const fs::path log = dir / "log.csv";
  const std::string good = std::string(kHeader) + "\n" + row(1, 2.0, 1, 0.1, 64) + row(2, 1.0, 2, 0.2, 64);
  const auto fails = [&](const std::string& text, const std::string& where, const std::string& what) {
    write_file(log, text);
    CHECK_THROWS_AS(runs::read_log(log.string()), FormatError);
    CHECK_THROWS_WITH(runs::read_log(log.string()), Catch::Contains(log.string() + where) && Catch::Contains(what));
  };
  write_file(log, good);
  CHECK(runs::read_log(log.string()).rows.size() == 2);
  fails("", ":1:", "empty");
  fails("step,loss\n1,2\n", ":1:", "not the header of a training log");
  fails("step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_loss\n", ":1:", "not the header");
  fails(std::string(kHeader) + "\n", ":2:", "no rows");
  fails(std::string(kHeader), ":1:", "truncated header");
  fails(good.substr(0, good.size() - 5), ":3:", "truncated row");
  fails(good + "3,0.001,1.0,0.5\n", ":4:", "expected 7 comma-separated fields, found 4");
  fails(good + "3,0.001,abc,0.5,100,0.3,\n", ":4:", "loss: 'abc' is not a finite number");
  fails(good + "3,0.001,1,0.5,100,0.3,nan\n", ":4:", "val_loss: 'nan'");
  fails(good + "5,0.001,1,0.5,100,0.3,\n", ":4:", "step 5 where step 3 belongs");
  fails(std::string(kHeader) + "\n" + "x,0.001,1,0.5,100,0.3,\n", ":2:", "step: 'x' is not an integer");
  fs::create_directories(dir / "d");
  CHECK_THROWS_WITH(runs::read_log((dir / "d").string()), Catch::Contains("not a regular file"));
  fs::remove_all(dir);
}

TEST_CASE("compare: differing options (numbers compared as numbers and missing ones differ) in the table and JSON",
          "[compare]") {
  const fs::path dir = temp_dir("compare_differ");
  std::map<std::string, std::string> a = sort_options("0.01"), b = sort_options("1e-2");
  a["opt.seed"] = "18446744073709551615";
  b["opt.seed"] = "18446744073709551614";  // equal as doubles, different seeds
  b["opt.window"] = "4";                   // only in b
  a["opt.out"] = "x";                      // the folders themselves are never listed
  b["opt.out"] = "y";
  make_run(dir / "A", resumed_log(), a, "0123456789abcdef0123456789abcdef");
  make_run(dir / "B", std::string(kHeader) + "\n" + row(1, 2.0, 1, 0.1, 64), b);
  const std::vector<runs::RunSummary> runs = runs::read_runs({(dir / "A").string(), (dir / "B").string()});
  CHECK(runs::differing_options(runs) == std::vector<std::string>{"seed", "window"});

  const std::string table = runs::compare_table(runs);
  CHECK_THAT(table, Catch::Contains("options that differ:"));
  CHECK_THAT(table, Catch::Contains("seed    18446744073709551615  18446744073709551614"));
  CHECK_THAT(table, Catch::Contains("window  -                     4"));
  CHECK_THAT(table, !Catch::Contains("\n  lr "));
  // The run rows: label, task, steps, tokens, wall, training loss, validation losses.
  CHECK_THAT(table, Catch::Contains("\nA    sort     40    2560  5.50s      1.5000    1.6250      1.5000 (20)\n"));
  CHECK_THAT(table, Catch::Contains("\nB    sort      1      64  0.10s      2.0000         -                -\n"));
  CHECK_THAT(table, !Catch::Contains("bpb"));

  const nlohmann::json j = nlohmann::json::parse(runs::compare_json(runs, runs::CompareX::tokens, nullptr));
  CHECK(j["command"] == "compare");
  CHECK(j["x"] == "tokens");
  CHECK(j["differing_options"] == nlohmann::json::array({"seed", "window"}));
  CHECK(j["picture"].is_null());
  REQUIRE(j["runs"].size() == 2);
  const nlohmann::json& ja = j["runs"][0];
  CHECK(ja["label"] == "A");
  CHECK(ja["dir"] == (dir / "A").string());
  CHECK(ja["run_id"] == "0123456789abcdef0123456789abcdef");
  CHECK(ja["options"]["lr"] == "0.01");
  CHECK(ja["options"]["out"] == "x");  // the JSON has every option
  CHECK(ja["steps"] == 40);
  CHECK(ja["tokens"] == 2560);
  CHECK(ja["tokens_per_step"] == 64);
  CHECK(ja["sessions"] == 2);
  CHECK(ja["wall_s"].get<double>() == Approx(5.5).epsilon(1e-12));
  CHECK(ja["final_train_loss"].get<double>() == 1.5);
  CHECK(ja["final_val_loss"].get<double>() == 1.625);
  CHECK(ja["best_val_loss"].get<double>() == 1.5);
  CHECK(ja["best_val_step"] == 20);
  CHECK(ja["final_val_bpb"].is_null());
  CHECK(ja["best_val_bpb"].is_null());
  const nlohmann::json& jb = j["runs"][1];
  CHECK(jb["run_id"].is_null());
  CHECK(jb["final_val_loss"].is_null());
  CHECK(jb["best_val_loss"].is_null());
  CHECK(jb["best_val_step"].is_null());
  CHECK(jb["options"]["window"] == "4");
  CHECK(jb["options"].count("step") == 0);
  fs::remove_all(dir);
}

TEST_CASE("compare: a folder name that is not UTF-8 reaches the JSON document as U+FFFD", "[compare]") {
  const fs::path dir = temp_dir("compare_utf8");
  make_run(dir / "r\xff\xc3", resumed_log(), sort_options());
  const std::vector<runs::RunSummary> runs = runs::read_runs({(dir / "r\xff\xc3").string()});
  CHECK(runs[0].label == "r\xff\xc3");
  const nlohmann::json j = nlohmann::json::parse(runs::compare_json(runs, runs::CompareX::step, nullptr));
  CHECK(j["runs"][0]["label"] == "r\xef\xbf\xbd\xef\xbf\xbd");
  fs::remove_all(dir);
}

TEST_CASE("compare: the picture's script plots every run's logs in its colour by step or by tokens seen",
          "[compare]") {
  const fs::path dir = temp_dir("compare_script");
  make_run(dir / "runs" / "A", resumed_log(), sort_options(), "0123456789abcdef0123456789abcdef");
  std::string flat = std::string(kHeader) + "\n" + row(1, 2.0, 1, 0.1, 64) + row(2, 1.9, 2, 0.2, 64);
  make_run(dir / "runs" / "B", flat, sort_options("0.01"));
  fs::create_directories(dir / "pics");
  const std::vector<runs::RunSummary> runs =
      runs::read_runs({(dir / "runs" / "A").string(), (dir / "runs" / "B").string()});
  const std::string png = (dir / "pics" / "cmp.png").string();
  const std::string by_step = runs::compare_script(runs, png, runs::CompareX::step);
  CHECK_THAT(by_step, Catch::Contains("set output \"cmp.png\""));
  CHECK_THAT(by_step, Catch::Contains("set xlabel \"step\""));
  // Relative to the picture's folder, where gnuplot runs.
  CHECK_THAT(by_step, Catch::Contains("\"../runs/A/log.csv\" using 1:3 with lines lw 1 lc rgb '#661f77b4'"));
  CHECK_THAT(by_step, Catch::Contains("\"../runs/A/log.csv\" using 1:7 with linespoints"));
  CHECK_THAT(by_step, Catch::Contains("\"../runs/B/log.csv\" using 1:3 with lines lw 1 lc rgb '#66ff7f0e'"));
  CHECK_THAT(by_step, !Catch::Contains("\"../runs/B/log.csv\" using 1:7"));  // B has no validation loss
  CHECK_THAT(by_step, Catch::Contains("title \"A\"") && Catch::Contains("title \"B\""));
  CHECK_THAT(by_step, !Catch::Contains("logscale"));  // losses from 1.25 to 2.95: linear
  const std::string by_tokens = runs::compare_script(runs, png, runs::CompareX::tokens);
  CHECK_THAT(by_tokens, Catch::Contains("set xlabel \"tokens seen\""));
  CHECK_THAT(by_tokens, Catch::Contains("\"../runs/A/log.csv\" using ($1*64.0):3"));

  std::string steep = std::string(kHeader) + "\n" + row(1, 8.0, 1, 0.1, 64) + row(2, 0.5, 2, 0.2, 64);
  make_run(dir / "runs" / "S", steep, sort_options());
  CHECK_THAT(runs::compare_script({runs::read_run((dir / "runs" / "S").string())}, png, runs::CompareX::step),
             Catch::Contains("set logscale y"));  // a factor 16: log scale

  REQUIRE_FALSE(runs::find_gnuplot().empty());  // gnuplot-nox is a build requirement
  const runs::Picture pic = runs::compare_png(runs, png, runs::CompareX::tokens);
  CHECK(pic.drawn);
  CHECK(pic.script == (dir / "pics" / "cmp.gp").string());
  CHECK(read_file(pic.script) == by_tokens);
  const runs::ImageSize size = runs::png_size(png);
  CHECK(size.width == 1000);
  CHECK(size.height == 600);
  fs::remove_all(dir);
}

TEST_CASE("compare: --y val_bpb is the default when the tokenizers differ and --x bytes scales tokens by bytes per token",
          "[compare]") {
  const fs::path dir = temp_dir("compare_axes");
  const std::string header = "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_bpb\n";
  // Bytes per token = val_loss / (val_bpb ln 2): 1 for the byte model, 4 for the BPE one.
  const double ln2 = std::log(2.0);
  char v1[64], v2[64];
  std::snprintf(v1, sizeof v1, "%.17g", 2 * ln2);  // 2 bits per byte at 1 byte per token
  std::snprintf(v2, sizeof v2, "%.17g", 4 * ln2);  // 1 bit per byte at 4 bytes per token
  make_run(dir / "bytes", header + row(1, 2.0, 1, 0.1, 256, v1, ",2") + row(2, 1.9, 2, 0.2, 256, "", ","),
           {{"opt.task", "text"}, {"opt.batch", "4"}, {"opt.context", "64"}, {"opt.tokenizer", "bytes"}});
  make_run(dir / "bpe", header + row(1, 3.0, 1, 0.1, 256, v2, ",1") + row(2, 2.9, 2, 0.2, 256, "", ","),
           {{"opt.task", "text"}, {"opt.batch", "4"}, {"opt.context", "64"}, {"opt.tokenizer", "bpe.model"}});
  make_run(dir / "S", std::string(kHeader) + "\n" + row(1, 2.0, 1, 0.1, 64) + row(2, 1.9, 2, 0.2, 64), sort_options());
  const std::vector<runs::RunSummary> text = runs::read_runs({(dir / "bytes").string(), (dir / "bpe").string()});
  const runs::RunSummary sort = runs::read_run((dir / "S").string());
  REQUIRE(text[0].bytes_per_token);
  REQUIRE(text[1].bytes_per_token);
  CHECK(std::abs(*text[0].bytes_per_token - 1.0) < 1e-12);
  CHECK(std::abs(*text[1].bytes_per_token - 4.0) < 1e-12);
  CHECK_FALSE(sort.bytes_per_token);
  CHECK(runs::tokenizer_of(text[0]) == "bytes");
  CHECK(runs::tokenizer_of(text[1]) == "bpe.model");
  CHECK(runs::tokenizer_of(sort) == "task sort");

  // The BPE run has the higher loss per token (4 ln 2 against 2 ln 2) but the lower bits per byte:
  // different tokenizers, so bits per byte by default; one tokenizer, or a run without bits per
  // byte, keeps the validation loss.
  CHECK(runs::default_y(text) == runs::CompareY::val_bpb);
  CHECK(runs::default_y({text[0]}) == runs::CompareY::val_loss);
  CHECK(runs::default_y({text[0], sort}) == runs::CompareY::val_loss);

  fs::create_directories(dir / "pics");
  const std::string png = (dir / "pics" / "cmp.png").string();
  const std::string bpb = runs::compare_script(text, png, runs::CompareX::bytes, runs::CompareY::val_bpb);
  CHECK_THAT(bpb, Catch::Contains("set ylabel \"validation bits per byte\""));
  CHECK_THAT(bpb, Catch::Contains("set xlabel \"bytes seen\""));
  CHECK_THAT(bpb, Catch::Contains("\"../bytes/log.csv\" using ($1*256.0*1):8 with linespoints"));
  CHECK_THAT(bpb, Catch::Contains("\"../bpe/log.csv\" using ($1*256.0*"));
  CHECK_THAT(bpb, !Catch::Contains(":3 with lines") && !Catch::Contains(":7 with"));
  const std::string loss = runs::compare_script(text, png, runs::CompareX::step, runs::CompareY::loss);
  CHECK_THAT(loss, Catch::Contains("set ylabel \"training loss\""));
  CHECK_THAT(loss, Catch::Contains("\"../bytes/log.csv\" using 1:3 with lines lw 1.5 lc rgb '#1f77b4'"));
  CHECK_THAT(loss, !Catch::Contains("linespoints"));
  // The default of compare_script is today's picture: training loss light, validation loss on top.
  CHECK(runs::compare_script(text, png, runs::CompareX::step) ==
        runs::compare_script(text, png, runs::CompareX::step, runs::CompareY::val_loss));

  REQUIRE_FALSE(runs::find_gnuplot().empty());
  const runs::Picture pic = runs::compare_png(text, png, runs::CompareX::bytes, runs::CompareY::val_bpb);
  CHECK(pic.drawn);
  const nlohmann::json j = nlohmann::json::parse(runs::compare_json(text, runs::CompareX::bytes, &pic, runs::CompareY::val_bpb));
  CHECK(j["x"] == "bytes");
  CHECK(j["y"] == "val_bpb");
  CHECK(std::abs(j["runs"][1]["bytes_per_token"].get<double>() - 4.0) < 1e-12);

  // Quantities a run lacks: refused naming the run and the flag.
  CHECK_NOTHROW(runs::check_x_axis(text, runs::CompareX::bytes));
  CHECK_THROWS_WITH(runs::check_x_axis({text[0], sort}, runs::CompareX::bytes),
                    Catch::Contains("--x bytes") && Catch::Contains("run 'S'") && Catch::Contains("val_bpb"));
  CHECK_THROWS_WITH(runs::check_y_axis({text[0], sort}, runs::CompareY::val_bpb),
                    Catch::Contains("--y val_bpb") && Catch::Contains("run 'S'"));
  CHECK_THROWS_WITH(runs::check_y_axis({sort}, runs::CompareY::val_loss),
                    Catch::Contains("--y val_loss") && Catch::Contains("no validation loss"));
  CHECK_NOTHROW(runs::check_y_axis({sort}, runs::CompareY::loss));
  CHECK_THROWS_AS(runs::compare_script({text[0], sort}, png, runs::CompareX::step, runs::CompareY::val_bpb), UsageError);
  fs::remove_all(dir);
}

TEST_CASE("safetensors: load_header reads the header alone with load's checks", "[compare][safetensors]") {
  const fs::path dir = temp_dir("st_header");
  const fs::path p = dir / "s.safetensors";
  write_file(p, safetensors_bytes({{"opt.task", "sort"}, {"a", "b"}}));
  const io::safetensors::Header h = io::safetensors::load_header(p.string());
  const io::safetensors::File f = io::safetensors::load(p.string());
  CHECK(h.metadata == f.metadata);
  CHECK(h.metadata.at("opt.task") == "sort");
  REQUIRE(h.tensors.size() == 1);
  CHECK(h.tensors[0].name == "w");
  CHECK(h.tensors[0].dtype == "F32");
  CHECK(h.tensors[0].shape == Shape{2});

  // The same refusals as load: trailing bytes, a header longer than the file, a bad header.
  write_file(p, safetensors_bytes({}, 4));
  CHECK_THROWS_WITH(io::safetensors::load_header(p.string()), Catch::Contains("4 trailing bytes") && Catch::Contains(p.string()));
  CHECK_THROWS_AS(io::safetensors::load(p.string()), FormatError);
  std::string bytes = safetensors_bytes({});
  write_file(p, bytes.substr(0, 20));
  CHECK_THROWS_WITH(io::safetensors::load_header(p.string()), Catch::Contains("exceeds"));
  write_file(p, "abc");
  CHECK_THROWS_AS(io::safetensors::load_header(p.string()), FormatError);
  CHECK_THROWS_WITH(io::safetensors::load_header((dir / "missing").string()), Catch::Contains("cannot open"));

  // A 4 GiB tensor (a sparse file: no disk, no memory): the header is read, the data never.
  const std::string header = "{\"big\":{\"dtype\":\"F32\",\"shape\":[1073741824],\"data_offsets\":[0,4294967296]}}";
  {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    const std::uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
  }
  fs::resize_file(p, 8 + header.size() + (std::uint64_t(1) << 32));
  const io::safetensors::Header big = io::safetensors::load_header(p.string());
  REQUIRE(big.tensors.size() == 1);
  CHECK(big.tensors[0].shape == Shape{1073741824});
  fs::remove_all(dir);
}

TEST_CASE("json: dump(2) writes one item or member per line and two spaces deeper per level", "[compare][json]") {
  const json::Value v = json::parse(R"({"a":[1,{"b":null}],"c":{},"d":[],"e":"x"})");
  CHECK(v.dump() == R"({"a":[1,{"b":null}],"c":{},"d":[],"e":"x"})");
  CHECK(v.dump(2) == "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": {},\n  \"d\": [],\n  \"e\": \"x\"\n}");
  CHECK(json::parse(v.dump(2)).dump() == v.dump());
}
