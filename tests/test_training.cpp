// Training, generation and checkpoints: the loss falls and accuracy rises, a seed
// reproduces a run, resume continues the exact trajectory, generation with and without the
// KV cache agree, checkpoints reject malformed files. (Pictures: test_plots.cpp.)
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "helpers.hpp"
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/generate.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

// A small, fast configuration of the sort task (single-threaded for exact reproducibility).
train::TrainOptions small_sort(const fs::path& out, std::int64_t steps) {
  train::TrainOptions o;
  o.task = "sort";
  o.out = out.string();
  o.steps = steps;
  o.batch = 32;
  o.d_model = 32;
  o.heads = 4;
  o.kv_heads = 2;
  o.layers = 2;
  o.n_digits = 5;
  o.warmup = 20;
  o.heldout = 100;
  o.threads = 1;
  o.progress = false;
  o.plot = false;
  return o;
}

}  // namespace

TEST_CASE("train: a few hundred steps drive the loss well below its start and accuracy up", "[train]") {
  const fs::path dir = temp_dir("falls");
  std::ostringstream log;
  const train::TrainResult r = train::run_training(small_sort(dir, 250), log);
  INFO(log.str());
  REQUIRE(r.losses.size() == 250);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) first += r.losses[i] / 10, last += r.losses[r.losses.size() - 1 - i] / 10;
  CHECK(last < 0.2 * first);
  CHECK(r.metric_name == "heldout_exact_match");
  CHECK(r.metric > 0.5);  // an untrained model gets ~0 (10^5 possible answers)
  CHECK_THAT(log.str(), Catch::Contains("RESULT heldout_exact_match"));
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK(fs::exists(dir / "log.csv"));
  fs::remove_all(dir);
}

TEST_CASE("train: a fixed seed reproduces the same loss trajectory", "[train]") {
  const fs::path a = temp_dir("seed_a"), b = temp_dir("seed_b");
  std::ostringstream log;
  const auto ra = train::run_training(small_sort(a, 40), log);
  const auto rb = train::run_training(small_sort(b, 40), log);
  CHECK(ra.losses == rb.losses);  // bit for bit
  train::TrainOptions other = small_sort(b, 40);
  other.seed = 2;
  other.overwrite = true;  // b holds the seed-1 run
  CHECK(train::run_training(other, log).losses != ra.losses);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_CASE("train: resume continues the exact loss trajectory of an uninterrupted run", "[train][checkpoint]") {
  const fs::path whole = temp_dir("whole"), parts = temp_dir("parts");
  std::ostringstream log;
  train::TrainOptions o = small_sort(whole, 60);
  o.dropout = 0.1;       // the dropout generator's state must be restored too
  o.lr = 1.234567e-3;    // options must be saved exactly, not to six decimals
  o.weight_decay = 0.0123456789;
  const auto uninterrupted = train::run_training(o, log);
  train::TrainOptions first = o;
  first.out = parts.string();
  first.stop_at = 25;
  first.checkpoint_every = 1000;  // only the stop writes a checkpoint
  const auto before = train::run_training(first, log);
  REQUIRE(before.steps_done == 25);
  train::TrainOptions again;
  again.resume = parts.string();
  again.threads = 1;
  again.progress = false;
  again.plot = false;
  const auto after = train::run_training(again, log);
  REQUIRE(after.losses.size() == 35);
  std::vector<double> joined = before.losses;
  joined.insert(joined.end(), after.losses.begin(), after.losses.end());
  CHECK(joined == uninterrupted.losses);  // bit for bit, steps 26..60 included
  CHECK(after.metric == uninterrupted.metric);
  fs::remove_all(whole);
  fs::remove_all(parts);
}

TEST_CASE("generate: KV cache and full recomputation give the same tokens and logits", "[train][generate]") {
  Generator g(3);
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 20;
  c.d_model = 32;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = 2;
  nn::GPT gpt(c, g);
  gpt.eval();
  const std::vector<std::vector<std::int64_t>> prompts = {{1, 2, 3, 4}, {9, 9, 0, 10}};
  train::SampleOptions with, without;
  without.use_kv_cache = false;
  const auto a = train::generate(gpt, prompts, 10, with), b = train::generate(gpt, prompts, 10, without);
  CHECK(a.tokens == b.tokens);
  REQUIRE(a.logits.size() == b.logits.size());
  for (std::size_t i = 0; i < a.logits.size(); ++i) CHECK(max_abs_diff(a.logits[i], b.logits[i]) < 1e-5);
  // Sampling draws the same tokens on both paths from the same seed.
  Generator s1(7), s2(7);
  with.temperature = without.temperature = 1.0;
  with.top_k = without.top_k = 5;
  with.generator = &s1;
  without.generator = &s2;
  CHECK(train::generate(gpt, prompts, 10, with).tokens == train::generate(gpt, prompts, 10, without).tokens);

  nn::TransformerConfig e = c;
  e.V_vocab = 13;
  nn::EncoderDecoder ed(e, g);
  ed.eval();
  const IndexArray src({2, 5}, {1, 2, 3, 10, 10, 4, 5, 6, 7, 8});
  const std::vector<std::size_t> lengths{3, 5};
  train::SampleOptions cached, recomputed;
  recomputed.use_kv_cache = false;
  const auto x = train::generate(ed, src, lengths, 11, 8, cached);
  const auto z = train::generate(ed, src, lengths, 11, 8, recomputed);
  CHECK(x.tokens == z.tokens);
  REQUIRE(x.logits.size() == z.logits.size());
  for (std::size_t i = 0; i < x.logits.size(); ++i) CHECK(max_abs_diff(x.logits[i], z.logits[i]) < 1e-5);
}

TEST_CASE("checkpoint: save and load round-trip parameters and the configuration", "[train][checkpoint]") {
  const fs::path dir = temp_dir("roundtrip");
  std::ostringstream log;
  train::run_training(small_sort(dir, 5), log);
  train::LoadedModel m = train::load_model((dir / "model.safetensors").string());
  CHECK(m.info.kind == "gpt");
  CHECK(m.info.config.H_q == 4);
  CHECK(m.info.config.H_kv == 2);
  CHECK(m.info.vocab.size() == 11);
  const auto f = nn::safetensors::load((dir / "model.safetensors").string());
  for (const auto& [name, p] : m.module().named_parameters()) CHECK(max_abs_diff(p.value(), f.get(name)) == 0.0);
  fs::remove_all(dir);
}

TEST_CASE("checkpoint: malformed files are rejected with a message naming the problem", "[train][checkpoint][errors]") {
  const fs::path dir = temp_dir("bad");
  const std::string good = (dir / "good.safetensors").string();
  nn::safetensors::save(good, {{"a", Array::of({1.0, 2.0})}, {"b", Array::zeros({2, 2}, DType::float32)}}, {{"k", "v"}});
  const auto ok = nn::safetensors::load(good);
  CHECK(ok.metadata.at("k") == "v");
  CHECK(ok.get("a").to_vector() == std::vector<double>{1.0, 2.0});

  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header = bytes.substr(8, n), data = bytes.substr(8 + n);
  auto write = [&](const std::string& name, const std::string& content) {
    const std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  };
  auto with_header = [&](std::string h) {
    std::uint64_t len = h.size();
    return std::string(reinterpret_cast<const char*>(&len), 8) + h + data;
  };
  auto replace = [&](std::string s, const std::string& from, const std::string& to) {
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  CHECK_THROWS_WITH(nn::safetensors::load(write("short", "abc")), Catch::Contains("fewer than the 8-byte"));
  std::string huge = bytes;
  const std::uint64_t big = 1u << 30;
  std::memcpy(huge.data(), &big, 8);
  CHECK_THROWS_WITH(nn::safetensors::load(write("len", huge)), Catch::Contains("header length"));
  CHECK_THROWS_WITH(nn::safetensors::load(write("json", with_header("{not json"))), Catch::Contains("not valid JSON"));
  // A repeated key (here in the metadata) is refused, not silently resolved to one of them.
  CHECK_THROWS_WITH(nn::safetensors::load(write("dup", with_header(replace(header, "\"k\":\"v\"", "\"k\":\"v\",\"k\":\"w\"")))),
                    Catch::Contains("duplicate key \"k\""));
  CHECK_THROWS_WITH(nn::safetensors::load(write("dtype", with_header(replace(header, "\"F64\"", "\"I64\"")))),
                    Catch::Contains("I64 is not supported"));
  CHECK_THROWS_WITH(nn::safetensors::load(write("overlap", with_header(replace(header, "[16,32]", "[8,24]")))),
                    Catch::Contains("overlap"));
  CHECK_THROWS_WITH(nn::safetensors::load(write("outside", with_header(replace(header, "[16,32]", "[16,4000]")))),
                    Catch::Contains("outside"));
  CHECK_THROWS_WITH(nn::safetensors::load(write("size", with_header(replace(header, "[2,2]", "[2,3]")))),
                    Catch::Contains("needs 24"));
  CHECK_THROWS_WITH(nn::safetensors::load(write("trailing", bytes + "xyz")), Catch::Contains("3 trailing bytes"));
  // Tensor a shrunk to one element: bytes 8..16 then belong to no tensor.
  CHECK_THROWS_WITH(nn::safetensors::load(write("hole", with_header(replace(
                        header, "[0,16],\"dtype\":\"F64\",\"shape\":[2]", "[0,8],\"dtype\":\"F64\",\"shape\":[1]")))),
                    Catch::Contains("bytes 8..16") && Catch::Contains("belong to no tensor"));
  CHECK_THROWS_AS(nn::safetensors::load((dir / "missing").string()), FormatError);
  // Empty tensors take no bytes, wherever they stand.
  const std::string empty_mid = (dir / "empty.safetensors").string();
  nn::safetensors::save(empty_mid, {{"a", Array::of({1.0, 2.0})}, {"z", Array::zeros({0}, DType::float64)},
                                    {"b", Array::of({3.0, 4.0})}});
  const auto e = nn::safetensors::load(empty_mid);
  CHECK(e.get("z").size() == 0);
  CHECK(e.get("b").to_vector() == std::vector<double>{3.0, 4.0});

  // Shapes are checked against the model configuration.
  Generator g(1);
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 9;
  c.d_model = 16;
  c.H_q = 2;
  c.layers = 1;
  nn::GPT small(c, g);
  const std::string model = (dir / "model.safetensors").string();
  nn::safetensors::save_module(model, small);
  c.d_model = 32;
  nn::GPT wider(c, g);
  CHECK_THROWS_WITH(nn::safetensors::load_module(model, wider),
                    Catch::Contains("tok.weight") && Catch::Contains("(11, 16)") && Catch::Contains("(11, 32)"));
  fs::remove_all(dir);
}

TEST_CASE("train: charlm with a short context and checkpoint-every 0 run to the end", "[train]") {
  const fs::path dir = temp_dir("charlm");
  {
    std::ofstream text(dir / "text.txt");
    for (int i = 0; i < 40; ++i) text << "the quick brown fox jumps over the lazy dog. ";
  }
  train::TrainOptions o;
  o.task = "charlm";
  o.text = (dir / "text.txt").string();
  o.out = (dir / "out").string();
  o.context = 8;
  o.steps = 5;
  o.batch = 4;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.checkpoint_every = 0;
  o.progress = false;
  o.plot = false;
  std::ostringstream log;
  const auto r = train::run_training(o, log);
  CHECK(r.metric_name == "val_loss");
  CHECK(std::isfinite(r.metric));
  CHECK_THAT(log.str(), Catch::Contains("sample:"));
  CHECK(fs::exists(dir / "out" / "model.safetensors"));
  o.context = 1;
  CHECK_THROWS_WITH(train::run_training(o, log), Catch::Contains("--context 1: must be in [2, 8192]"));
  fs::remove_all(dir);
}
