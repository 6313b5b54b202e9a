// `xgrad inspect FILE`: a checkpoint's configuration, its parameter table and the attention
// cost model at that configuration: FLOPs per token by term (projections: the text before
// (5.34); Q K^T and A V: (5.34)), KV cache bytes (the text after (5.36)) and the bytes of a
// materialised attention-weight tensor (5.35).
#include <CLI/CLI.hpp>
#include <iomanip>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include <xgrad/nn/cost_model.hpp>
#include <xgrad/nn/safetensors.hpp>
#include <xgrad/train/checkpoint.hpp>

namespace xg::cli {

namespace {

void run_inspect(const std::string& path) {
  const nn::safetensors::File f = nn::safetensors::load(path);
  // Everything generate would check (configuration against the tensors, shapes, finiteness).
  const train::ModelInfo info = train::load_model(path).info;
  const nn::TransformerConfig& c = info.config;
  std::cout << "checkpoint " << path << "\n\nconfiguration\n";
  for (const auto& [k, v] : f.metadata)
    if (k != "vocabulary") std::cout << "  " << std::left << std::setw(16) << k << v << "\n";
  std::cout << "  " << std::setw(16) << "vocabulary" << info.vocab.size() << " tokens " << info.vocab.to_json() << "\n";

  std::cout << "\nparameters\n  " << std::setw(34) << "name" << std::setw(16) << "shape" << std::right << std::setw(10)
            << "count" << std::left << "\n";
  std::size_t total = 0;
  for (const auto& [name, a] : f.tensors) {
    std::cout << "  " << std::setw(34) << name << std::setw(16) << shape_str(a.shape()) << std::right << std::setw(10)
              << a.size() << std::left << "\n";
    total += a.size();
  }
  std::cout << "  " << std::setw(50) << "total" << std::right << std::setw(10) << total << std::left << "\n";

  const std::size_t bytes = c.dtype == DType::float32 ? 4 : 8, d_h = c.d_model / c.H_q, T = c.context;
  const std::size_t attn_layers = c.layers + (info.kind == "encoder_decoder" ? c.encoder_layers : 0);
  nn::cost::AttentionShape s{1, T, T, c.d_model, c.H_q, c.H_kv, d_h};
  const nn::cost::Flops fl = nn::cost::attention_flops(s);
  auto per_token = [&](std::uint64_t v) { return static_cast<double>(v) / static_cast<double>(T); };
  std::cout << "\nattention cost per layer at T = S = " << T << " (context), B = 1; FLOPs per token ((5.34) and the text before it)\n"
            << "  Q projection        " << per_token(fl.q_proj) << "\n"
            << "  K projection        " << per_token(fl.k_proj) << "\n"
            << "  V projection        " << per_token(fl.v_proj) << "\n"
            << "  output projection   " << per_token(fl.o_proj) << "\n"
            << "  Q K^T               " << per_token(fl.scores) << "\n"
            << "  A V                 " << per_token(fl.weighted_sum) << "\n"
            << "  total               " << per_token(fl.total()) << "  (x " << attn_layers << " attention layers)\n";
  const std::uint64_t kv_token = nn::cost::kv_cache_bytes(1, 1, c.H_kv, d_h, bytes) * c.layers;
  std::cout << "KV cache (the text after (5.36)), " << dtype_name(c.dtype) << ", all " << c.layers << " decoder layers\n"
            << "  per token           " << kv_token << " bytes (2 x H_kv " << c.H_kv << " x d_h " << d_h << " x "
            << bytes << " B x " << c.layers << " layers)\n"
            << "  at full context     " << kv_token * T << " bytes\n"
            << "  KV projection params per layer " << nn::cost::kv_projection_params(c.d_model, c.H_kv, d_h)
            << " (MHA would be " << nn::cost::kv_projection_params(c.d_model, c.H_q, d_h) << ")\n";
  std::cout << "materialised attention weights (5.35): B H_q T S = 1 x " << c.H_q << " x " << T << " x " << T << " = "
            << nn::cost::weight_matrix_bytes(1, c.H_q, T, T, bytes) << " bytes per layer\n";
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("inspect", "Show a checkpoint's configuration, parameters and cost model");
  cmd->add_option("file", *path, "model.safetensors")->required();
  cmd->callback([path] { run_inspect(*path); });
}

}  // namespace xg::cli
