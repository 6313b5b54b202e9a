// `xgrad import llama2c MODEL.bin OUT.safetensors` and `xgrad export llama2c IN.safetensors
// OUT.bin`: llama2.c model files (legacy, version 1 and 2 in; legacy out) to and from xgrad
// checkpoints (train/llama2c.hpp, docs/llama.md).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/io/safetensors.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/train/llama2c.hpp>

namespace xg::cli {

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string in, out;
  bool overwrite = false;
};

// The paths, before any work: IN exists and is a file, OUT is another file that may be written.
void check_paths(const std::string& command, const Args& a) {
  auto usage = [&](const std::string& m) { throw UsageError(op_message(command, m)); };
  std::error_code ec;
  if (!fs::exists(a.in, ec)) usage("IN '" + a.in + "' does not exist");
  if (fs::is_directory(a.in, ec)) usage("IN '" + a.in + "' is a folder");
  if (same_file(a.in, a.out)) usage("OUT '" + a.out + "' is IN itself");
  if (fs::exists(a.out, ec) && !fs::is_directory(a.out, ec) && !a.overwrite)
    usage("OUT '" + a.out + "' exists; pass --overwrite to replace it");
  check_output_file(command, "OUT", a.out);
}

CLI::App* add(CLI::App* parent, const char* name, const char* help, const char* in_help, const char* out_help,
              const std::shared_ptr<Args>& a, const std::string& example) {
  CLI::App* cmd = parent->add_subcommand(name, help);
  Options o(*cmd, std::string(parent->get_name()) + " " + name);
  cmd->add_option("in", a->in, in_help)->required()->check(non_empty_path());
  cmd->add_option("out", a->out, out_help)->required()->check(non_empty_path());
  o.add(shared::overwrite().with_help("replace an existing OUT"), a->overwrite);
  o.example(example);
  return cmd;
}

}  // namespace

void add_import(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("import", "Make an xgrad checkpoint from another program's model file");
  cmd->require_subcommand(1);
  help_footer(*cmd, "xgrad import llama2c stories15M.bin stories15M.safetensors");
  auto a = std::make_shared<Args>();
  CLI::App* l = add(cmd, "llama2c",
                    "llama2.c's model.bin (legacy, version 1, or version 2 int8 dequantized) to an xgrad checkpoint (no tokenizer inside)",
                    "IN: the llama2.c model file", "OUT: the xgrad checkpoint (.safetensors) to write", a,
                    "xgrad import llama2c stories15M.bin stories15M.safetensors");
  l->callback([a] {
    check_paths("import llama2c", *a);
    train::llama2c::import_file(a->in, a->out);
    // What was imported, from the checkpoint just written.
    const train::ModelInfo info = train::model_info(io::safetensors::load_header(a->out).metadata, a->out);
    const nn::TransformerConfig& c = info.config;
    std::cout << "xgrad import llama2c: " << a->in << " -> " << a->out << " (" << nn::architecture_name(c.arch)
              << ": d_model " << c.d_model << ", layers " << c.layers << ", heads " << c.H_q << "/" << c.H_kv
              << " (q/kv), d_ff " << c.d_ff << ", vocabulary " << c.V_vocab << ", context " << c.context << "; "
              << train::parameter_count(info.kind, c) << " parameters)\n";
  });
}

void add_export(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("export", "Write an xgrad checkpoint in another program's format");
  cmd->require_subcommand(1);
  help_footer(*cmd, "xgrad export llama2c run1 model.bin");
  auto a = std::make_shared<Args>();
  CLI::App* l = add(cmd, "llama2c", "an xgrad Llama checkpoint to llama2.c's legacy model.bin (run.c reads it)",
                    "IN: the xgrad checkpoint (or a run folder: its final model.safetensors)",
                    "OUT: the llama2.c model file to write", a, "xgrad export llama2c run1 model.bin");
  l->callback([a] {
    if (std::filesystem::is_directory(a->in)) a->in = model_file("export llama2c", "IN", a->in);
    check_paths("export llama2c", *a);
    train::llama2c::export_file(a->in, a->out);
    std::cout << "xgrad export llama2c: " << a->in << " -> " << a->out << "\n";
  });
}

}  // namespace xg::cli
