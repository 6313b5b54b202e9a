// The model schema (train/model_schema.hpp): its rows drive the checkpoint metadata both ways,
// every row is written and read, and the checkpoints saved before it (tests/fixtures/checkpoints,
// made by commit 659e72a's xgrad) still load, re-save the same metadata and run.
#include <catch2/catch.hpp>

#include "tests/support/helpers.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include <xgrad/io/safetensors.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/ops/unary.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/model_schema.hpp>
#include <xgrad/train/options.hpp>
#include <xgrad/train/trainer.hpp>

#include "tests/support/tiny_runs.hpp"

using namespace xg;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(XGRAD_CHECKPOINT_FIXTURES);
const std::vector<std::string> kFixtureFiles = {"sort.safetensors", "reverse.safetensors", "text_llama.safetensors",
                                                "text_sp.safetensors", "llama2c.safetensors"};

// The metadata without the keys written at save time (step, version).
io::safetensors::Metadata description_of(io::safetensors::Metadata m) {
  for (const std::string& k : train::save_keys()) m.erase(k);
  return m;
}

// The registered layers the rows layer_activation, layer_norm, layer_attention and layer_mlp name (a program must have
// registered a name to read it back). Their factories are never called here: no model is built.
void register_schema_layers() {
  if (!nn::is_registered(nn::LayerKind::activation, "schema_test_act"))
    nn::register_activation("schema_test_act", [](const Tensor& x) { return ops::silu(x); });
  if (!nn::is_registered(nn::LayerKind::norm, "schema_test_norm"))
    nn::register_norm("schema_test_norm", [](const nn::TransformerConfig&, std::size_t) {
      return std::unique_ptr<nn::NormLayer>();
    });
  if (!nn::is_registered(nn::LayerKind::attention, "schema_test_attention"))
    nn::register_attention("schema_test_attention", [](const Tensor& Q, const Tensor& K, const Tensor& V,
                                                       const nn::Visibility& vis, const nn::SdpaOptions& o) {
      return nn::attention(Q, K, V, vis, o);
    });
  if (!nn::is_registered(nn::LayerKind::mlp, "schema_test_mlp"))
    nn::register_mlp("schema_test_mlp", [](const nn::TransformerConfig&, Generator&) {
      return std::unique_ptr<nn::MLPLayer>();
    });
}

// A model description in which every row has a key: a Llama GPT with a window, RoPE, a
// registered activation and norm, and every carried field. (A registered mlp replaces the
// activation's feed-forward, so layer_mlp is the one row it leaves out; the test names it.)
train::ModelInfo every_row() {
  register_schema_layers();
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "text";
  nn::TransformerConfig& c = info.config;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.rope.base = 500000.0;
  c.rope.fraction = 0.5;
  c.rope.layout = ops::RopeLayout::half_split;
  c.norm_eps = 1e-6;
  c.multiple_of = 32;
  c.tie_embeddings = false;
  c.window = 5;
  c.d_model = 16;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = 2;
  c.context = 12;
  c.dtype = DType::float64;
  c.activation = "schema_test_act";
  c.norm = "schema_test_norm";
  c.attention = "schema_test_attention";
  for (int i = 0; i < 7; ++i) info.vocab.tokens.push_back(text::placeholder_token(static_cast<std::size_t>(i)));
  c.V_vocab = info.vocab.size();
  for (const train::ModelField& f : train::model_schema())
    if (f.presence == train::ModelField::Presence::carried) info.task_params[f.key] = "value of " + f.key;
  return info;
}

}  // namespace

TEST_CASE("model schema: every row is written for a model that has every field", "[model_schema]") {
  const io::safetensors::Metadata m = train::model_metadata(every_row());
  std::set<std::string> rows;
  for (const train::ModelField& f : train::model_schema()) {
    rows.insert(f.key);
    INFO(f.key);
    if (f.key == "layer_mlp") {  // with a registered mlp in place of the activation's feed-forward
      train::ModelInfo mlp = every_row();
      mlp.config.activation.clear();
      mlp.config.mlp = "schema_test_mlp";
      const io::safetensors::Metadata mm = train::model_metadata(mlp);
      CHECK(mm.count(f.key) == 1);
      CHECK(mm.count("layer_activation") == 0);
      continue;
    }
    if (f.key == "bias") {  // GPT-2 blocks without biases (the every-row model is a Llama one)
      train::ModelInfo gpt = every_row();
      gpt.config.arch = nn::Architecture::gpt;
      gpt.config.tie_embeddings = true;
      gpt.config.bias = false;
      const io::safetensors::Metadata mm = train::model_metadata(gpt);
      CHECK(mm.at(f.key) == "false");
      CHECK(m.count(f.key) == 0);  // a Llama model writes none
      continue;
    }
    CHECK(m.count(f.key) == 1);
    CHECK_FALSE(f.help.empty());
  }
  CHECK(rows.size() == train::model_schema().size());  // each key once
  for (const auto& [k, v] : m) CHECK(rows.count(k) == 1);  // nothing written but by a row
}

TEST_CASE("model schema: metadata written by the rows reads back to the same model and the same metadata",
          "[model_schema]") {
  const train::ModelInfo info = every_row();
  // Carried fields are text: a tokenizer would be checked against the vocabulary, so leave them out here.
  train::ModelInfo plain = info;
  plain.task_params.clear();
  plain.task = "sort-like";  // a task this trainer does not know: no fixed vocabulary to check
  const io::safetensors::Metadata m = train::model_metadata(plain);
  const train::ModelInfo back = train::model_info(m, "m.safetensors");
  const nn::TransformerConfig a = plain.config.resolved(), &b = back.config;
  CHECK(back.kind == train::ModelKind::gpt);
  CHECK(back.task == "sort-like");
  CHECK(back.vocab.tokens == plain.vocab.tokens);
  CHECK((b.arch == a.arch && b.pos == a.pos && b.rope.layout == a.rope.layout));
  CHECK(b.rope.base == a.rope.base);
  CHECK(b.rope.fraction == a.rope.fraction);
  CHECK(b.norm_eps == a.norm_eps);
  CHECK(b.multiple_of == a.multiple_of);
  CHECK(b.tie_embeddings == a.tie_embeddings);
  CHECK(b.window == a.window);
  CHECK(b.dtype == a.dtype);
  CHECK((b.d_model == a.d_model && b.H_q == a.H_q && b.H_kv == a.H_kv && b.layers == a.layers && b.d_ff == a.d_ff &&
         b.context == a.context && b.V_vocab == a.V_vocab));
  CHECK(train::model_metadata(back) == m);
}

TEST_CASE("model schema: a missing key is refused by name and an optional one means its default", "[model_schema]") {
  train::ModelInfo info = every_row();
  info.task_params.clear();
  info.task = "other";
  const io::safetensors::Metadata m = train::model_metadata(info);
  for (const train::ModelField& f : train::model_schema()) {
    if (f.presence == train::ModelField::Presence::carried || !f.set) continue;
    io::safetensors::Metadata without = m;
    without.erase(f.key);
    INFO(f.key);
    if (f.presence == train::ModelField::Presence::unless_default) {
      // Absent: the default, so the rows that depend on it are not read either.
      try {
        const train::ModelInfo back = train::model_info(without, "m.safetensors");
        CHECK_FALSE(f.written(back));
      } catch (const FormatError& e) {  // e.g. without pos rope, llama's RoPE requirement
        CHECK(std::string(e.what()).find("m.safetensors") != std::string::npos);
      }
    } else {
      CHECK_THROWS_WITH(train::model_info(without, "m.safetensors"),
                        Catch::Contains("m.safetensors") && Catch::Contains("lacks '" + f.key + "'"));
    }
  }
}

TEST_CASE("model schema: each row names the option that sets it and each model option has a row", "[model_schema]") {
  // The rows name their options; the option table's model_key is derived from them.
  std::size_t shaping = 0;
  for (const train::ModelField& f : train::model_schema()) {
    if (f.option.empty()) continue;
    INFO(f.key + " <- " + f.option);
    const train::OptionSpec* s = train::find_option(f.option);
    REQUIRE(s != nullptr);
    CHECK(s->model_key == (f.option_shapes ? f.key : std::string()));
    shaping += f.option_shapes;
    // Only a model row (not carried) turns an option into a field by itself.
    if (f.from_option) CHECK(f.presence != train::ModelField::Presence::carried);
  }
  std::size_t keyed = 0;
  for (const train::OptionSpec& s : train::option_schema()) {
    if (s.model_key.empty()) continue;
    ++keyed;
    INFO(s.name + " -> " + s.model_key);
    const train::ModelField* f = train::find_model_field(s.model_key);
    REQUIRE(f != nullptr);
    CHECK(f->option == s.name);
  }
  CHECK(keyed == shaping);
  CHECK(shaping >= 20);  // the sizes, heads, dtype, arch, Llama's, window, positions, the task sizes
  // The carried fields that only feed a run are no model options.
  for (const char* name : {"tokenizer", "doc_separator", "val_fraction"}) CHECK(train::find_option(name)->model_key.empty());
}

TEST_CASE("model schema: the options' special values become the model's fields through the rows", "[model_schema]") {
  train::TrainOptions o;
  o.d_model = 32;
  o.heads = 4;
  o.layers = 3;
  // The defaults: kv_heads 0 and d_ff 0 are the field's own 0 (resolved derives them), window 0 none.
  train::ModelInfo m = train::model_from_options(o);
  CHECK(m.config.dtype == DType::float32);
  CHECK((m.config.H_kv == 0 && m.config.d_ff == 0 && m.config.window == 0));
  m.config.V_vocab = 10;
  m.config.context = 8;
  const nn::TransformerConfig r = m.config.resolved();
  CHECK((r.d_model == 32 && r.H_q == 4 && r.H_kv == 4 && r.layers == 3 && r.d_ff == 128));
  m.config = r;
  CHECK(train::model_metadata(m).count("window") == 0);  // no window: the key is left out
  // --dtype bfloat16: float32 parameters (the matmuls' inputs are the run's matter).
  o.dtype = "bfloat16";
  CHECK(train::model_from_options(o).config.dtype == DType::float32);
  o.dtype = "float64";
  CHECK(train::model_from_options(o).config.dtype == DType::float64);
  // Llama's rows apply under --arch llama only; RoPE's under --pos rope only.
  o.norm_eps = 1e-6;
  o.rope_base = 500000.0;
  CHECK(train::model_from_options(o).config.norm_eps == 1e-5);
  CHECK(train::model_from_options(o).config.rope.base == 10000.0);
  o.arch = "llama";
  o.pos = "rope";
  o.window = 3;
  o.kv_heads = 2;
  const nn::TransformerConfig l = train::model_from_options(o).config;
  CHECK((l.arch == nn::Architecture::llama && l.pos == nn::PositionScheme::rope));
  CHECK(l.norm_eps == 1e-6);
  CHECK(l.rope.base == 500000.0);
  CHECK((l.window == 3 && l.H_kv == 2));
}

TEST_CASE("model schema: enums for the model and the task", "[model_schema]") {
  CHECK(train::model_kind_from_name("gpt") == train::ModelKind::gpt);
  CHECK(train::model_kind_from_name(train::model_kind_name(train::ModelKind::encoder_decoder)) ==
        train::ModelKind::encoder_decoder);
  CHECK_THROWS_AS(train::model_kind_from_name("rnn"), ValueError);
  CHECK(train::task_kind("sort") == train::TaskKind::sort);
  CHECK(train::task_kind("text") == train::TaskKind::text);
  CHECK(train::task_kind("llama2c") == train::TaskKind::imported);
  CHECK(train::task_kind("custom") == train::TaskKind::imported);
}

TEST_CASE("model schema: checkpoints saved before it load and re-save the same metadata and run", "[model_schema]") {
  for (const std::string& name : kFixtureFiles) {
    const std::string path = (kFixtures / name).string();
    INFO(path);
    REQUIRE(fs::exists(path));
    const io::safetensors::Metadata saved = io::safetensors::load_header(path).metadata;
    const train::ModelInfo info = train::model_info(saved, path);
    // Every key is a row's or written at save time.
    for (const auto& [k, v] : saved) {
      INFO(k);
      const bool save_key =
          std::find(train::save_keys().begin(), train::save_keys().end(), k) != train::save_keys().end();
      CHECK((save_key || train::find_model_field(k) != nullptr));
    }
    CHECK(train::model_metadata(info) == description_of(saved));

    train::LoadedModel lm = train::load_model(path);
    const nn::TransformerConfig& c = lm.info.config;
    Generator gen(3);
    nn::SampleOptions so;
    so.temperature = 1.0;
    so.generator = &gen;
    nn::Generation g;
    if (lm.gpt) {
      g = nn::generate(*lm.gpt, {{0, 1}}, 4, so);
    } else {
      g = nn::generate(*lm.encdec, IndexArray({1, 2}, {0, 1}), {2}, 0, 4, so);
    }
    REQUIRE(g.tokens.size() == 1);
    CHECK(g.tokens[0].size() == 4);
    for (std::int64_t id : g.tokens[0]) CHECK((id >= 0 && static_cast<std::size_t>(id) < c.V_vocab));
    for (const Array& l : g.logits) {
      CHECK(l.shape() == Shape{1, c.V_vocab});
      for (double x : l.to_vector()) REQUIRE(std::isfinite(x));
    }
    // A text model decodes what it generates with the tokenizer it carries.
    if (saved.count("tokenizer") && (saved.at("tokenizer") != "sentencepiece" || text::sentencepiece_available())) {
      const auto tok = text::tokenizer_of_metadata(saved, path);
      CHECK(tok->vocab_size() == c.V_vocab);
      CHECK_NOTHROW(tok->decode(g.tokens[0]));
    }
  }
}

TEST_CASE("model schema: the imported llama2.c checkpoint is a Llama model of its file's sizes", "[model_schema]") {
  const std::string path = (kFixtures / "llama2c.safetensors").string();
  const train::ModelInfo info = train::model_info(io::safetensors::load_header(path).metadata, path);
  const nn::TransformerConfig& c = info.config;
  // write_llama2c.py's sizes: dim 16, hidden 32, 1 layer, 2 heads, 1 kv head, vocab 300, context 32, untied.
  CHECK(info.kind == train::ModelKind::gpt);
  CHECK(train::task_kind(info.task) == train::TaskKind::imported);
  CHECK((c.arch == nn::Architecture::llama && c.pos == nn::PositionScheme::rope && !c.tie_embeddings));
  CHECK((c.d_model == 16 && c.d_ff == 32 && c.layers == 1 && c.H_q == 2 && c.H_kv == 1 && c.V_vocab == 300 &&
         c.context == 32));
  CHECK(info.task_params.at("llama2c_format") == "legacy");
}

namespace {

// apply_init_from of the options `o` with the flags `given` (and --init-from) from `path`.
train::TrainOptions init_from(train::TrainOptions o, const std::string& path, std::set<std::string> given) {
  o.init_from = path;
  given.insert("init_from");
  train::apply_init_from(o, given);
  return o;
}

}  // namespace

TEST_CASE("model schema: --init-from compares each model option by the model it asks for", "[model_schema][init_from]") {
  // The sort fixture: d_model 8, H_q = H_kv = 2, d_ff 32 (4 d_model), float32, no window.
  const std::string sort = (kFixtures / "sort.safetensors").string();
  train::TrainOptions o;
  // Agreeing special values: taken, and the run keeps what it was given.
  o.dtype = "bfloat16";
  train::TrainOptions r = init_from(o, sort, {"dtype"});
  CHECK(r.dtype == "bfloat16");  // float32 parameters, bfloat16 matmuls
  CHECK((r.d_model == 8 && r.heads == 2 && r.layers == 1 && r.n_digits == 3));
  o = {};
  o.kv_heads = 0;
  o.d_ff = 0;
  o.window = 0;
  r = init_from(o, sort, {"kv_heads", "d_ff", "window"});
  CHECK((r.kv_heads == 0 && r.d_ff == 0 && r.window == 0));
  o = {};
  o.kv_heads = 2;
  o.d_ff = 32;
  CHECK(init_from(o, sort, {"kv_heads", "d_ff"}).kv_heads == 2);
  // Not given: the checkpoint's values.
  o = {};
  r = init_from(o, sort, {});
  CHECK((r.kv_heads == 2 && r.d_ff == 32 && r.dtype == "float32" && r.window == 0));
  // Differing: refused naming the flag, the key and both values.
  o = {};
  o.window = 4;
  CHECK_THROWS_WITH(init_from(o, sort, {"window"}),
                    Catch::Contains("--window 4 conflicts with --init-from " + sort + " (window 0); leave --window out"));
  o = {};
  o.d_ff = 16;
  CHECK_THROWS_WITH(init_from(o, sort, {"d_ff"}), Catch::Contains("--d-ff 16 conflicts with --init-from " + sort + " (d_ff 32)"));
  o = {};
  o.heads = 1;  // H_q 1 with H_kv 2 is no model: it differs, shown as given
  CHECK_THROWS_WITH(init_from(o, sort, {"heads"}), Catch::Contains("--heads 1 conflicts with --init-from " + sort + " (H_q 2)"));
  o = {};
  o.dtype = "float64";
  CHECK_THROWS_WITH(init_from(o, sort, {"dtype"}), Catch::Contains("--dtype float64 conflicts with --init-from " + sort + " (dtype float32)"));

  // The llama2.c fixture: H_q 2, H_kv 1, d_ff 32 (not llama_hidden_size(16, 256) = 256).
  const std::string l2c = (kFixtures / "llama2c.safetensors").string();
  o = {};
  o.task = "text";
  o.kv_heads = 0;
  CHECK_THROWS_WITH(init_from(o, l2c, {"task", "tokenizer", "kv_heads"}),
                    Catch::Contains("--kv-heads 0 (H_kv 2) conflicts with --init-from " + l2c + " (H_kv 1)"));
  o.kv_heads = 1;
  o.d_ff = 0;
  CHECK_THROWS_WITH(init_from(o, l2c, {"task", "tokenizer", "kv_heads", "d_ff"}),
                    Catch::Contains("--d-ff 0 (d_ff 256) conflicts with --init-from " + l2c + " (d_ff 32)"));
}

TEST_CASE("model schema: --dtype bfloat16 is a float32 model to --init-from", "[model_schema][init_from]") {
  const fs::path dir = xgt::temp_dir("model_schema_bf16");
  // The sort fixture's model in float64.
  const std::string sort = (kFixtures / "sort.safetensors").string();
  train::ModelInfo info = train::model_info(io::safetensors::load_header(sort).metadata, sort);
  info.config.dtype = DType::float64;
  const nn::TransformerConfig& c = info.config;
  Generator g(1);
  const nn::GPT model(c, g);
  const std::string path = (dir / "f64.safetensors").string();
  nn::safetensors::save_module(path, model, train::model_metadata(info));
  train::TrainOptions o;
  o.dtype = "bfloat16";
  CHECK_THROWS_WITH(init_from(o, path, {"dtype"}),
                    Catch::Contains("--dtype bfloat16 (dtype float32) conflicts with --init-from " + path +
                                    " (dtype float64); leave --dtype out"));
  o.dtype = "float64";
  CHECK(init_from(o, path, {"dtype"}).dtype == "float64");
  CHECK(init_from(train::TrainOptions{}, path, {}).dtype == "float64");
  fs::remove_all(dir);
}

TEST_CASE("model schema: bias false is written as false / absent means biases / other values are refused",
          "[model_schema]") {
  const std::string sort = (kFixtures / "sort.safetensors").string();
  const io::safetensors::Metadata saved = io::safetensors::load_header(sort).metadata;
  // A checkpoint saved before the row: biases, and re-saved without the key (the same bytes).
  train::ModelInfo info = train::model_info(saved, sort);
  CHECK(info.config.bias);
  CHECK(train::model_metadata(info).count("bias") == 0);
  info.config.bias = false;
  const io::safetensors::Metadata m = train::model_metadata(info);
  CHECK(m.at("bias") == "false");
  const train::ModelInfo back = train::model_info(m, "m.safetensors");
  CHECK_FALSE(back.config.bias);
  CHECK(train::model_metadata(back) == m);
  // The parameters the description counts: the biased model's less its biases.
  const std::size_t d = 8, f = 32, L = 1;
  CHECK(train::parameter_count(train::ModelKind::gpt, info.config.resolved()) + L * (2 * d + 3 * d + d + f + d) + d ==
        train::parameter_count(train::ModelKind::gpt, train::model_info(saved, sort).config));
  for (const char* bad : {"true", "no", "0", ""}) {
    io::safetensors::Metadata b = m;
    b["bias"] = bad;
    CHECK_THROWS_WITH(train::model_info(b, "m.safetensors"),
                      Catch::Contains("m.safetensors") && Catch::Contains("'bias'") && Catch::Contains("is not false"));
  }
  // Not for Llama blocks, nor an encoder-decoder.
  const std::string l2c = (kFixtures / "llama2c.safetensors").string();
  io::safetensors::Metadata llama = io::safetensors::load_header(l2c).metadata;
  llama["bias"] = "false";
  CHECK_THROWS_WITH(train::model_info(llama, l2c), Catch::Contains("'bias' is for GPT-2 blocks only"));
  const std::string rev = (kFixtures / "reverse.safetensors").string();
  io::safetensors::Metadata encdec = io::safetensors::load_header(rev).metadata;
  encdec["bias"] = "false";
  CHECK_THROWS_WITH(train::model_info(encdec, rev), Catch::Contains("'bias' is for GPT-2 blocks only"));
}

TEST_CASE("model schema: a --no-bias run saves a model without biases that loads and resumes bit for bit",
          "[model_schema][train]") {
  const fs::path dir = xgt::temp_dir("model_schema_no_bias");
  std::ostringstream log;
  train::TrainOptions o = xgt::tiny_sort_run(dir / "straight", 6);
  o.bias = false;
  const train::TrainResult straight = train::run_training(o, log);
  CHECK(straight.steps_done == 6);
  CHECK_THAT(log.str(), Catch::Contains("bias false"));  // the run's description line
  const std::string path = (dir / "straight" / "model.safetensors").string();
  const io::safetensors::File file = io::safetensors::load(path);
  CHECK(file.metadata.at("bias") == "false");
  for (const auto& [name, arr] : file.tensors) {
    INFO(name);
    CHECK(name.find(".b") == std::string::npos);  // no b, b_QKV, b_O
    CHECK(name.find("beta") == std::string::npos);
  }
  train::LoadedModel lm = train::load_model(path);
  REQUIRE(lm.gpt);
  CHECK_FALSE(lm.info.config.bias);
  CHECK(lm.gpt->parameter_count() == train::parameter_count(train::ModelKind::gpt, lm.info.config));
  // Stopped at step 3 and resumed (the option taken from the state): the same model, bit for bit.
  o.out = (dir / "resumed").string();
  o.stop_at = 3;
  CHECK(train::run_training(o, log).steps_done == 3);
  CHECK(train::run_training(xgt::resume_options(dir / "resumed"), log).steps_done == 6);
  const io::safetensors::File resumed = io::safetensors::load((dir / "resumed" / "model.safetensors").string());
  REQUIRE(resumed.tensors.size() == file.tensors.size());
  for (std::size_t i = 0; i < file.tensors.size(); ++i) {
    INFO(file.tensors[i].first);
    REQUIRE(resumed.tensors[i].first == file.tensors[i].first);
    CHECK(resumed.tensors[i].second.to_vector() == file.tensors[i].second.to_vector());
  }
  // --init-from it: the option taken; a run asking for biases is refused naming both.
  train::TrainOptions fine = xgt::tiny_sort_run(dir / "fine", 2);
  CHECK_FALSE(init_from(fine, path, {}).bias);
  fine.bias = true;
  CHECK_THROWS_WITH(init_from(fine, path, {"bias"}),  // as from --config {"bias": true}
                    Catch::Contains("--no-bias true conflicts with --init-from " + path + " (bias false); leave --no-bias out"));
  // And the other way: --no-bias against the sort fixture, which has biases.
  fine.bias = false;
  const std::string sort = (kFixtures / "sort.safetensors").string();
  CHECK_THROWS_WITH(init_from(fine, sort, {"bias"}),
                    Catch::Contains("--no-bias conflicts with --init-from " + sort + " (bias true); leave --no-bias out"));
  fs::remove_all(dir);
}
