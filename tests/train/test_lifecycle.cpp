// The life-cycle rules of `xgrad train` (train/lifecycle.hpp): --config under the flags, what
// --resume refuses, and a new run's task alias, task defaults and range checks.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/train/lifecycle.hpp>

using namespace xg;
using train::Invocation;
using train::TrainOptions;

namespace {

std::string write_config(const std::string& name, const std::string& text) {
  const std::filesystem::path p = xgt::temp_dir("lifecycle_" + name) / name;
  std::ofstream(p) << text;
  return p.string();
}

}  // namespace

TEST_CASE("lifecycle: a new run gets its task's alias and defaults for the options not given", "[lifecycle]") {
  TrainOptions o;
  o.task = "charlm";
  o.batch = 16;
  Invocation inv;
  inv.given = {"task", "batch"};
  std::ostringstream warnings;
  const std::set<std::string> given = train::resolve_invocation(o, inv, warnings);
  CHECK(o.task == "text");
  CHECK(o.tokenizer == "bytes");
  CHECK(o.batch == 16);     // given: kept
  CHECK(o.lr == 5e-3);      // not given: the text task's default
  CHECK(o.dropout == 0.1);  // likewise
  CHECK(given == std::set<std::string>{"task", "batch"});
  CHECK(warnings.str().empty());
}

TEST_CASE("lifecycle: a new run's options are range-checked and --lr 0 is refused", "[lifecycle]") {
  std::ostringstream warnings;
  TrainOptions o;
  o.batch = 0;
  Invocation inv;
  inv.given = {"batch"};
  CHECK_THROWS_AS(train::resolve_invocation(o, inv, warnings), UsageError);
  CHECK_THROWS_WITH(train::resolve_invocation(o, inv, warnings), Catch::Contains("--batch 0"));
  TrainOptions z;  // lr 0 is the default's placeholder, but given it is refused
  Invocation lr;
  lr.given = {"lr"};
  CHECK_THROWS_WITH(train::resolve_invocation(z, lr, warnings), Catch::Contains("--lr 0"));
  TrainOptions t;  // an option the task does not read
  Invocation text;
  text.given = {"val_fraction"};
  CHECK_THROWS_WITH(train::resolve_invocation(t, text, warnings), Catch::Contains("--val-fraction is only for --task text"));
}

TEST_CASE("lifecycle: --resume refuses run-defining flags and --config as well as an empty folder", "[lifecycle]") {
  std::ostringstream warnings;
  TrainOptions o;
  o.resume = "somewhere";
  Invocation inv;
  inv.resume_flag = true;
  inv.given = {"resume", "threads", "stop_at"};
  CHECK_NOTHROW(train::resolve_invocation(o, inv, warnings));  // session options may be given
  CHECK(o.steps == 0);  // a resumed run's options come from its checkpoint, not from defaults
  inv.given = {"resume", "d_model"};
  CHECK_THROWS_WITH(train::resolve_invocation(o, inv, warnings),
                    Catch::Contains("--d-model cannot be combined with --resume") && Catch::Contains("--threads"));
  inv.given = {"resume"};
  inv.config = write_config("resume.json", "{\"d_model\": 32}");
  CHECK_THROWS_WITH(train::resolve_invocation(o, inv, warnings), Catch::Contains("--config cannot be combined with --resume"));
  TrainOptions empty;
  Invocation flag_only;
  flag_only.resume_flag = true;
  CHECK_THROWS_WITH(train::resolve_invocation(empty, flag_only, warnings), Catch::Contains("--resume needs the folder"));
}

TEST_CASE("lifecycle: --config sets the options no flag gave and a differing --threads warns", "[lifecycle]") {
  const std::string config = write_config("exp.json", "{\"d_model\": 32, \"heads\": 8, \"threads\": 3}");
  TrainOptions o;
  o.heads = 2;
  o.threads = 1;
  Invocation inv;
  inv.given = {"heads", "threads"};
  inv.config = config;
  std::ostringstream warnings;
  const std::set<std::string> given = train::resolve_invocation(o, inv, warnings);
  CHECK(o.d_model == 32);  // from the file
  CHECK(o.heads == 2);     // the flag wins
  CHECK(o.threads == 1);
  CHECK(given.count("d_model") == 1);
  CHECK(warnings.str().find("--threads 1: " + config + " records 3 threads") != std::string::npos);
  Invocation bad;
  bad.config = write_config("bad.json", "{\"overwrite\": true}");
  TrainOptions b;
  CHECK_THROWS_WITH(train::resolve_invocation(b, bad, warnings), Catch::Contains("may not be set in a config file"));
}
