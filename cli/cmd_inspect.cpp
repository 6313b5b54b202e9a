// `xgrad inspect FILE`: a checkpoint's configuration, its parameter table and the attention
// cost model at that configuration: FLOPs per token by term (projections: the text before
// (5.34); Q K^T and A V: (5.34)), KV cache bytes (the text after (5.36)) and the bytes of a
// materialised attention-weight tensor (5.35). --json FILE ('-' for stdout)
// writes the same figures as JSON (docs/cli.md has the schema).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/nn/cost_model.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/train/adapters.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/model_schema.hpp>

namespace xg::cli {

namespace {

using json = nlohmann::ordered_json;
struct InspectArgs {
  std::string path, json_path;
  std::string operand;  // FILE, the old spelling of --checkpoint
  bool all = false;     // --all: every metadata value whole
  bool overwrite = false;
};

// The longest metadata value the report prints whole without --all (a tokenizer model embedded
// in base64, or a 32,000-token vocabulary, is hundreds of KB).
constexpr std::size_t kInspectValueBytes = 120;

// `v` as the report shows it: whole, or its first kInspectValueBytes bytes (not cutting a UTF-8
// character) and its size.
std::string capped(const std::string& v, bool all) {
  if (all || v.size() <= kInspectValueBytes) return v;
  std::size_t n = kInspectValueBytes;
  while (n > 0 && (static_cast<unsigned char>(v[n]) & 0xC0) == 0x80) --n;  // v[n] starts a character
  return v.substr(0, n) + "... (" + std::to_string(v.size()) + " bytes; --all shows every value whole)";
}

// The checkpoint: --checkpoint, or the FILE operand of earlier versions (a deprecation line).
std::string checkpoint_of(const InspectArgs& a, const CLI::App& cmd) {
  if (!a.operand.empty() && cmd.count("--checkpoint") > 0)
    throw UsageError(op_message("inspect", "FILE '" + a.operand + "' and --checkpoint '" + a.path +
                                               "': give the checkpoint once, with --checkpoint"));
  if (a.operand.empty() && cmd.count("--checkpoint") == 0)
    throw UsageError(op_message("inspect", "--checkpoint is required"));
  if (a.operand.empty()) return model_file("inspect", "--checkpoint", a.path);
  if (!quiet_rank()) print_line("xgrad: the FILE operand of xgrad inspect is deprecated, use --checkpoint FILE");
  return model_file("inspect", "FILE", a.operand);
}

// The figures of the report: the attention cost model at the checkpoint's configuration.
struct Figures {
  std::size_t bytes, d_h, T, attn_layers, total = 0;
  std::uint64_t frozen = 0;  // of total: frozen in training (--lora-rank, --freeze)
  nn::cost::Flops fl;
  std::uint64_t kv_token, kv_params, kv_params_mha, weight_bytes;
  double per_token(std::uint64_t v) const { return static_cast<double>(v) / static_cast<double>(T); }
};

Figures figures_of(const io::safetensors::File& f, const train::ModelInfo& info, const std::string& path) {
  const nn::TransformerConfig& c = info.config;
  Figures x;
  x.bytes = c.dtype == DType::float32 ? 4 : 8;
  x.d_h = c.d_model / c.H_q;
  x.T = c.context;
  x.attn_layers = c.layers + (info.kind == train::ModelKind::encoder_decoder ? c.encoder_layers : 0);
  nn::cost::AttentionShape s{1, x.T, x.T, c.d_model, c.H_q, c.H_kv, x.d_h};
  x.fl = nn::cost::attention_flops(s);
  x.kv_token = nn::cost::kv_cache_bytes(1, 1, c.H_kv, x.d_h, x.bytes) * c.layers;
  x.kv_params = nn::cost::kv_projection_params(c.d_model, c.H_kv, x.d_h);
  x.kv_params_mha = nn::cost::kv_projection_params(c.d_model, c.H_q, x.d_h);
  x.weight_bytes = nn::cost::weight_matrix_bytes(1, c.H_q, x.T, x.T, x.bytes);
  for (const auto& named : f.tensors) x.total += named.second.size();
  x.frozen = train::frozen_parameter_count(f.metadata, x.total, path);
  return x;
}

// The report on stdout: configuration, parameters, attention cost.
void print_report(const InspectArgs& a, const io::safetensors::File& f, const train::ModelInfo& info,
                  const Figures& x) {
  const nn::TransformerConfig& c = info.config;
  const std::size_t T = x.T, d_h = x.d_h, bytes = x.bytes;
  const nn::cost::Flops& fl = x.fl;
  auto per_token = [&](std::uint64_t v) { return x.per_token(v); };
  std::ostream& o = std::cout;
  o << "checkpoint " << a.path << "\n\nconfiguration\n";
  for (const auto& [k, v] : f.metadata)
    if (k != "vocabulary") o << "  " << std::left << std::setw(16) << k << capped(v, a.all) << "\n";
  o << "  " << std::setw(16) << "vocabulary" << info.vocab.size() << " tokens " << capped(info.vocab.to_json(), a.all)
    << "\n";

  o << "\nparameters\n  " << std::setw(34) << "name" << std::setw(16) << "shape" << std::right << std::setw(10)
    << "count" << std::left << "\n";
  for (const auto& [name, arr] : f.tensors)
    o << "  " << std::setw(34) << name << std::setw(16) << shape_str(arr.shape()) << std::right << std::setw(10)
      << arr.size() << std::left << "\n";
  o << "  " << std::setw(50) << "total" << std::right << std::setw(10) << x.total << std::left << "\n";
  if (x.frozen > 0)  // trained with --lora-rank or --freeze (train/adapters.hpp)
    o << "  " << std::setw(50) << "trainable" << std::right << std::setw(10) << x.total - x.frozen << std::left << "\n"
      << "  " << std::setw(50) << "frozen" << std::right << std::setw(10) << x.frozen << std::left << "\n";
  o << "\nattention cost per layer at T = S = " << T << " (context), B = 1; FLOPs per token ((5.34) and the text before it)\n"
    << "  Q projection        " << per_token(fl.q_proj) << "\n"
    << "  K projection        " << per_token(fl.k_proj) << "\n"
    << "  V projection        " << per_token(fl.v_proj) << "\n"
    << "  output projection   " << per_token(fl.o_proj) << "\n"
    << "  Q K^T               " << per_token(fl.scores) << "\n"
    << "  A V                 " << per_token(fl.weighted_sum) << "\n"
    << "  total               " << per_token(fl.total()) << "  (x " << x.attn_layers << " attention layers)\n";
  o << "KV cache (the text after (5.36)), " << dtype_name(c.dtype) << ", all " << c.layers << " decoder layers\n"
    << "  per token           " << x.kv_token << " bytes (2 x H_kv " << c.H_kv << " x d_h " << d_h << " x " << bytes
    << " B x " << c.layers << " layers)\n"
    << "  at full context     " << x.kv_token * T << " bytes\n"
    << (c.window > 0 ? "  sliding window " + std::to_string(c.window) + "   a windowed cache holds at most " +
                           std::to_string(std::min<std::size_t>(c.window, T)) +
                           " positions when decoding one token at a time: " +
                           std::to_string(x.kv_token * std::min<std::size_t>(c.window, T)) + " bytes\n"
                     : std::string())
    << "  KV projection params per layer " << x.kv_params << " (MHA would be " << x.kv_params_mha << ")\n";
  o << "materialised attention weights (5.35): B H_q T S = 1 x " << c.H_q << " x " << T << " x " << T << " = "
    << x.weight_bytes << " bytes per layer\n";
}

// The same figures as JSON (docs/cli.md has the schema).
void write_inspect_json(const InspectArgs& a, const io::safetensors::File& f, const train::ModelInfo& info,
                        const Figures& x) {
  const nn::TransformerConfig& c = info.config;
  const std::size_t T = x.T, d_h = x.d_h;
  const nn::cost::Flops& fl = x.fl;
  auto per_token = [&](std::uint64_t v) { return x.per_token(v); };
  json j = command_json("inspect");
  j["checkpoint"] = a.path;
  j["kind"] = train::model_kind_name(info.kind);
  j["task"] = info.task;
  json meta = json::object();
  for (const auto& [k, v] : f.metadata)
    if (k != "vocabulary") meta[k] = v;
  j["metadata"] = meta;
  // The model description, one entry a row of the model schema (train/model_schema.hpp) that the
  // model has (the vocabulary and the tokenizer's file are left out: "vocabulary" below, metadata).
  json description = json::array();
  const io::safetensors::Metadata desc = train::model_metadata(info);
  for (const train::ModelField& field : train::model_schema()) {
    const auto it = desc.find(field.key);
    if (it == desc.end() || field.key == "vocabulary" || field.key == "tokenizer_model") continue;
    description.push_back({{"key", field.key}, {"value", it->second}, {"option", field.option}, {"help", field.help}});
  }
  j["description"] = description;
  j["config"] = {{"vocab_size", c.V_vocab}, {"context", c.context},   {"d_model", c.d_model},
                 {"heads", c.H_q},          {"kv_heads", c.H_kv},     {"d_h", d_h},
                 {"layers", c.layers},      {"encoder_layers", info.kind == train::ModelKind::encoder_decoder ? c.encoder_layers : 0},
                 {"d_ff", c.d_ff},          {"dropout", c.dropout},   {"dtype", dtype_name(c.dtype)}};
  j["vocabulary"] = json::parse(info.vocab.to_json());
  json params = json::array();
  for (const auto& [name, arr] : f.tensors)
    params.push_back({{"name", name}, {"shape", arr.shape()}, {"count", arr.size()}, {"dtype", dtype_name(arr.dtype())}});
  j["parameters"] = params;
  j["parameter_count"] = x.total;
  j["trainable_parameter_count"] = x.total - x.frozen;
  j["frozen_parameter_count"] = x.frozen;
  j["cost"] = {
      {"T", T},
      {"S", T},
      {"B", 1},
      {"attention_layers", x.attn_layers},
      {"flops_per_token", {{"q_proj", per_token(fl.q_proj)},
                           {"k_proj", per_token(fl.k_proj)},
                           {"v_proj", per_token(fl.v_proj)},
                           {"o_proj", per_token(fl.o_proj)},
                           {"scores", per_token(fl.scores)},
                           {"weighted_sum", per_token(fl.weighted_sum)},
                           {"total", per_token(fl.total())}}},
      {"flops_per_layer", {{"q_proj", fl.q_proj},
                           {"k_proj", fl.k_proj},
                           {"v_proj", fl.v_proj},
                           {"o_proj", fl.o_proj},
                           {"scores", fl.scores},
                           {"weighted_sum", fl.weighted_sum},
                           {"total", fl.total()}}},
      {"kv_cache", {{"dtype", dtype_name(c.dtype)},
                    {"layers", c.layers},
                    {"bytes_per_token", x.kv_token},
                    {"bytes_at_context", x.kv_token * T}}},
      {"kv_projection_params_per_layer", x.kv_params},
      {"kv_projection_params_per_layer_mha", x.kv_params_mha},
      {"attention_weights_bytes_per_layer", x.weight_bytes}};
  write_json("inspect", "--json", a.json_path, j.dump(2, ' ', false, json::error_handler_t::replace));
}

void run_inspect(InspectArgs a, const CLI::App& cmd) {
  a.path = checkpoint_of(a, cmd);
  if (!a.json_path.empty() && a.json_path != "-") {
    if (same_file(a.json_path, a.path))
      throw UsageError(op_message("inspect", "--json '" + a.json_path + "' is the checkpoint itself"));
    check_new_output("inspect", "--json", a.json_path, a.overwrite);
  }
  const io::safetensors::File f = io::safetensors::load(a.path);
  // Everything generate would check (configuration against the tensors, shapes, finiteness).
  const train::ModelInfo info = train::load_model(a.path).info;
  const Figures x = figures_of(f, info, a.path);
  if (a.json_path != "-") print_report(a, f, info, x);
  if (!a.json_path.empty()) write_inspect_json(a, f, info, x);
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a checkpoint's configuration, parameters and cost model");
  Options o(*cmd, "inspect");
  o.add(shared::checkpoint(), a->path);
  cmd->add_option("file", a->operand, "FILE: the checkpoint (deprecated: use --checkpoint)")->check(non_empty_path());
  o.add(shared::json(), a->json_path);
  o.add(value_flag("all", "--all",
                   "print every metadata value whole (by default a value longer than 120 bytes, such as an embedded "
                   "tokenizer, is cut and its size shown; --json holds them whole)"),
        a->all);
  o.add(shared::overwrite(), a->overwrite);
  o.example("xgrad inspect --checkpoint run1/model.safetensors --json -");
  o.on_run([a, cmd] { run_inspect(*a, *cmd); });
}

}  // namespace xg::cli
