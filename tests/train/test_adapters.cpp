// LoRA adapters and frozen weights in runs (train/adapters.hpp; `xgrad train --lora-rank
// --freeze`, `xgrad merge`): the adapters a run attaches and the parameters it freezes, a
// checkpoint that holds them and reloads into the same model, the frozen weights a resume
// reads back, and the refusals. The layer itself is tested in tests/nn/test_lora.cpp; the
// command lines in tests/robustness (cli-1850..1877, file-1550..1559).
#include <catch2/catch.hpp>

#include <filesystem>
#include <sstream>
#include <string>

#include "tests/support/helpers.hpp"
#include "tests/support/tiny_runs.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/nn/lora.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/adapters.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/detail/train_state.hpp>
#include <xgrad/train/llama2c.hpp>
#include <xgrad/train/options.hpp>
#include <xgrad/train/task.hpp>

using namespace xg;

namespace {

// A small Llama model of the sort task in float64, with `lora_rank` adapters on all projections.
train::TrainOptions options(std::size_t lora_rank, const std::string& freeze = "") {
  train::TrainOptions o;
  o.task = "sort";
  o.arch = "llama";
  o.pos = "rope";
  o.n_digits = 4;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 2;
  o.dtype = "float64";
  o.heldout = 8;
  o.threads = 1;
  o.lora_rank = lora_rank;
  o.lora_alpha = 6.0;
  o.freeze = freeze;
  return train::with_defaults(o);
}

IndexArray tokens(Generator& g, std::size_t B, std::size_t T, std::size_t V) {
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = static_cast<std::int64_t>(g.below(V));
  return IndexArray({B, T}, ids);
}

}  // namespace

TEST_CASE("adapters: a LoRA run's model trains only its adapters and reloads with them", "[adapters]") {
  auto comm = dist::make_local();
  const train::TrainOptions o = options(2);
  std::unique_ptr<train::Task> t = train::make_task(o, *comm);
  Generator init(3);
  t->build_model(init);
  const train::AdapterSummary s = train::apply_adapters(t->module(), o, init);
  CHECK(s.adapters == 2 * 7);
  // Rank 2 on q, k, v, o (16 -> 16) and gate, up (16 -> f), down (f -> 16), in 2 blocks.
  const std::size_t f = t->info().config.resolved().d_ff;
  CHECK(s.trainable_scalars == 2 * (4 * 2 * (16 + 16) + 3 * 2 * (16 + f)));
  CHECK(s.total_scalars == t->module().parameter_count());
  for (const auto& [name, p] : t->module().named_parameters()) {
    INFO(name);
    const bool adapter = name.find(".lora_") != std::string::npos;
    CHECK(p.requires_grad() == adapter);
  }
  // B away from zero, so the adapters change what the model computes.
  Generator g(4);
  for (auto& [name, p] : t->module().named_parameters())
    if (name.find("lora_B") != std::string::npos) {
      Tensor q = p;
      q.set_value(random_uniform(q.shape(), g, q.dtype(), -0.3, 0.3));
    }
  const auto dir = xgt::temp_dir("adapters");
  const std::string path = (dir / "model.safetensors").string();
  train::detail::save_model(*t, path, 1);
  const io::safetensors::Metadata meta = io::safetensors::load_header(path).metadata;
  CHECK(meta.at("lora.rank") == "2");
  CHECK(meta.at("lora.alpha") == "6");
  CHECK(meta.at("lora.targets") == "q,k,v,o,gate,up,down");
  CHECK(meta.at("frozen") == std::to_string(s.total_scalars - s.trainable_scalars));

  train::LoadedModel lm = train::load_model(path);
  REQUIRE(lm.gpt);
  CHECK(nn::count_adapters(*lm.gpt) == 14);
  CHECK(lm.module().parameter_count() == s.total_scalars);
  auto& trained = dynamic_cast<nn::GPT&>(t->module());
  trained.eval();
  const IndexArray x = tokens(g, 2, 6, lm.info.config.V_vocab), y = tokens(g, 2, 6, lm.info.config.V_vocab);
  const Tensor reloaded = lm.gpt->loss(x, y), original = trained.loss(x, y);
  // The same parameters in the same model, the same shapes and threads: the same bits.
  XGT_CHECK_SAME(reloaded.value(), original.value());
  // Merged: the base architecture's parameters, the adapted model's loss to rounding
  // (float64 sums of tens of products of numbers below 1: far below 1e-10).
  const std::size_t base = train::parameter_count(lm.info.kind, lm.info.config);
  CHECK(nn::merge_lora(*lm.gpt) == 14);
  CHECK(lm.module().parameter_count() == base);
  XGT_CHECK_WITHIN(lm.gpt->loss(x, y).value(), original.value(), 1e-10);
  CHECK(train::without_adapter_metadata(meta).count("lora.rank") == 0);
}

TEST_CASE("adapters: --freeze freezes by name and a resume reads the frozen weights back", "[adapters]") {
  auto comm = dist::make_local();
  const train::TrainOptions o = options(0, "^tok|attn_norm");
  std::unique_ptr<train::Task> t = train::make_task(o, *comm);
  Generator init(5);
  t->build_model(init);
  const train::AdapterSummary s = train::apply_adapters(t->module(), o, init);
  CHECK(s.adapters == 0);
  CHECK(s.frozen == 3);  // tok.weight and both blocks' attn_norm.weight
  for (const auto& [name, p] : t->module().named_parameters()) {
    INFO(name);
    CHECK(p.requires_grad() == (name != "tok.weight" && name.find("attn_norm") == std::string::npos));
  }
  const auto dir = xgt::temp_dir("adapters_freeze");
  const std::string path = (dir / "model.safetensors").string();
  train::detail::save_model(*t, path, 1);
  // A fresh model of the same run (another seed): its frozen weights come back from the file.
  std::unique_ptr<train::Task> u = train::make_task(o, *comm);
  Generator other(6);
  u->build_model(other);
  train::apply_adapters(u->module(), o, other);
  const Array before = u->module().parameter("tok.weight").value();
  REQUIRE(max_abs_diff(before, t->module().parameter("tok.weight").value()) > 0);  // differs until loaded
  train::load_frozen_parameters(u->module(), path);
  for (const auto& [name, p] : u->module().named_parameters()) {
    INFO(name);
    if (!p.requires_grad()) XGT_CHECK_SAME(p.value(), t->module().parameter(name).value());  // copied
  }
}

TEST_CASE("adapters: a --freeze that matches nothing or everything and a rank too large are refused", "[adapters][errors]") {
  auto comm = dist::make_local();
  for (const std::string& pattern : {std::string("nothing_here"), std::string(".")}) {
    const train::TrainOptions o = options(0, pattern);
    std::unique_ptr<train::Task> t = train::make_task(o, *comm);
    Generator init(7);
    t->build_model(init);
    const std::string m = xgt::error_of<UsageError>([&] { train::apply_adapters(t->module(), o, init); });
    CHECK_THAT(m, Catch::Contains("--freeze '" + pattern + "'"));
    CHECK(t->module().trainable_parameter_count() == t->module().parameter_count());  // nothing changed
  }
  const train::TrainOptions o = options(17);  // d_model 16
  std::unique_ptr<train::Task> t = train::make_task(o, *comm);
  Generator init(8);
  t->build_model(init);
  const std::string m = xgt::error_of<UsageError>([&] { train::apply_adapters(t->module(), o, init); });
  CHECK_THAT(m, Catch::Contains("--lora-rank 17"));
  CHECK_THAT(m, Catch::Contains("larger than the layer"));
  CHECK(nn::count_adapters(dynamic_cast<nn::GPT&>(t->module())) == 0);
}

TEST_CASE("adapters: a LoRA run's state holds only the adapters and their moments and resumes exactly",
          "[adapters][checkpoint]") {
  namespace fs = std::filesystem;
  const fs::path dir = xgt::temp_dir("adapters_resume");
  std::ostringstream log;
  auto lora = [&](const fs::path& out) {
    train::TrainOptions o = xgt::tiny_sort_run(out, 6);
    o.lora_rank = 2;
    o.lora_targets = "q,v,fc2";
    return o;
  };
  train::run_training(lora(dir / "whole"), log);
  train::TrainOptions stopped = lora(dir / "stopped");
  stopped.stop_at = 3;
  train::run_training(stopped, log);
  const io::safetensors::File state = io::safetensors::load((dir / "stopped" / "train_state.safetensors").string());
  std::size_t params = 0, moments = 0;
  for (const auto& [name, a] : state.tensors) {
    INFO(name);
    const bool adapter = name.find(".lora_") != std::string::npos;
    if (name.rfind("model.", 0) == 0) {
      CHECK(adapter);
      ++params;
    } else if (name.rfind("optim.", 0) == 0) {
      CHECK(adapter);
      ++moments;
    }
  }
  CHECK(params == 3 * 2);       // q, v, fc2 in 1 layer: lora_A and lora_B each
  CHECK(moments == 2 * params);  // AdamW's two moments
  CHECK(state.metadata.at("opt.lora_rank") == "2");
  // The frozen weights come back from model.safetensors: the resumed run ends where the
  // uninterrupted one did, bit for bit (one thread, the same steps).
  CHECK(train::run_training(xgt::resume_options(dir / "stopped"), log).steps_done == 6);
  CHECK(xgt::read_file(dir / "stopped" / "model.safetensors") == xgt::read_file(dir / "whole" / "model.safetensors"));
  fs::remove_all(dir);
}

TEST_CASE("adapters: export llama2c of an adapted model writes the merged model's bytes", "[adapters][llama2c]") {
  namespace fs = std::filesystem;
  auto comm = dist::make_local();
  train::TrainOptions o = options(2);
  o.dtype = "float32";  // llama2.c's format
  std::unique_ptr<train::Task> t = train::make_task(o, *comm);
  Generator init(9);
  t->build_model(init);
  train::apply_adapters(t->module(), o, init);
  Generator g(10);
  for (auto& [name, p] : t->module().named_parameters())
    if (name.find("lora_B") != std::string::npos) {
      Tensor q = p;
      q.set_value(random_uniform(q.shape(), g, q.dtype(), -0.3, 0.3));
    }
  const fs::path dir = xgt::temp_dir("adapters_export");
  const std::string adapted = (dir / "adapted.safetensors").string(), merged = (dir / "merged.safetensors").string();
  train::detail::save_model(*t, adapted, 1);
  // The merge `xgrad merge` does: load, fold in, save without the adapters' metadata.
  train::LoadedModel lm = train::load_model(adapted);
  nn::merge_lora(*lm.gpt);
  nn::safetensors::save_module(merged, lm.module(),
                               train::without_adapter_metadata(io::safetensors::load_header(adapted).metadata));
  train::llama2c::export_file(adapted, (dir / "a.bin").string());
  train::llama2c::export_file(merged, (dir / "m.bin").string());
  const std::string a = xgt::read_file(dir / "a.bin"), m = xgt::read_file(dir / "m.bin");
  REQUIRE(!a.empty());
  CHECK(a == m);  // the same merge (the same arithmetic on the same arrays): the same bytes
  // and not the base model's: the adapters changed the weights.
  train::LoadedModel base = train::load_model(adapted);
  CHECK(max_abs_diff(base.gpt->parameter("blocks.0.ffn.down.W").value(),
                     lm.gpt->parameter("blocks.0.ffn.down.W").value()) > 0);
  fs::remove_all(dir);
}
