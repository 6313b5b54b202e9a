// The checkpoint is one unit: resume refuses a model and state from different steps, a state
// with a missing or stray tensor, or one from another run; log.csv holds exactly the
// checkpoint's rows; run ids are made per run and kept by --resume.
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
#include <xgrad/train/generate.hpp>
#include <xgrad/train/tasks.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return temp_dir("reliability_" + name); }

// Rewrites one metadata value of a saved safetensors file (tensors unchanged).
void set_metadata(const fs::path& p, const std::string& key, const std::string& value) {
  io::safetensors::File f = io::safetensors::load(p.string());
  f.metadata[key] = value;
  io::safetensors::save(p.string(), f.tensors, f.metadata);
}

// Every file under `dir` (relative name -> bytes).
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_file(e.path());
  return out;
}

std::string first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

TEST_CASE("checkpoint: one unit on disk, and resume refuses a model and state from different steps",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("atomic");
  std::ostringstream log;
  train::TrainOptions o = xgt::tiny_sort_run(dir, 6);
  o.stop_at = 3;
  train::run_training(o, log);
  // The state holds the parameters itself: a model.safetensors from another step is not used.
  const auto state = io::safetensors::load((dir / "train_state.safetensors").string());
  CHECK(state.metadata.at("step") == "3");
  bool has_params = false;
  for (const auto& named : state.tensors) has_params = has_params || named.first.rfind("model.", 0) == 0;
  CHECK(has_params);
  // An earlier xgrad's pair (parameters only in model.safetensors) from different steps is refused.
  io::safetensors::NamedArrays optim;
  for (const auto& [name, a] : state.tensors)
    if (name.rfind("optim.", 0) == 0) optim.emplace_back(name.substr(6), a);
  io::safetensors::Metadata meta = state.metadata;
  meta.erase("checkpoint");
  io::safetensors::save((dir / "train_state.safetensors").string(), optim, meta);
  set_metadata(dir / "model.safetensors", "step", "4");
  const train::TrainOptions again = xgt::resume_options(dir);
  CHECK_THROWS_WITH(train::run_training(again, log),
                    Catch::Contains("from step 4") && Catch::Contains("from step 3") && Catch::Contains("not one checkpoint"));
  set_metadata(dir / "model.safetensors", "step", "3");  // a consistent old pair resumes
  CHECK(train::run_training(again, log).steps_done == 6);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: the recorded parameter_count matches the built models", "[train][checkpoint]") {
  Generator g(1);
  for (std::size_t kv : {0, 1, 2}) {
    nn::TransformerConfig c;
    c.V_vocab = 13;
    c.context = 9;
    c.d_model = 16;
    c.H_q = 4;
    c.H_kv = kv;
    c.layers = 2;
    c.d_ff = kv == 1 ? 24 : 0;
    c.encoder_layers = kv == 2 ? 3 : 0;
    c = c.resolved();
    CHECK(train::parameter_count("gpt", c) == nn::GPT(c, g).parameter_count());
    CHECK(train::parameter_count("encoder_decoder", c) == nn::EncoderDecoder(c, g).parameter_count());
  }
}

TEST_CASE("resume: log.csv holds exactly the checkpoint's rows and a different run is not overwritten",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("log");
  std::ostringstream log;
  train::TrainOptions o = xgt::tiny_sort_run(dir, 6);
  o.checkpoint_every = 2;
  o.stop_at = 3;
  train::run_training(o, log);
  auto rows = [&] {
    std::ifstream in(dir / "log.csv");
    std::vector<std::string> r;
    for (std::string l; std::getline(in, l);) r.push_back(l);
    return r;
  };
  REQUIRE(rows().size() == 4);  // header + steps 1..3, on disk (flushed before the checkpoint)
  {
    std::ofstream app(dir / "log.csv", std::ios::app);
    app << "4,0.001,2.5,1.0,100,0.1\n5,0.0";  // rows after the checkpoint, the last one cut
  }
  const train::TrainOptions again = xgt::resume_options(dir);
  train::run_training(again, log);
  const auto r = rows();
  REQUIRE(r.size() == 7);
  for (int s = 1; s <= 6; ++s) CHECK(r[static_cast<std::size_t>(s)].rfind(std::to_string(s) + ",", 0) == 0);
  // A corrupt row before the checkpoint's step names the file and line.
  {
    std::ofstream w(dir / "log.csv");
    w << r[0] << "\n1,x,y\n";
  }
  CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("log.csv:2"));
  // A different run in the folder: refused, nothing touched; --overwrite replaces it.
  const std::string before = read_file(dir / "train_state.safetensors");
  train::TrainOptions other = xgt::tiny_sort_run(dir, 4);
  other.seed = 7;
  CHECK_THROWS_WITH(train::run_training(other, log), Catch::Contains("holds a different run") && Catch::Contains("seed"));
  CHECK(read_file(dir / "train_state.safetensors") == before);
  other.overwrite = true;
  CHECK(train::run_training(other, log).steps_done == 4);
  fs::remove_all(dir);
}

TEST_CASE("resume: refuses a state without any one of its tensors or with a stray one and names it",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("incomplete");
  std::ostringstream log;
  train::TrainOptions o = xgt::tiny_sort_run(dir, 4);
  o.stop_at = 2;
  train::run_training(o, log);
  const fs::path state = dir / "train_state.safetensors";
  const std::string good = read_file(state);
  const io::safetensors::File f = io::safetensors::load(state.string());
  REQUIRE(f.tensors.size() > 6);
  std::size_t moments = 0;
  for (const auto& [name, a] : f.tensors) moments += name.rfind("optim.", 0) == 0;
  CHECK(moments == 2 * (f.tensors.size() - moments));  // exp_avg and exp_avg_sq of every parameter
  const train::TrainOptions again = xgt::resume_options(dir);
  for (std::size_t drop = 0; drop < f.tensors.size(); ++drop) {
    const std::string name = f.tensors[drop].first;
    io::safetensors::NamedArrays kept;
    for (std::size_t i = 0; i < f.tensors.size(); ++i)
      if (i != drop) kept.push_back(f.tensors[i]);
    io::safetensors::save(state.string(), kept, f.metadata);
    const auto before = folder_bytes(dir);
    INFO("without " << name);
    CHECK_THROWS_AS(train::run_training(again, log), FormatError);
    CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("missing tensor") &&
                                                           Catch::Contains("'" + name + "'"));
    CHECK(folder_bytes(dir) == before);
  }
  // Stray tensors: a moment AdamW does not keep, and a tensor that is neither.
  for (const std::string stray : {"optim.ln_f.gamma.momentum", "optim.nothing.exp_avg", "stray"}) {
    io::safetensors::NamedArrays more = f.tensors;
    more.emplace_back(stray, f.tensors[0].second);
    io::safetensors::save(state.string(), more, f.metadata);
    INFO("with " << stray);
    CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("unexpected tensor") &&
                                                           Catch::Contains("'" + stray + "'"));
  }
  std::ofstream(state, std::ios::binary) << good;  // the complete state resumes
  CHECK(train::run_training(again, log).steps_done == 4);
  fs::remove_all(dir);
}

TEST_CASE("resume: refuses a state from another run naming both run ids and changes nothing",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("other_run");
  std::ostringstream log;
  train::TrainOptions sort = xgt::tiny_sort_run(dir / "sort", 6);
  sort.stop_at = 3;
  train::run_training(sort, log);
  train::TrainOptions reverse = xgt::tiny_sort_run(dir / "reverse", 4);
  reverse.task = "reverse";
  reverse.stop_at = 2;
  train::run_training(reverse, log);
  const std::string sort_id = first_line(dir / "sort" / "run_id.txt");
  const std::string reverse_id =
      io::safetensors::load((dir / "reverse" / "train_state.safetensors").string()).metadata.at("run_id");
  CHECK(sort_id.size() == 32);
  CHECK(reverse_id.size() == 32);
  CHECK(sort_id != reverse_id);
  fs::copy_file(dir / "reverse" / "train_state.safetensors", dir / "sort" / "train_state.safetensors",
                fs::copy_options::overwrite_existing);
  const auto before = folder_bytes(dir / "sort");
  CHECK_THROWS_AS(train::run_training(xgt::resume_options(dir / "sort"), log), FormatError);
  CHECK_THROWS_WITH(train::run_training(xgt::resume_options(dir / "sort"), log),
                    Catch::Contains(sort_id) && Catch::Contains(reverse_id) && Catch::Contains("another run"));
  CHECK(folder_bytes(dir / "sort") == before);  // not the model, not the log, nothing
  fs::remove_all(dir);
}

TEST_CASE("run id: made per run and kept by --resume while model.safetensors stays free of it",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("run_id");
  std::ostringstream log;
  train::run_training(xgt::tiny_sort_run(dir / "x", 4), log);
  train::run_training(xgt::tiny_sort_run(dir / "y", 4), log);
  const std::string x = first_line(dir / "x" / "run_id.txt"), y = first_line(dir / "y" / "run_id.txt");
  CHECK(x != y);  // the same flags, two runs
  CHECK(io::safetensors::load((dir / "x" / "train_state.safetensors").string()).metadata.at("run_id") == x);
  // The model is the same bytes for the same flags (no run id in it).
  CHECK(read_file(dir / "x" / "model.safetensors") == read_file(dir / "y" / "model.safetensors"));
  CHECK(io::safetensors::load((dir / "x" / "model.safetensors").string()).metadata.count("run_id") == 0);
  // Stopped and resumed: the same id throughout, and the same end as the uninterrupted run.
  train::TrainOptions z = xgt::tiny_sort_run(dir / "z", 4);
  z.stop_at = 2;
  train::run_training(z, log);
  const std::string id = first_line(dir / "z" / "run_id.txt");
  CHECK(train::run_training(xgt::resume_options(dir / "z"), log).steps_done == 4);
  CHECK(first_line(dir / "z" / "run_id.txt") == id);
  CHECK(io::safetensors::load((dir / "z" / "train_state.safetensors").string()).metadata.at("run_id") == id);
  CHECK(read_file(dir / "z" / "model.safetensors") == read_file(dir / "x" / "model.safetensors"));
  // Starting the same run again in its folder (allowed without --overwrite) makes a new run.
  train::run_training(xgt::tiny_sort_run(dir / "x", 4), log);
  CHECK(first_line(dir / "x" / "run_id.txt") != x);
  fs::remove_all(dir);
}

TEST_CASE("run id: a run saved before run ids (none in the state or the folder) still resumes",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("legacy_id");
  std::ostringstream log;
  train::run_training(xgt::tiny_sort_run(dir / "ref", 4), log);
  train::TrainOptions o = xgt::tiny_sort_run(dir / "old", 4);
  o.stop_at = 2;
  train::run_training(o, log);
  io::safetensors::File f = io::safetensors::load((dir / "old" / "train_state.safetensors").string());
  REQUIRE(f.metadata.erase("run_id") == 1);
  io::safetensors::save((dir / "old" / "train_state.safetensors").string(), f.tensors, f.metadata);
  REQUIRE(fs::remove(dir / "old" / "run_id.txt"));
  CHECK(train::run_training(xgt::resume_options(dir / "old"), log).steps_done == 4);
  CHECK_FALSE(fs::exists(dir / "old" / "run_id.txt"));  // it stays a run without an id
  CHECK(io::safetensors::load((dir / "old" / "train_state.safetensors").string()).metadata.count("run_id") == 0);
  CHECK(read_file(dir / "old" / "model.safetensors") == read_file(dir / "ref" / "model.safetensors"));
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: header metadata cannot make the loader allocate more than the file holds",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("bomb");
  std::ostringstream log;
  train::run_training(xgt::tiny_sort_run(dir, 1), log);
  const fs::path model = dir / "model.safetensors";
  const std::string good = read_file(model);
  set_metadata(model, "d_ff", "1000000000000");
  CHECK_THROWS_WITH(train::load_model(model.string()), Catch::Contains("d_ff") && Catch::Contains("exceeds the limit"));
  std::ofstream(model, std::ios::binary) << good;
  set_metadata(model, "layers", "1000");  // within the bounds, but not what the file holds
  CHECK_THROWS_WITH(train::load_model(model.string()), Catch::Contains("describes a model of") &&
                                                           Catch::Contains("the file holds"));
  // The same for --resume: the saved options against the saved parameters.
  set_metadata(dir / "train_state.safetensors", "opt.layers", "200");
  const train::TrainOptions again = xgt::resume_options(dir);
  CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("the checkpoint holds"));
  set_metadata(dir / "train_state.safetensors", "opt.layers", "100000000");
  CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("saved options are invalid") &&
                                                         Catch::Contains("--layers"));
  fs::remove_all(dir);
}
