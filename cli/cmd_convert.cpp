// `xgrad convert --kv-heads G IN OUT`: a checkpoint with G key/value heads made from IN by
// mean-pooling each group's key and value heads (MHA -> GQA/MQA; train/convert.hpp), with a
// report of how far the converted model is from the original on the task's held-out data.
// `xgrad train --init-from OUT` uptrains it.
#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/train/convert.hpp>

namespace xg::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct ConvertArgs {
  train::ConvertOptions o;
  std::string json_path;
  bool overwrite = false;
  std::size_t threads = 0;
};

[[noreturn]] void usage(const std::string& message) { throw UsageError(op_message("convert", message)); }

json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json score_json(const train::HeldoutScore& s) {
  return {{"cross_entropy", s.cross_entropy}, {"heldout_exact_match", number_or_null(s.exact_match)}};
}

void run(ConvertArgs a) {
  // Paths, before any work. IN may be a run folder: its final model.
  std::error_code ec;
  if (!fs::exists(a.o.in, ec)) usage("IN '" + a.o.in + "' does not exist");
  a.o.in = model_file("convert", "IN", a.o.in);
  const train::ConvertOptions& o = a.o;
  if (same_file(o.in, o.out))
    usage("OUT '" + o.out + "' is IN itself: write the converted checkpoint to another file");
  if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec) && !a.overwrite)
    usage("OUT '" + o.out + "' exists; pass --overwrite to replace it");
  // No output may replace the other or an input (./o.safetensors and o.safetensors, links, ...).
  check_distinct_files("convert", {{"IN", o.in, false},
                                   {"--text", o.text, false},
                                   {"OUT", o.out, true},
                                   {"--json", a.json_path, true}});
  check_output_file("convert", "OUT", o.out);
  check_new_output("convert", "--json", a.json_path, a.overwrite);
  set_num_threads(thread_count(a.threads));

  const train::ConvertReport r = train::convert_checkpoint(o);

  std::ostringstream s;
  s << std::setprecision(6);
  s << "xgrad convert: " << o.in << " (" << r.kind << ", task " << r.task << ", H_q " << r.H_q << ", H_kv "
    << r.H_kv_from << ", d_h " << r.d_h << ", " << r.params_from << " parameters) -> " << o.out << " (H_kv " << r.H_kv_to
    << ", " << r.params_to << " parameters)\n";
  s << "mean-pooled groups of " << r.H_kv_from / r.H_kv_to << " key/value heads in " << r.self_attention_layers
    << " self-attention layers" << (r.cross_attention_layers ? " and " + std::to_string(r.cross_attention_layers) +
                                                                    " cross-attention layers"
                                                              : std::string())
    << "; queries and outputs unchanged\n";
  s << "held-out data: " << r.sequences << " sequences, " << r.positions << " compared positions"
    << (r.task == "charlm" || r.task == "text" ? " (validation split of " + o.text + ")" : " (seed " + std::to_string(o.seed) + ")") << "\n";
  s << "logits converted vs original: max |delta| " << r.max_abs_dlogit << ", mean |delta| " << r.mean_abs_dlogit
    << ", KL(original || converted) " << r.kl << " nats per position\n";
  auto line = [&](const char* name, const train::HeldoutScore& sc) {
    s << name << "cross-entropy " << sc.cross_entropy;
    if (std::isfinite(sc.exact_match)) s << ", heldout_exact_match " << sc.exact_match;
    s << "\n";
  };
  line("original:  ", r.original);
  line("converted: ", r.converted);
  s << "wrote " << o.out << "; uptrain it with: xgrad train --init-from " << o.out << " --out DIR\n";
  const bool em = std::isfinite(r.converted.exact_match);
  s << "RESULT " << (em ? "heldout_exact_match " : "cross_entropy ") << (em ? r.converted.exact_match : r.converted.cross_entropy)
    << "\n";
  if (a.json_path != "-") std::cout << s.str() << std::flush;

  if (!a.json_path.empty()) {
    json j = command_json("convert");
    j["in"] = o.in;
    j["out"] = o.out;
    j["model"] = r.kind;
    j["task"] = r.task;
    j["H_q"] = r.H_q;
    j["H_kv_from"] = r.H_kv_from;
    j["H_kv_to"] = r.H_kv_to;
    j["d_h"] = r.d_h;
    j["self_attention_layers"] = r.self_attention_layers;
    j["cross_attention_layers"] = r.cross_attention_layers;
    j["parameters_from"] = r.params_from;
    j["parameters_to"] = r.params_to;
    j["heldout"] = {{"seed", o.seed}, {"sequences", r.sequences}, {"positions", r.positions}};
    j["logits"] = {{"max_abs_delta", r.max_abs_dlogit}, {"mean_abs_delta", r.mean_abs_dlogit}, {"kl", r.kl}};
    j["original"] = score_json(r.original);
    j["converted"] = score_json(r.converted);
    write_json("convert", "--json", a.json_path, j.dump(2));
  }
}

}  // namespace

void add_convert(CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "Mean-pool key/value heads: a GQA/MQA checkpoint from an MHA (or GQA) one, compared on held-out data");
  Options o(*cmd, "convert");
  o.add(value_flag("kv_heads", "--kv-heads", "G, the new number of key/value heads (divides H_kv)").required(),
        a->o.kv_heads);
  cmd->add_option("in", a->o.in,
                  "IN: the checkpoint to convert: a model.safetensors written by xgrad train, or a run folder (its "
                  "final model.safetensors)")
      ->required()
      ->check(non_empty_path());
  cmd->add_option("out", a->o.out, "OUT: the converted model.safetensors")->required()->check(non_empty_path());
  o.add(shared::overwrite(), a->overwrite);
  o.add(shared::seed().with_help("the --seed of the training run (its held-out set)"), a->o.seed);
  o.add(train_flag("heldout").with_help("held-out problems (sort, reverse), in [1, 100000]"), a->o.heldout);
  o.add(shared::text().with_help(
            "charlm, text: the text the model was trained on (text: its held-out documents are compared)"),
        a->o.text);
  o.add(shared::threads(), a->threads);
  o.add(shared::json().with_help("also write the report as JSON to FILE ('-': stdout, instead of the text)"),
        a->json_path);
  o.example("xgrad convert --kv-heads 1 run1 mqa.safetensors --json -");
  o.on_run([a] { run(*a); });
}

}  // namespace xg::cli
