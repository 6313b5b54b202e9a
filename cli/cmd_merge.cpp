// `xgrad merge --checkpoint M --out merged.safetensors`: folds a model's LoRA adapters into its
// weights (nn::merge_lora) and writes a plain checkpoint of the base architecture, which every
// command and `export llama2c` read as any other (train/adapters.hpp, docs/cli.md).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/nn/lora.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/adapters.hpp>
#include <xgrad/train/checkpoint.hpp>

namespace xg::cli {

namespace {

struct MergeArgs {
  std::string checkpoint, out;
  bool overwrite = false;
};

void run(MergeArgs& a) {
  const std::string command = "merge";
  a.checkpoint = model_file(command, "--checkpoint", a.checkpoint);
  if (same_file(a.checkpoint, a.out))
    throw UsageError(op_message(command, "--out '" + a.out + "' is the --checkpoint itself"));
  check_new_output(command, "--out", a.out, a.overwrite);
  const io::safetensors::Metadata meta = io::safetensors::load_header(a.checkpoint).metadata;
  if (!train::has_adapters(meta))
    throw ValueError(op_message(command, a.checkpoint + " has no adapters to merge (it was not trained with --lora-rank)"));
  train::LoadedModel lm = train::load_model(a.checkpoint);
  const std::size_t before = lm.module().parameter_count();
  const std::size_t n = nn::merge_lora(*lm.gpt);
  // The same metadata without the adapters' keys: a checkpoint of the base architecture.
  nn::safetensors::save_module(a.out, lm.module(), train::without_adapter_metadata(meta));
  std::cout << "xgrad merge: " << a.checkpoint << " -> " << a.out << " (" << n << " adapters of rank "
            << meta.at("lora.rank") << " folded in; " << before << " -> " << lm.module().parameter_count()
            << " parameters)\n";
}

}  // namespace

void add_merge(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("merge", "Fold a model's LoRA adapters into its weights (a plain checkpoint)");
  auto a = std::make_shared<MergeArgs>();
  Options o(*cmd, "merge");
  o.add(shared::checkpoint().required(), a->checkpoint);
  o.add(path_flag("out", "--out", "the merged checkpoint (.safetensors) to write").required().type("FILE"), a->out);
  o.add(shared::overwrite().with_help("replace an existing --out"), a->overwrite);
  o.example("xgrad merge --checkpoint lora-run --out merged.safetensors");
  o.on_run([a] { run(*a); });
}

}  // namespace xg::cli
