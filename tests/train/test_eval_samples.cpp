// Samples at evaluation (train/eval_samples.hpp): a text run writes one line of samples.jsonl
// at every evaluation, the same text the run's result.txt sample line has at the end; a resumed
// run keeps the lines up to its checkpoint and drops the rest (and a line a kill cut); a new run
// in the folder starts without the old file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/helpers.hpp"
#include <xgrad/io/detail/json.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/train/eval_samples.hpp>
#include <xgrad/train/options.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
namespace fs = std::filesystem;

namespace {

// The (step, text) of every line of samples.jsonl, each line parsed as JSON.
std::vector<std::pair<std::string, std::string>> samples_of(const fs::path& run) {
  std::istringstream in(xgt::read_file(run / runs::kSamplesFile));
  std::vector<std::pair<std::string, std::string>> out;
  for (std::string line; std::getline(in, line);) {
    const json::Value v = json::parse(line);
    REQUIRE(v.find("step") != nullptr);
    REQUIRE(v.find("text") != nullptr);
    out.emplace_back(v.find("step")->str(), v.find("text")->str());
  }
  return out;
}

}  // namespace

TEST_CASE("eval samples: a text run writes a sample at every evaluation and a resume keeps those up to its checkpoint",
          "[text][eval_samples]") {
  const fs::path dir = xgt::temp_dir("eval_samples");
  for (int i = 0; i < 8; ++i) {
    fs::create_directories(dir / "corpus");
    std::ofstream(dir / "corpus" / ("doc" + std::to_string(i) + ".txt"))
        << "Document " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  train::TrainOptions o;
  o.task = "text";
  o.text = (dir / "corpus").string();
  o.out = (dir / "run").string();
  o.steps = 6;
  o.batch = 4;
  o.context = 16;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.eval_every = 2;
  o.stop_at = 5;  // as if interrupted after step 5: its checkpoint is the state a resume starts from
  o.progress = o.plot = false;
  std::ostringstream log;
  (void)train::run_training(o, log);
  auto first = samples_of(dir / "run");
  REQUIRE(first.size() == 2);  // evaluations at steps 2 and 4
  CHECK(first[0].first == "2");
  CHECK(first[1].first == "4");
  CHECK(first[0].second.rfind("Document", 0) == 0);  // the prompt: the first tokens of the validation text

  // A session that went on past the checkpoint and was killed mid-line: its lines are dropped.
  std::ofstream(dir / "run" / runs::kSamplesFile, std::ios::app) << "{\"step\": 6, \"text\": \"later\"}\n{\"step\": 8, \"te";
  train::TrainOptions again;
  again.resume = o.out;
  again.progress = again.plot = false;
  (void)train::run_training(again, log);
  const auto resumed = samples_of(dir / "run");
  REQUIRE(resumed.size() == 3);
  CHECK(resumed[0] == first[0]);
  CHECK(resumed[1] == first[1]);
  CHECK(resumed[2].first == "6");
  CHECK(resumed[2].second != "later");
  // The last sample is the one result.txt shows (the same prompt, seed and model).
  CHECK_THAT(xgt::read_file(dir / "run" / runs::kResultFile), Catch::Contains(resumed[2].second.substr(0, 20)));

  // A new run in the folder starts without the old samples.
  train::start_eval_samples((dir / "run").string(), 0);
  CHECK_FALSE(fs::exists(dir / "run" / runs::kSamplesFile));
}
