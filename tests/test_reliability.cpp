// Reliability (issue 9, docs/reliability.md): each defect the issue found, as a test that
// failed before its fix. CLI-level behaviour (exit codes, one-line messages) is covered by
// the catalogue in tests/robustness/.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "helpers.hpp"
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/generate.hpp>
#include <xgrad/train/tasks.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return temp_dir("reliability_" + name); }

// The options of `xgrad train --resume dir` (quiet).
train::TrainOptions resuming(const fs::path& dir) {
  train::TrainOptions o;
  o.resume = dir.string();
  o.progress = o.plot = false;
  return o;
}

train::TrainOptions tiny(const fs::path& out, std::int64_t steps) {
  train::TrainOptions o;
  o.out = out.string();
  o.steps = steps;
  o.batch = 8;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.n_digits = 4;
  o.warmup = 2;
  o.heldout = 20;
  o.threads = 1;
  o.progress = false;
  o.plot = false;
  return o;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A safetensors file with this header JSON and data bytes.
void write_raw(const fs::path& p, const std::string& header, const std::string& data) {
  std::ofstream out(p, std::ios::binary);
  const std::uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

// Rewrites one metadata value of a saved safetensors file (tensors unchanged).
void set_metadata(const fs::path& p, const std::string& key, const std::string& value) {
  io::safetensors::File f = io::safetensors::load(p.string());
  f.metadata[key] = value;
  io::safetensors::save(p.string(), f.tensors, f.metadata);
}

}  // namespace

TEST_CASE("reliability 2: charlm on non-ASCII text checkpoints, resumes and generates", "[reliability][train]") {
  const fs::path dir = fresh_dir("utf8");
  {
    std::ofstream text(dir / "t.txt", std::ios::binary);
    for (int i = 0; i < 300; ++i) text << "\xc3\xa9" << (i % 7 == 0 ? "\xff" : "a");  // é and a stray byte
  }
  train::TrainOptions o = tiny(dir / "out", 4);
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
  const train::TrainOptions again = resuming(dir / "out");
  CHECK(train::run_training(again, log).steps_done == 4);
  // Vocabularies written before (JSON strings) still read.
  CHECK(train::Vocabulary::from_json("[\"a\",\"|\"]").tokens == std::vector<std::string>{"a", "|"});
  CHECK_THROWS_AS(train::Vocabulary::from_json("[[256]]"), FormatError);
  CHECK_THROWS_AS(train::Vocabulary::from_json("{}"), FormatError);
  // What cannot be saved is refused before training, never at the first checkpoint.
  train::TrainOptions bad = tiny(dir / "bad", 2);
  bad.task = "charlm";
  bad.context = 8;
  bad.text = (dir / "t.txt").string() + "\xff";  // the file name lands in the saved options
  fs::copy_file(dir / "t.txt", bad.text);
  CHECK_THROWS_WITH(train::run_training(bad, log), Catch::Contains("opt.text") && Catch::Contains("UTF-8"));
  CHECK_FALSE(fs::exists(dir / "bad" / "log.csv"));
  fs::remove_all(dir);
}

TEST_CASE("reliability 3: the checkpoint is one unit; resume refuses a model and state from different steps",
          "[reliability][checkpoint]") {
  const fs::path dir = fresh_dir("atomic");
  std::ostringstream log;
  train::TrainOptions o = tiny(dir, 6);
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
  const train::TrainOptions again = resuming(dir);
  CHECK_THROWS_WITH(train::run_training(again, log),
                    Catch::Contains("from step 4") && Catch::Contains("from step 3") && Catch::Contains("not one checkpoint"));
  set_metadata(dir / "model.safetensors", "step", "3");  // a consistent old pair resumes
  CHECK(train::run_training(again, log).steps_done == 6);
  fs::remove_all(dir);
}

TEST_CASE("reliability 4: metadata cannot make the loader allocate more than the file holds", "[reliability][checkpoint]") {
  const fs::path dir = fresh_dir("bomb");
  std::ostringstream log;
  train::run_training(tiny(dir, 1), log);
  const fs::path model = dir / "model.safetensors";
  const std::string good = slurp(model);
  set_metadata(model, "d_ff", "1000000000000");
  CHECK_THROWS_WITH(train::load_model(model.string()), Catch::Contains("d_ff") && Catch::Contains("exceeds the limit"));
  std::ofstream(model, std::ios::binary) << good;
  set_metadata(model, "layers", "1000");  // within the bounds, but not what the file holds
  CHECK_THROWS_WITH(train::load_model(model.string()), Catch::Contains("describes a model of") &&
                                                           Catch::Contains("the file holds"));
  // The same for --resume: the saved options against the saved parameters.
  set_metadata(dir / "train_state.safetensors", "opt.layers", "200");
  const train::TrainOptions again = resuming(dir);
  CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("the checkpoint holds"));
  set_metadata(dir / "train_state.safetensors", "opt.layers", "100000000");
  CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("saved options are invalid") &&
                                                         Catch::Contains("--layers"));
  fs::remove_all(dir);
}

TEST_CASE("reliability 4: parameter_count matches the built models", "[reliability][checkpoint]") {
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

TEST_CASE("reliability 5: sort with too few distinct problems is an error, not a hang", "[reliability][train]") {
  for (std::size_t digits : {1, 2}) {
    train::SortTask t(digits);
    CHECK_THROWS_WITH(t.heldout(500, 1), Catch::Contains("distinct problems") && Catch::Contains("500"));
  }
  CHECK(train::SortTask(3).heldout(500, 1).size() == 500);
  CHECK_THROWS_AS(train::ReverseTask(1, 1).heldout(500, 1), ValueError);
}

TEST_CASE("reliability 6: huge dimensions next to a zero are refused (no stride overflow)", "[reliability][checkpoint]") {
  const fs::path dir = fresh_dir("dims");
  write_raw(dir / "z.safetensors", R"({"a":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "");
  CHECK_THROWS_WITH(io::safetensors::load((dir / "z.safetensors").string()), Catch::Contains("implausibly large"));
  write_raw(dir / "one.safetensors", R"({"a":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", "");
  CHECK_THROWS_AS(io::safetensors::load((dir / "one.safetensors").string()), FormatError);
  write_raw(dir / "ok.safetensors", R"({"a":{"dtype":"F32","shape":[0,1024,1024],"data_offsets":[0,0]}})", "");
  CHECK(io::safetensors::load((dir / "ok.safetensors").string()).get("a").size() == 0);
  fs::remove_all(dir);
}

TEST_CASE("reliability 7: log.csv holds exactly the checkpoint's rows; a different run is not overwritten",
          "[reliability][train]") {
  const fs::path dir = fresh_dir("log");
  std::ostringstream log;
  train::TrainOptions o = tiny(dir, 6);
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
  const train::TrainOptions again = resuming(dir);
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
  const std::string before = slurp(dir / "train_state.safetensors");
  train::TrainOptions other = tiny(dir, 4);
  other.seed = 7;
  CHECK_THROWS_WITH(train::run_training(other, log), Catch::Contains("holds a different run") && Catch::Contains("seed"));
  CHECK(slurp(dir / "train_state.safetensors") == before);
  other.overwrite = true;
  CHECK(train::run_training(other, log).steps_done == 4);
  fs::remove_all(dir);
}

TEST_CASE("reliability 8: every option's range is checked before any work", "[reliability][train]") {
  const fs::path dir = fresh_dir("flags");
  std::ostringstream sink;
  auto refused = [&](auto edit, const std::string& flag) {
    train::TrainOptions o = tiny(dir / "never", 3);
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

TEST_CASE("reliability 8: checked conversions name the source", "[reliability]") {
  CHECK(train::parse_int("-12", "w") == -12);
  CHECK(train::parse_uint("12", "w") == 12);
  CHECK(train::parse_double("1.5e-3", "w") == 1.5e-3);
  for (const char* bad : {"", "x", "1x", " 1", "-", "99999999999999999999"})
    CHECK_THROWS_WITH(train::parse_int(bad, "log.csv:3"), Catch::Contains("log.csv:3"));
  CHECK_THROWS_AS(train::parse_uint("-1", "w"), FormatError);
  for (const char* bad : {"nan", "inf", "1e400", "1,5", ""}) CHECK_THROWS_AS(train::parse_double(bad, "w"), FormatError);
}

TEST_CASE("reliability 9: non-finite parameters are refused; no token from non-finite logits", "[reliability][generate]") {
  const fs::path dir = fresh_dir("nan");
  std::ostringstream log;
  train::run_training(tiny(dir, 1), log);
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
  train::SampleOptions so;
  CHECK_THROWS_WITH(train::pick_token({0.1, std::nan(""), 0.3}, so), Catch::Contains("token 1"));
  Generator g(1);
  so.generator = &g;
  so.temperature = 1.0;
  CHECK_THROWS_AS(train::pick_token({0.1, std::numeric_limits<double>::infinity()}, so), ValueError);
  fs::remove_all(dir);
}

TEST_CASE("reliability 10: API misuse fails with a clear error, by a stated rule", "[reliability][errors]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Generator g(3);
  const Tensor x(Array::full({2, 3}, 1.0, DType::float64), true);
  // log of NaN outside anomaly mode stays a value (anomaly mode is the tool for that).
  CHECK(std::isnan(ops::log(Tensor(Array::full({1}, nan, DType::float64))).item()));
  // dropout p = 1 would drop everything.
  CHECK_THROWS_WITH(ops::dropout(x, 1.0, g, true), Catch::Contains("[dropout]") && Catch::Contains("[0, 1)"));
  CHECK_THROWS_AS(ops::dropout_mask({2}, 1.0, g, DType::float64), ValueError);
  // clip_grad_norm: a negative (or zero, or NaN) maximum would flip or zero the gradient.
  ops::sum(x * x).backward();
  const nn::NamedTensors params{{"x", x}};
  for (double m : {-1.0, 0.0, nan})
    CHECK_THROWS_WITH(nn::clip_grad_norm(params, m), Catch::Contains("[clip_grad_norm] max_norm"));
  // AdamW with a NaN (or negative) learning rate: refused at the step, parameters untouched.
  nn::AdamW opt(params, nan);
  CHECK_THROWS_WITH(opt.step(), Catch::Contains("learning rate"));
  opt.lr = -1e-3;
  CHECK_THROWS_AS(opt.step(), ValueError);
  CHECK(x.value().to_vector() == std::vector<double>(6, 1.0));
  // A non-finite backward seed.
  const Tensor y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(Array::full({2, 3}, nan, DType::float64)), Catch::Contains("seed element 0"));
  // SDPA: scale 0 (Q and K ignored) and an additive mask that overflows the scores.
  const Tensor Q(Array::full({1, 1, 2, 4}, 0.5, DType::float64)), K = Q, V = Q;
  nn::SdpaOptions zero;
  zero.scale = 0.0;
  CHECK_THROWS_WITH(nn::attention(Q, K, V, nn::Visibility::causal(2, 2), zero), Catch::Contains("scale must be finite and > 0"));
  const nn::Visibility huge = nn::Visibility::additive(Array::full({2, 2}, 1e308, DType::float64));
  nn::SdpaOptions big;
  big.scale = 1e10;
  const Tensor Qb(Array::full({1, 1, 2, 4}, 1e300, DType::float64));
  CHECK_THROWS_AS(nn::attention(Qb, Qb, Qb, huge, big), ValueError);
  // SDPA with no queries works by definition (an empty output); a model call with T = 0 is an error.
  const Tensor Q0(Array::zeros({1, 1, 0, 4}, DType::float64));
  CHECK(nn::attention(Q0, K, V, nn::Visibility::all(), {}).shape() == Shape{1, 1, 0, 4});
  nn::TransformerConfig c;
  c.V_vocab = 5;
  c.context = 4;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = 1;
  nn::GPT gpt(c, g);
  CHECK_THROWS_WITH(gpt.logits(IndexArray({1, 0}, std::vector<std::int64_t>{})), Catch::Contains("T = 0"));
  // The value of a tensor whose tape is gone stays readable (values belong to tensors);
  // backward through it is a TapeError.
  Tensor z;
  {
    Tape tape;
    z = x * 3.0;
  }
  CHECK(z.value().to_vector() == std::vector<double>(6, 3.0));
  CHECK_THROWS_AS(ops::sum(z).backward(), TapeError);
}

TEST_CASE("reliability: threads: one tape per thread; a module is shared read-only under no_grad", "[reliability]") {
  Generator g(5);
  nn::TransformerConfig c;
  c.V_vocab = 7;
  c.context = 6;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = 1;
  nn::GPT shared(c, g);
  shared.eval();
  const IndexArray tokens({2, 5}, std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 5, 4, 3, 2});
  Array want;
  {
    NoGradGuard ng;
    want = shared.logits(tokens).value();
  }
  std::vector<Array> got(4);
  std::vector<std::vector<double>> grads(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      {
        NoGradGuard ng;  // forward of the shared module: nothing recorded, nothing written
        got[t] = shared.logits(tokens).value();
      }
      Tape tape;  // this thread's own graph
      const Tensor w(Array::full({3}, static_cast<double>(t + 1), DType::float64), true);
      ops::sum(w * w).backward();
      grads[t] = w.grad().to_vector();
    });
  for (auto& th : threads) th.join();
  for (std::size_t t = 0; t < got.size(); ++t) {
    CHECK(max_abs_diff(got[t], want) == 0.0);
    CHECK(grads[t] == std::vector<double>(3, 2.0 * static_cast<double>(t + 1)));
  }
}

namespace {

// Every file under `dir` (relative name -> bytes).
std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = slurp(e.path());
  return out;
}

std::string first_line(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

TEST_CASE("resume refuses a state without any one of its tensors or with a stray one and names it",
          "[reliability][checkpoint]") {
  const fs::path dir = fresh_dir("incomplete");
  std::ostringstream log;
  train::TrainOptions o = tiny(dir, 4);
  o.stop_at = 2;
  train::run_training(o, log);
  const fs::path state = dir / "train_state.safetensors";
  const std::string good = slurp(state);
  const io::safetensors::File f = io::safetensors::load(state.string());
  REQUIRE(f.tensors.size() > 6);
  std::size_t moments = 0;
  for (const auto& [name, a] : f.tensors) moments += name.rfind("optim.", 0) == 0;
  CHECK(moments == 2 * (f.tensors.size() - moments));  // exp_avg and exp_avg_sq of every parameter
  const train::TrainOptions again = resuming(dir);
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

TEST_CASE("resume refuses a state from another run naming both run ids and changes nothing",
          "[reliability][checkpoint]") {
  const fs::path dir = fresh_dir("other_run");
  std::ostringstream log;
  train::TrainOptions sort = tiny(dir / "sort", 6);
  sort.stop_at = 3;
  train::run_training(sort, log);
  train::TrainOptions reverse = tiny(dir / "reverse", 4);
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
  CHECK_THROWS_AS(train::run_training(resuming(dir / "sort"), log), FormatError);
  CHECK_THROWS_WITH(train::run_training(resuming(dir / "sort"), log),
                    Catch::Contains(sort_id) && Catch::Contains(reverse_id) && Catch::Contains("another run"));
  CHECK(folder_bytes(dir / "sort") == before);  // not the model, not the log, nothing
  fs::remove_all(dir);
}

TEST_CASE("a run id is made per run and kept by --resume and model.safetensors stays free of it",
          "[reliability][checkpoint]") {
  const fs::path dir = fresh_dir("run_id");
  std::ostringstream log;
  train::run_training(tiny(dir / "x", 4), log);
  train::run_training(tiny(dir / "y", 4), log);
  const std::string x = first_line(dir / "x" / "run_id.txt"), y = first_line(dir / "y" / "run_id.txt");
  CHECK(x != y);  // the same flags, two runs
  CHECK(io::safetensors::load((dir / "x" / "train_state.safetensors").string()).metadata.at("run_id") == x);
  // The model is the same bytes for the same flags (no run id in it).
  CHECK(slurp(dir / "x" / "model.safetensors") == slurp(dir / "y" / "model.safetensors"));
  CHECK(io::safetensors::load((dir / "x" / "model.safetensors").string()).metadata.count("run_id") == 0);
  // Stopped and resumed: the same id throughout, and the same end as the uninterrupted run.
  train::TrainOptions z = tiny(dir / "z", 4);
  z.stop_at = 2;
  train::run_training(z, log);
  const std::string id = first_line(dir / "z" / "run_id.txt");
  CHECK(train::run_training(resuming(dir / "z"), log).steps_done == 4);
  CHECK(first_line(dir / "z" / "run_id.txt") == id);
  CHECK(io::safetensors::load((dir / "z" / "train_state.safetensors").string()).metadata.at("run_id") == id);
  CHECK(slurp(dir / "z" / "model.safetensors") == slurp(dir / "x" / "model.safetensors"));
  // Starting the same run again in its folder (allowed without --overwrite) makes a new run.
  train::run_training(tiny(dir / "x", 4), log);
  CHECK(first_line(dir / "x" / "run_id.txt") != x);
  fs::remove_all(dir);
}

TEST_CASE("a run saved before run ids (none in the state or the folder) still resumes",
          "[reliability][checkpoint]") {
  const fs::path dir = fresh_dir("legacy_id");
  std::ostringstream log;
  train::run_training(tiny(dir / "ref", 4), log);
  train::TrainOptions o = tiny(dir / "old", 4);
  o.stop_at = 2;
  train::run_training(o, log);
  io::safetensors::File f = io::safetensors::load((dir / "old" / "train_state.safetensors").string());
  REQUIRE(f.metadata.erase("run_id") == 1);
  io::safetensors::save((dir / "old" / "train_state.safetensors").string(), f.tensors, f.metadata);
  REQUIRE(fs::remove(dir / "old" / "run_id.txt"));
  CHECK(train::run_training(resuming(dir / "old"), log).steps_done == 4);
  CHECK_FALSE(fs::exists(dir / "old" / "run_id.txt"));  // it stays a run without an id
  CHECK(io::safetensors::load((dir / "old" / "train_state.safetensors").string()).metadata.count("run_id") == 0);
  CHECK(slurp(dir / "old" / "model.safetensors") == slurp(dir / "ref" / "model.safetensors"));
  fs::remove_all(dir);
}
