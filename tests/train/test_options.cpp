// The option table of `xgrad train` (train/options.hpp): every use of an option follows its row.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/options.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using train::OptionRole;
using train::OptionSpec;
using train::TrainOptions;

namespace {

// A valid value of the row other than its default (by the row's own choices and range).
std::string other_value(const OptionSpec& s, const TrainOptions& d) {
  const std::string now = train::option_text(d, s);
  if (!s.choices.empty()) return s.choices.back() == now ? s.choices.front() : s.choices.back();
  if (std::holds_alternative<bool TrainOptions::*>(s.member)) return now == "true" ? "false" : "true";
  if (std::holds_alternative<std::string TrainOptions::*>(s.member)) return now + "/other";
  if (std::holds_alternative<double TrainOptions::*>(s.member)) return s.ranged && s.hi <= 1 ? "0.25" : "7.5";
  return now == "3" ? "4" : "3";
}

}  // namespace

TEST_CASE("option table: every run option survives the checkpoint metadata round trip", "[options]") {
  const TrainOptions d;
  std::size_t run_options = 0;
  for (const OptionSpec& s : train::option_schema()) {
    if (s.role != OptionRole::run) continue;
    ++run_options;
    TrainOptions o;
    train::set_option_text(o, s, other_value(s, d), s.name);
    REQUIRE(train::option_text(o, s) != train::option_text(d, s));
    const auto meta = train::options_metadata(o);
    REQUIRE(meta.count("opt." + s.name) == 1);
    const TrainOptions back = train::options_from_metadata(meta, TrainOptions{}, "state");
    CHECK(train::option_text(back, s) == train::option_text(o, s));
  }
  CHECK(run_options >= 29);  // every option saved before the table existed
}

TEST_CASE("option table: the session and start options are not saved", "[options]") {
  TrainOptions o;
  o.threads = 2;
  o.stop_at = 3;
  o.out = "elsewhere";
  const auto meta = train::options_metadata(o);
  for (const char* k : {"opt.threads", "opt.stop_at", "opt.out", "opt.resume", "opt.progress", "opt.overwrite"})
    CHECK(meta.count(k) == 0);
}

TEST_CASE("option table: a checkpoint lacking an option added later reads its legacy value", "[options]") {
  TrainOptions o;
  o.window = 4;
  o.pos = "alibi";
  o.dtype = "float64";
  auto meta = train::options_metadata(o);
  CHECK(meta.count("opt.init_from") == 0);  // empty: not written, as before the option existed
  for (const char* k : {"opt.window", "opt.pos", "opt.dtype", "opt.rope_base"}) meta.erase(k);
  const TrainOptions back = train::options_from_metadata(meta, o, "state");
  CHECK(back.window == 0);
  CHECK(back.pos == "learned");
  CHECK(back.dtype == "float32");
  meta.erase("opt.batch");
  CHECK_THROWS_WITH(train::options_from_metadata(meta, o, "state"), Catch::Contains("lacks option 'batch'"));
}

TEST_CASE("option table: a malformed saved value is a FormatError naming the key", "[options]") {
  auto meta = train::options_metadata(TrainOptions{});
  meta["opt.d_model"] = "sixty";
  CHECK_THROWS_AS(train::options_from_metadata(meta, TrainOptions{}, "state"), FormatError);
  CHECK_THROWS_WITH(train::options_from_metadata(meta, TrainOptions{}, "state"), Catch::Contains("opt.d_model"));
}

TEST_CASE("option table: each flag is either run-defining or a session flag and --resume is neither", "[options]") {
  const auto run = train::run_defining_flags(), session = train::session_flags();
  for (const OptionSpec& s : train::option_schema()) {
    if (s.flag.empty()) continue;
    const bool in_run = std::find(run.begin(), run.end(), s.flag) != run.end();
    const bool in_session = std::find(session.begin(), session.end(), s.flag) != session.end();
    if (s.name == "resume")
      CHECK((!in_run && !in_session));
    else
      CHECK(in_run != in_session);
  }
  CHECK(std::find(session.begin(), session.end(), "--threads") != session.end());
  CHECK(std::find(run.begin(), run.end(), "--d-model") != run.end());
}

TEST_CASE("option table: range and choice rules come from the row", "[options]") {
  TrainOptions o = train::with_defaults(TrainOptions{});
  o.d_model = 0;
  CHECK_THROWS_WITH(train::validate_options(o), Catch::Contains("--d-model 0: must be in [1, 8192]"));
  o = train::with_defaults(TrainOptions{});
  o.pos = "sinusoid";
  CHECK_THROWS_WITH(train::validate_options(o), Catch::Contains("--pos sinusoid: must be learned, rope, alibi or none"));
  o = train::with_defaults(TrainOptions{});
  o.dropout = 1.0;
  CHECK_THROWS_WITH(train::validate_options(o), Catch::Contains("--dropout 1: must be a number in [0, 1)"));
  o = train::with_defaults(TrainOptions{});
  o.threads = 2000;
  CHECK_THROWS_WITH(train::validate_session_options(o), Catch::Contains("--threads 2000"));
}

TEST_CASE("option table: an option for another task or position scheme is refused", "[options]") {
  TrainOptions o;
  CHECK_THROWS_WITH(train::check_options_apply(o, {"text"}), Catch::Contains("--text is only for --task charlm"));
  CHECK_THROWS_WITH(train::check_options_apply(o, {"rope_base"}), Catch::Contains("--rope-base is only for --pos rope"));
  CHECK_NOTHROW(train::check_options_apply(o, {"n_digits", "d_model"}));
  o.task = "charlm";
  CHECK_THROWS_WITH(train::check_options_apply(o, {"n_digits"}), Catch::Contains("--n-digits is only for --task sort"));
  CHECK_NOTHROW(train::check_options_apply(o, {"text", "context"}));
}

TEST_CASE("task alias: a new charlm run is the text task with the byte tokenizer", "[options]") {
  TrainOptions o;
  o.task = "charlm";
  train::resolve_task_alias(o, {"task"});
  CHECK(o.task == "text");
  CHECK(o.tokenizer == "bytes");
  // --tokenizer bytes may be said; any other tokenizer with --task charlm is refused, naming it.
  o = TrainOptions{};
  o.task = "charlm";
  o.tokenizer = "bytes";
  train::resolve_task_alias(o, {"task", "tokenizer"});
  CHECK(o.task == "text");
  o = TrainOptions{};
  o.task = "charlm";
  o.tokenizer = "tok.model";
  CHECK_THROWS_AS(train::resolve_task_alias(o, {"task", "tokenizer"}), UsageError);
  CHECK_THROWS_WITH(train::resolve_task_alias(o, {"task", "tokenizer"}),
                    Catch::Contains("--tokenizer tok.model with --task charlm") && Catch::Contains("--task text"));
  // A charlm model of 0.2.0 given to --init-from keeps its task (its vocabulary is its text's).
  o = TrainOptions{};
  o.task = "charlm";
  o.init_from = "old/model.safetensors";
  train::resolve_task_alias(o, {});
  CHECK(o.task == "charlm");
  // Other tasks are left alone.
  o = TrainOptions{};
  o.task = "sort";
  train::resolve_task_alias(o, {"task"});
  CHECK(o.task == "sort");
}

TEST_CASE("config json: the run's config.json read back gives the same run options", "[options]") {
  TrainOptions o;
  o.task = "charlm";
  o.text = "/data/corpus dir";  // config.json holds paths absolute (a relative one: tested below)
  o.steps = 100;
  o.pos = "rope";
  o.rope_fraction = 0.5;
  o.d_model = 48;
  o.lr = 0.001;
  o.dropout = 0.1;
  const std::string text = train::options_json(o);
  TrainOptions back;
  const std::set<std::string> set = train::apply_config_json(back, text, "config.json");
  for (const OptionSpec& s : train::option_schema())
    if (s.role == OptionRole::run) CHECK(train::option_text(back, s) == train::option_text(o, s));
  CHECK(set.count("d_model") == 1);
  CHECK(set.count("n_digits") == 0);  // a sort option: not in a charlm run's file
  CHECK_NOTHROW(train::check_options_apply(back, set));
}

TEST_CASE("config json: bad files are usage errors naming the key", "[options]") {
  TrainOptions o;
  auto refused = [&](const std::string& text, const std::string& words) {
    CHECK_THROWS_AS(train::apply_config_json(o, text, "exp.json"), UsageError);
    CHECK_THROWS_WITH(train::apply_config_json(o, text, "exp.json"), Catch::Contains(words));
  };
  refused("{\"d_model\": 16, \"d_model\": 32}", "duplicate key \"d_model\"");
  refused("{\"dmodel\": 16}", "key 'dmodel' is not an option");
  refused("{\"d_model\": \"16\"}", "key 'd_model' must be a number");
  refused("{\"d_model\": 16.5}", "key 'd_model'");
  refused("{\"d_model\": 0}", "key 'd_model' = 0: must be in [1, 8192]");
  refused("{\"task\": \"translate\"}", "key 'task' = \"translate\": must be sort, reverse, charlm or text");
  refused("{\"plot\": 1}", "key 'plot' must be true or false");
  refused("[]", "must be a JSON object");
  refused("{", "is not JSON");
}

TEST_CASE("config json: --config RUN/config.json repeats the run exactly", "[options]") {
  const auto dir = xgt::temp_dir("train_config_repeat");
  TrainOptions a;
  a.out = (dir / "a").string();
  a.steps = 3;
  a.batch = 4;
  a.d_model = 16;
  a.heads = 2;
  a.layers = 1;
  a.n_digits = 4;
  a.pos = "rope";
  a.dropout = 0.1;
  a.progress = a.plot = false;
  std::ostringstream log;
  train::run_training(a, log);
  TrainOptions b;
  const auto given = train::apply_config_json(b, xgt::read_file(dir / "a" / "config.json"), "config.json");
  CHECK(given.count("out") == 0);  // where a run is written is not part of it
  b.out = (dir / "b").string();
  b.progress = b.plot = false;
  train::run_training(b, log);
  CHECK(xgt::read_file(dir / "a" / "model.safetensors") == xgt::read_file(dir / "b" / "model.safetensors"));
  CHECK(xgt::read_file(dir / "a" / "config.json") == xgt::read_file(dir / "b" / "config.json"));
}

TEST_CASE("train --arch llama: the checkpoint names the architecture and loads and resumes as a Llama model", "[options][llama]") {
  const auto dir = xgt::temp_dir("train_arch_llama");
  TrainOptions a;
  a.out = (dir / "a").string();
  a.arch = "llama";
  a.pos = "rope";
  a.multiple_of = 32;
  a.tie_embeddings = false;
  a.steps = 4;
  a.stop_at = 2;
  a.batch = 4;
  a.d_model = 16;
  a.heads = 4;
  a.kv_heads = 2;
  a.layers = 2;
  a.n_digits = 4;
  a.progress = a.plot = false;
  std::ostringstream log;
  train::run_training(a, log);
  train::LoadedModel m = train::load_model((dir / "a" / "model.safetensors").string());
  CHECK(m.info.config.arch == nn::Architecture::llama);
  CHECK(m.info.config.multiple_of == 32);
  CHECK_FALSE(m.info.config.tie_embeddings);
  CHECK(m.info.config.d_ff == nn::llama_hidden_size(16, 32));
  CHECK(train::parameter_count(train::ModelKind::gpt, m.info.config) == m.module().parameter_count());
  bool has_gate = false, has_bias = false;
  for (const auto& [name, p] : m.module().named_parameters()) {
    has_gate = has_gate || name == "blocks.0.ffn.gate.W";
    has_bias = has_bias || name.find(".b") != std::string::npos;
  }
  CHECK(has_gate);
  CHECK_FALSE(has_bias);
  TrainOptions again;
  again.resume = a.out;
  again.progress = again.plot = false;
  const train::TrainResult r = train::run_training(again, log);
  CHECK(r.steps_done == 4);
  // A GPT-2 run of the same flags writes no architecture key (its checkpoints keep their bytes).
  TrainOptions g = a;
  g.arch = "gpt";
  g.pos = "learned";
  g.tie_embeddings = true;
  g.stop_at = -1;
  g.out = (dir / "g").string();
  train::run_training(g, log);
  CHECK(io::safetensors::load_header((dir / "g" / "model.safetensors").string()).metadata.count("arch") == 0);
  CHECK(train::options_metadata(g).count("opt.arch") == 0);
}

TEST_CASE("config json: overwrite and resume may not be set in a config file", "[options]") {
  for (const char* key : {"overwrite", "resume"}) {
    INFO(key);
    TrainOptions o;
    const std::string text = std::string("{\"steps\": 5, \"") + key + "\": " + (key[0] == 'o' ? "true" : "\"run\"") + "}";
    CHECK_THROWS_AS(train::apply_config_json(o, text, "exp.json"), UsageError);
    CHECK_THROWS_WITH(train::apply_config_json(o, text, "exp.json"),
                      Catch::Contains(std::string("key '") + key + "' may not be set in a config file") &&
                          Catch::Contains("--" + std::string(key)));
    CHECK_FALSE(o.overwrite);
  }
}

TEST_CASE("config json: a relative path in a config file is relative to the file's folder", "[options]") {
  TrainOptions o;
  const auto given = train::apply_config_json(
      o, R"({"task": "text", "text": "corpus", "tokenizer": "tok.model", "init_from": "/abs/m.safetensors"})",
      "/runs/exp/config.json");
  CHECK(given.count("text") == 1);
  CHECK(o.text == "/runs/exp/corpus");
  CHECK(o.tokenizer == "/runs/exp/tok.model");
  CHECK(o.init_from == "/abs/m.safetensors");  // absolute: as it is
  TrainOptions b;
  train::apply_config_json(b, R"({"task": "text", "tokenizer": "bytes", "text": "c.txt"})", "cfg/x.json");
  CHECK(b.tokenizer == "bytes");  // not a path
  CHECK(b.text == "cfg/c.txt");
  // config.json writes paths absolute, so it means the same from any folder.
  TrainOptions r;
  r.task = "text";
  r.text = "corpus";
  const std::string json = train::options_json(r);
  CHECK_THAT(json, Catch::Contains("\"text\": \"" + (std::filesystem::current_path() / "corpus").string() + "\""));
}

TEST_CASE("config json and the run line: real numbers as the shortest text that reads back", "[options]") {
  TrainOptions o;
  o.steps = 10;
  o.lr = 0.1;
  o.weight_decay = 0.3;
  o.min_lr_ratio = 0.05;
  const std::string json = train::options_json(o, 3);
  CHECK_THAT(json, Catch::Contains("\"lr\": 0.1,") && Catch::Contains("\"weight_decay\": 0.3,") &&
                       Catch::Contains("\"min_lr_ratio\": 0.05,") && Catch::Contains("\"threads\": 3"));
  CHECK_THAT(json, !Catch::Contains("0000000"));
  // It reads back to the same doubles (and the thread count the run used).
  TrainOptions back;
  train::apply_config_json(back, json, "config.json");
  CHECK(back.lr == o.lr);
  CHECK(back.weight_decay == o.weight_decay);
  CHECK(back.threads == 3);
  CHECK_THAT(train::describe_options(o), Catch::Contains("weight_decay 0.3") && Catch::Contains("min_lr_ratio 0.05"));
  // The checkpoint metadata keeps 17 digits (its bytes stay those older versions wrote).
  CHECK(train::options_metadata(o).at("opt.lr") == "0.10000000000000001");
}

TEST_CASE("options: every run option that shapes the run has a flag with help", "[options]") {
  for (const char* name : {"min_lr_ratio", "heldout", "min_len", "max_len"}) {
    INFO(name);
    const OptionSpec* s = train::find_option(name);
    REQUIRE(s != nullptr);
    std::string flag = std::string("--") + name;
    for (char& c : flag)
      if (c == '_') c = '-';
    CHECK(s->flag == flag);
    CHECK_FALSE(s->help.empty());
  }
}

TEST_CASE("config json: --config RUN/config.json repeats a run made with another thread count bit for bit",
          "[options][threads]") {
  // 3 threads: not the default (the cores) of the machines xgrad is tested on, so a repeat
  // that took the default would split its sums otherwise.
  const auto dir = xgt::temp_dir("train_config_threads");
  TrainOptions a;
  a.out = (dir / "a").string();
  a.steps = 4;
  a.batch = 32;  // large enough that 2 and 3 threads give other bits (checked below)
  a.d_model = 64;
  a.heads = 2;
  a.layers = 1;
  a.n_digits = 4;
  a.threads = 3;
  a.progress = a.plot = false;
  std::ostringstream log;
  train::run_training(a, log);
  CHECK_THAT(xgt::read_file(dir / "a" / "config.json"), Catch::Contains("\"threads\": 3"));
  TrainOptions b;
  const auto given = train::apply_config_json(b, xgt::read_file(dir / "a" / "config.json"), "config.json");
  CHECK(given.count("threads") == 1);
  CHECK(b.threads == 3);
  b.out = (dir / "b").string();
  b.progress = b.plot = false;
  CHECK(train::run_training(b, log).threads == 3);
  CHECK(xgt::read_file(dir / "a" / "model.safetensors") == xgt::read_file(dir / "b" / "model.safetensors"));
  // The thread count matters here: the same run on 2 threads ends with other bits (what a
  // repeat that took the default of a 2-core machine got before config.json recorded it).
  TrainOptions c = b;
  c.out = (dir / "c").string();
  c.threads = 2;
  train::run_training(c, log);
  // Not guaranteed (only equal bits are, for equal partitions): said, not asserted.
  if (xgt::read_file(dir / "a" / "model.safetensors") == xgt::read_file(dir / "c" / "model.safetensors"))
    WARN("2 and 3 threads gave the same bits here: this case does not show that the count matters");
}

TEST_CASE("option table: a flag is its option's name with dashes and --no-<name> for a switch that turns it off",
          "[options]") {
  for (const OptionSpec& s : train::option_schema()) {
    if (s.flag.empty()) continue;
    std::string dashed = s.name;
    for (char& c : dashed)
      if (c == '_') c = '-';
    INFO(s.name << " has the flag " << s.flag);
    CHECK(s.flag == (s.negated ? "--no-" : "--") + dashed);
    for (const std::string& old : s.deprecated) CHECK(old != s.flag);
  }
}
