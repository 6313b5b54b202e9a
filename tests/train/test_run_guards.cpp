// Runs and generation refuse what they cannot do well: every option's range before any work,
// too few distinct problems, non-finite parameters and logits; non-ASCII text round trips.
// CLI-level behaviour (exit codes, one-line messages) is in the catalogue (tests/robustness/).
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "tests/support/helpers.hpp"
#include "tests/support/tiny_runs.hpp"
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/io/number.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/train/tasks.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return temp_dir("reliability_" + name); }

}  // namespace

TEST_CASE("charlm: non-ASCII text checkpoints resumes and generates", "[train]") {
  const fs::path dir = fresh_dir("utf8");
  {
    std::ofstream text(dir / "t.txt", std::ios::binary);
    for (int i = 0; i < 300; ++i) text << "\xc3\xa9" << (i % 7 == 0 ? "\xff" : "a");  // é and a stray byte
  }
  train::TrainOptions o = xgt::tiny_sort_run(dir / "out", 4);
  o.task = "charlm";
  o.text = (dir / "t.txt").string();
  o.context = 8;
  o.stop_at = 2;
  std::ostringstream log;
  REQUIRE_NOTHROW(train::run_training(o, log));
  train::LoadedModel m = train::load_model((dir / "out" / "model.safetensors").string());
  REQUIRE(m.info.vocab.size() == 4);  // bytes 0xc3, 0xa9, 'a', 0xff: each its own token, kept exactly
  CHECK(m.info.vocab.tokens[0] == "a");
  CHECK(m.info.vocab.tokens[1] == std::string(1, '\xa9'));
  CHECK(m.info.vocab.tokens[3] == std::string(1, '\xff'));
  const train::TrainOptions again = xgt::resume_options(dir / "out");
  CHECK(train::run_training(again, log).steps_done == 4);
  // Vocabularies written before (JSON strings) still read.
  CHECK(text::Vocabulary::from_json("[\"a\",\"|\"]").tokens == std::vector<std::string>{"a", "|"});
  CHECK_THROWS_AS(text::Vocabulary::from_json("[[256]]"), FormatError);
  CHECK_THROWS_AS(text::Vocabulary::from_json("{}"), FormatError);
  // What cannot be saved is refused before training, never at the first checkpoint.
  train::TrainOptions bad = xgt::tiny_sort_run(dir / "bad", 2);
  bad.task = "charlm";
  bad.context = 8;
  bad.text = (dir / "t.txt").string() + "\xff";  // the file name lands in the saved options
  fs::copy_file(dir / "t.txt", bad.text);
  CHECK_THROWS_WITH(train::run_training(bad, log), Catch::Contains("opt.text") && Catch::Contains("UTF-8"));
  CHECK_FALSE(fs::exists(dir / "bad" / "log.csv"));
  fs::remove_all(dir);
}

TEST_CASE("sort task: too few distinct problems is an error and not a hang", "[train]") {
  for (std::size_t digits : {1, 2}) {
    train::SortTask t(digits);
    CHECK_THROWS_WITH(t.heldout(500, 1), Catch::Contains("distinct problems") && Catch::Contains("500"));
  }
  CHECK(train::SortTask(3).heldout(500, 1).size() == 500);
  CHECK_THROWS_AS(train::ReverseTask(1, 1).heldout(500, 1), ValueError);
}

TEST_CASE("train options: every option's range is checked before any work", "[train]") {
  const fs::path dir = fresh_dir("flags");
  std::ostringstream sink;
  auto refused = [&](auto edit, const std::string& flag) {
    train::TrainOptions o = xgt::tiny_sort_run(dir / "never", 3);
    edit(o);
    CHECK_THROWS_AS(train::run_training(o, sink), UsageError);
    CHECK_THROWS_WITH(train::run_training(o, sink), Catch::Contains(flag));
    CHECK_FALSE(fs::exists(dir / "never"));
  };
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double lr : {nan, inf, 1e300, -1.0}) refused([&](auto& o) { o.lr = lr; }, "--lr");
  for (double clip : {-1.0, 0.0, nan}) refused([&](auto& o) { o.clip = clip; }, "--clip");
  refused([](auto& o) { o.layers = 100000000; }, "--layers");
  refused([](auto& o) { o.batch = 0; }, "--batch");
  refused([](auto& o) { o.steps = -5; }, "--steps");
  refused([](auto& o) { o.dropout = 1.0; }, "--dropout");
  refused([](auto& o) { o.heads = 3; }, "--heads");
  refused([](auto& o) { o.stop_at = 9; }, "--stop-at");
  refused([](auto& o) { o.d_model = 8192; o.heads = 1; o.layers = 256; }, "parameters");
  std::ofstream(dir / "file") << "x";
  refused([&](auto& o) { o.out = (dir / "file").string(); }, "not a directory");
  fs::remove_all(dir);
}

TEST_CASE("train options: checked number conversions name the source", "[train]") {
  CHECK(io::parse_int("-12", "w") == -12);
  CHECK(io::parse_uint("12", "w") == 12);
  CHECK(io::parse_double("1.5e-3", "w") == 1.5e-3);
  for (const char* bad : {"", "x", "1x", " 1", "-", "99999999999999999999"})
    CHECK_THROWS_WITH(io::parse_int(bad, "log.csv:3"), Catch::Contains("log.csv:3"));
  CHECK_THROWS_AS(io::parse_uint("-1", "w"), FormatError);
  for (const char* bad : {"nan", "inf", "1e400", "1,5", ""}) CHECK_THROWS_AS(io::parse_double(bad, "w"), FormatError);
}

TEST_CASE("generate: non-finite parameters are refused and no token comes from non-finite logits", "[train]") {
  const fs::path dir = fresh_dir("nan");
  std::ostringstream log;
  train::run_training(xgt::tiny_sort_run(dir, 1), log);
  const fs::path model = dir / "model.safetensors";
  io::safetensors::File f = io::safetensors::load(model.string());
  for (auto& [name, a] : f.tensors)
    if (name == "ln_f.gamma") {
      Array c = a.clone();
      c.set_flat(3, std::numeric_limits<double>::quiet_NaN());
      a = c;
    }
  io::safetensors::save(model.string(), f.tensors, f.metadata);
  CHECK_THROWS_WITH(train::load_model(model.string()),
                    Catch::Contains("ln_f.gamma") && Catch::Contains("element 3") && Catch::Contains("finite"));
  nn::SampleOptions so;
  CHECK_THROWS_WITH(nn::pick_token({0.1, std::nan(""), 0.3}, so), Catch::Contains("token 1"));
  Generator g(1);
  so.generator = &g;
  so.temperature = 1.0;
  CHECK_THROWS_AS(nn::pick_token({0.1, std::numeric_limits<double>::infinity()}, so), ValueError);
  fs::remove_all(dir);
}
