// The checkpoint is one unit: resume refuses a model and state from different steps, a state
// with a missing or stray tensor, or one from another run; log.csv holds exactly the
// checkpoint's rows; run ids are made per run and kept by --resume.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "tests/support/helpers.hpp"
#include "tests/support/tiny_runs.hpp"
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/train/options.hpp>
#include <xgrad/train/tasks.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/text/tokenizer.hpp>
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

TEST_CASE("checkpoint: one unit on disk and resume refuses a model and state from different steps",
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
    CHECK(train::parameter_count(train::ModelKind::gpt, c) == nn::GPT(c, g).parameter_count());
    CHECK(train::parameter_count(train::ModelKind::encoder_decoder, c) == nn::EncoderDecoder(c, g).parameter_count());
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

TEST_CASE("checkpoint: a damaged vocabulary (entries swapped) is refused at load naming the first differing entry",
          "[train][checkpoint][vocabulary]") {
  const fs::path dir = fresh_dir("vocab");
  std::ostringstream log;
  train::run_training(xgt::tiny_sort_run(dir, 1), log);
  const fs::path model = dir / "model.safetensors";
  CHECK_NOTHROW(train::load_model(model.string()));
  // The sort task's tokens are the digits and "|", in that order: two swapped are refused
  // (generate, eval, convert, report and inspect all load through load_model).
  set_metadata(model, "vocabulary", R"(["0","1","2","4","3","5","6","7","8","9","|"])");
  CHECK_THROWS_AS(train::load_model(model.string()), FormatError);
  CHECK_THROWS_WITH(train::load_model(model.string()),
                    Catch::Contains("vocabulary entry 3 is '4'") && Catch::Contains("the sort task has '3'"));
  // The byte tokenizer's vocabulary is exactly the 256 bytes in order.
  nn::TransformerConfig c;
  c.V_vocab = 256;
  c.context = 8;
  c.d_model = 16;
  c.H_q = 2;
  c.layers = 1;
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "text";
  info.config = c.resolved();
  info.task_params = text::tokenizer_metadata(*text::make_byte_tokenizer());
  for (int b = 0; b < 256; ++b) info.vocab.tokens.push_back(std::string(1, static_cast<char>(b)));
  CHECK(train::model_info(train::model_metadata(info), "m").vocab.tokens == info.vocab.tokens);
  std::swap(info.vocab.tokens[97], info.vocab.tokens[98]);
  CHECK_THROWS_WITH(train::model_info(train::model_metadata(info), "m"),
                    Catch::Contains("vocabulary entry 97 is 'b'") && Catch::Contains("bytes tokenizer"));
  // Cut messages: a long token is shown cut, with its size.
  std::swap(info.vocab.tokens[97], info.vocab.tokens[98]);
  info.vocab.tokens[5] = std::string(5000, 'z');
  const io::safetensors::Metadata long_token = train::model_metadata(info);
  try {
    train::model_info(long_token, "m");
    FAIL("a 5000-byte token was accepted");
  } catch (const FormatError& e) {
    CHECK(std::string(e.what()).size() < 400);
    CHECK_THAT(e.what(), Catch::Contains("(5000 bytes)"));
  }
  // charlm's vocabulary (no tokenizer): distinct single bytes in increasing order.
  info.task = "charlm";
  info.task_params.clear();
  info.vocab.tokens.clear();
  for (int b = 0; b < 256; ++b) info.vocab.tokens.push_back(std::string(1, static_cast<char>(b)));
  CHECK_NOTHROW(train::model_info(train::model_metadata(info), "m"));
  std::swap(info.vocab.tokens[10], info.vocab.tokens[11]);
  CHECK_THROWS_WITH(train::model_info(train::model_metadata(info), "m"), Catch::Contains("vocabulary entry 11"));
  fs::remove_all(dir);
}

TEST_CASE("resume: a state with --pos rope that lacks a RoPE key is refused and never resumed with the default",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("rope_keys");
  std::ostringstream log;
  train::TrainOptions o = xgt::tiny_sort_run(dir / "rope", 4);
  o.pos = "rope";
  o.rope_base = 500;  // not the default: a resume that defaulted it would train another model
  o.stop_at = 2;
  train::run_training(o, log);
  const fs::path state = dir / "rope" / "train_state.safetensors";
  const std::string saved = xgt::read_file(state);
  for (const char* key : {"opt.rope_base", "opt.rope_fraction", "opt.rope_layout"}) {
    INFO(key);
    io::safetensors::File f = io::safetensors::load(state.string());
    REQUIRE(f.metadata.erase(key) == 1);
    io::safetensors::save(state.string(), f.tensors, f.metadata);
    CHECK_THROWS_WITH(train::run_training(xgt::resume_options(dir / "rope"), log),
                      Catch::Contains("opt.pos rope") && Catch::Contains(std::string("lacks '") + key + "'"));
    std::ofstream(state, std::ios::binary) << saved;
  }
  CHECK(train::run_training(xgt::resume_options(dir / "rope"), log).steps_done == 4);
  // A state older than positions (no opt.pos and no RoPE keys): learned positions, resumes.
  train::TrainOptions l = xgt::tiny_sort_run(dir / "learned", 4);
  l.stop_at = 2;
  train::run_training(l, log);
  const fs::path lstate = dir / "learned" / "train_state.safetensors";
  io::safetensors::File f = io::safetensors::load(lstate.string());
  for (const char* key : {"opt.pos", "opt.rope_base", "opt.rope_fraction", "opt.rope_layout"})
    REQUIRE(f.metadata.erase(key) == 1);
  io::safetensors::save(lstate.string(), f.tensors, f.metadata);
  CHECK(train::run_training(xgt::resume_options(dir / "learned"), log).steps_done == 4);
  fs::remove_all(dir);
}

TEST_CASE("resume: the run options a state may lack and the value each then has", "[train][checkpoint]") {
  // States of xgrad 0.2.0 (tests/fixtures/runs_v0, resumed by check_saved_runs.py) hold every
  // run option but these, added since: each written only when not at this value, so a state
  // without it means that value.
  const std::map<std::string, std::string> added_since_0_2 = {
      {"tokenizer", "bytes"}, {"val_fraction", "0.10000000000000001"}, {"init_from", ""},       {"arch", "gpt"},
      {"multiple_of", "256"}, {"norm_eps", "1.0000000000000001e-05"},  {"tie_embeddings", "true"},
      {"grad_accum", "1"},    {"doc_separator", "none"},    {"vocab_size", "0"},                     {"model_context", "0"},
      {"lora_rank", "0"},     {"lora_alpha", "16"},                    {"lora_targets", "all"},    {"freeze", ""},
      {"bias", "true"}};
  // And these, written by 0.2.0 always, have the value runs had before they existed (learned
  // positions, float32, no window); a RoPE key is required beside opt.pos rope (above).
  const std::map<std::string, std::string> older = {{"dtype", "float32"},    {"pos", "learned"},
                                                    {"rope_base", "10000"},  {"rope_fraction", "1"},
                                                    {"rope_layout", "interleaved"}, {"window", "0"}};
  std::map<std::string, std::string> legacy, omitted;
  for (const train::OptionSpec& s : train::option_schema()) {
    if (s.role != train::OptionRole::run || !s.has_legacy) continue;
    (s.omit_when_legacy ? omitted : legacy)[s.name] = s.legacy;
  }
  CHECK(omitted == added_since_0_2);
  CHECK(legacy == older);
}

TEST_CASE("resume: a log.csv copied in from another run is refused (the state holds its digest)",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("log_digest");
  std::ostringstream log;
  for (const char* name : {"a", "b"}) {
    train::TrainOptions o = xgt::tiny_sort_run(dir / name, 4);
    o.stop_at = 2;
    train::run_training(o, log);
  }
  // Both logs are well formed, with rows 1..2: b's log in a's folder is not a's.
  const std::string a_log = xgt::read_file(dir / "a" / "log.csv");
  fs::copy_file(dir / "b" / "log.csv", dir / "a" / "log.csv", fs::copy_options::overwrite_existing);
  REQUIRE(xgt::read_file(dir / "a" / "log.csv") != a_log);
  CHECK_THROWS_WITH(train::run_training(xgt::resume_options(dir / "a"), log),
                    Catch::Contains("log.csv") && Catch::Contains("not this run's log"));
  CHECK(xgt::read_file(dir / "a" / "log.csv") != a_log);  // nothing rewritten by the refusal
  std::ofstream(dir / "a" / "log.csv", std::ios::binary) << a_log;
  CHECK(train::run_training(xgt::resume_options(dir / "a"), log).steps_done == 4);
  fs::remove_all(dir);
}

TEST_CASE("init-from: a model with another vocabulary is refused in one short line naming the first differing entry",
          "[train][checkpoint][init_from]") {
  const fs::path dir = fresh_dir("init_from_vocab");
  std::string lower, upper;
  for (int i = 0; i < 20; ++i) {
    lower += "abcdefghijklmnopqrstuvwxyz\n";
    upper += "ABCDEFGHIJKLMNOPQRSTUVWXYZ\n";
  }
  write_file(dir / "lower.txt", lower);
  write_file(dir / "upper.txt", upper);
  // A charlm model (as xgrad 0.2.0 saved them) of the lower-case text.
  nn::TransformerConfig c;
  c.context = 8;
  c.d_model = 16;
  c.H_q = 2;
  c.layers = 1;
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "charlm";
  info.vocab = train::CharLMTask((dir / "lower.txt").string(), c.context).vocab();
  c.V_vocab = info.vocab.size();
  info.config = c.resolved();
  Generator g(1);
  nn::GPT model(info.config, g);
  const std::string path = (dir / "lower.safetensors").string();
  nn::safetensors::save_module(path, model, train::model_metadata(info));
  // Starting from it on the upper-case text: the vocabularies differ.
  train::TrainOptions o = xgt::tiny_sort_run(dir / "run", 2);
  o.init_from = path;
  o.text = (dir / "upper.txt").string();
  const std::set<std::string> given = {"init_from", "text"};
  train::apply_init_from(o, given);
  REQUIRE(o.task == "charlm");
  try {
    std::ostringstream log;
    train::run_training(o, log);
    FAIL("a model of another vocabulary was accepted");
  } catch (const UsageError& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK_THAT(m, Catch::Contains("vocabulary differs (") && Catch::Contains("entry 1 'a' vs 'A'") &&
                      Catch::Contains("27 vs 27 tokens"));
    CHECK(m.find("abcdefghij") == std::string::npos);  // not the vocabulary itself
    CHECK(m.size() < 400);
  }
  fs::remove_all(dir);
}
