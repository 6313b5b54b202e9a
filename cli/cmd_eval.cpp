// `xgrad eval --checkpoint M --text FILES|DIRS`: how well a text-task model predicts a text:
// cross-entropy in nats per token, bits per byte (comparable across tokenizers), perplexity,
// token and byte counts. The text is tokenised with the tokenizer the checkpoint carries and
// measured over the windows the training run's validation uses (text/corpus.hpp), so
// `--split val` with the run's --val-fraction gives the run's own validation numbers.
#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "options.hpp"
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/train/evaluation.hpp>

namespace xg::cli {

namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

struct EvalArgs {
  std::string checkpoint, text, tokenizer, split = "all", json_path;
  double val_fraction = 0.1;
  std::size_t batch = 32, max_windows = text::kMaxValidationWindows, threads = 0;
  bool overwrite = false;
};

// Whether `path` is `folder` or inside it (links resolved), however either is spelled.
bool inside(const std::string& path, const std::string& folder) {
  std::error_code ec;
  const fs::path f = fs::weakly_canonical(fs::absolute(folder, ec), ec);
  for (fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec); !p.empty(); p = p.parent_path()) {
    if (p == f) return true;
    if (p == p.parent_path()) break;
  }
  return false;
}

void run_eval(EvalArgs a) {
  a.checkpoint = model_file("eval", "--checkpoint", a.checkpoint);
  // No output may replace an input: the checkpoint, a corpus file, the tokenizer (links too).
  check_distinct_files("eval", {{"--checkpoint", a.checkpoint, false},
                                {"--text", a.text, false},
                                {"--tokenizer", a.tokenizer == "bytes" ? std::string() : a.tokenizer, false},
                                {"--json", a.json_path, true}});
  std::error_code ec;
  if (!a.json_path.empty() && a.json_path != "-" && fs::is_directory(a.text, ec) && inside(a.json_path, a.text))
    throw UsageError(op_message("eval", "--json '" + a.json_path + "' is in the --text folder '" + a.text +
                                            "': it would replace or join the corpus; write it elsewhere"));
  check_new_output("eval", "--json", a.json_path, a.overwrite);
  set_num_threads(thread_count(a.threads));
  train::LoadedModel m = train::load_model(a.checkpoint);
  const io::safetensors::Metadata meta = io::safetensors::load_header(a.checkpoint).metadata;
  if (!meta.count("tokenizer") || !m.gpt)
    throw UsageError(op_message("eval", "--checkpoint " + a.checkpoint + " is a " + m.info.task +
                                            " model without a tokenizer; xgrad eval measures models of xgrad train "
                                            "--task text"));
  std::unique_ptr<text::Tokenizer> tok = text::tokenizer_of_metadata(meta, a.checkpoint);
  if (!a.tokenizer.empty()) {
    const std::unique_ptr<text::Tokenizer> given = text::load_tokenizer(a.tokenizer);
    if (given->digest() != tok->digest())
      throw UsageError(op_message("eval", "--tokenizer " + a.tokenizer + " (" + given->description() +
                                              ") differs from the tokenizer of " + a.checkpoint + " (" +
                                              tok->description() + ")"));
  }
  // The corpus reader is train's: its errors name eval here.
  std::vector<text::Document> docs;
  try {
    docs = text::list_documents(a.text);
  } catch (const UsageError& e) {
    const std::string m = e.what(), tag = "[train] ";
    throw UsageError(op_message("eval", m.rfind(tag, 0) == 0 ? m.substr(tag.size()) : m));
  }
  std::vector<text::Document> chosen = docs;
  if (a.split != "all") {
    std::vector<text::Document> tr, val;
    text::split_documents(docs, a.val_fraction, tr, val);
    chosen = a.split == "val" ? val : tr;
  }
  // The documents joined as the run joined them (--doc-separator; a model saved without the
  // key: none, as xgrad trained before the option).
  std::int64_t sep_id = -1;
  const text::DocSeparator sep = text::saved_doc_separator(meta, *tok, "[eval] " + a.checkpoint, sep_id);
  // In memory: eval reads its text once.
  std::vector<std::uint32_t> ids;
  std::uint64_t bytes = 0;
  for (const text::Document& d : chosen) {
    text::add_document_ids(ids, tok->encode(text::read_document(d)), sep, sep_id);
    bytes += d.size;
  }
  const text::TokenFile tokens(std::move(ids), bytes);
  const std::size_t T = m.info.config.context;
  const text::ValidationWindows w = text::validation_windows(tokens.size(), T, a.max_windows);
  if (w.starts.empty())
    throw UsageError(op_message("eval", "--text '" + a.text + "': " + std::to_string(tokens.size()) +
                                            " tokens; at least 2 are needed"));
  std::vector<std::size_t> token_bytes;
  for (const std::string& t : m.info.vocab.tokens) token_bytes.push_back(t.size());
  const train::WindowLoss r = train::window_loss(*m.gpt, tokens, w, 0, w.starts.size(), a.batch, token_bytes);
  const double nats = r.nats / static_cast<double>(r.targets);
  const double bpb = r.nats / static_cast<double>(r.bytes) / std::log(2.0);
  if (a.json_path != "-") {
    std::ostringstream o;
    o << "eval " << a.checkpoint << " on " << a.text << " (" << a.split << ": " << chosen.size() << " of "
      << docs.size() << " documents, " << bytes << " bytes, " << tokens.size() << " tokens; tokenizer "
      << tok->description() << "; document separator " << text::doc_separator_name(sep) << ")\n"
      << "measured " << r.targets << " tokens (" << r.bytes << " bytes) in " << w.starts.size() << " windows of "
      << T << "\n"
      << "cross-entropy " << nats << " nats/token, perplexity " << std::exp(nats) << ", bits per byte " << bpb
      << "\n";
    std::cout << o.str() << std::flush;
  }
  if (a.json_path.empty()) return;
  json j = command_json("eval");
  j["checkpoint"] = a.checkpoint;
  j["text"] = a.text;
  j["split"] = a.split;
  j["val_fraction"] = a.val_fraction;
  j["documents"] = chosen.size();
  j["documents_in_corpus"] = docs.size();
  j["tokenizer"] = {{"kind", tok->kind()}, {"vocab_size", tok->vocab_size()}, {"sha256", tok->digest()}};
  j["doc_separator"] = text::doc_separator_name(sep);
  j["tokens"] = tokens.size();
  j["bytes"] = bytes;
  j["windows"] = w.starts.size();
  j["context"] = T;
  j["measured_tokens"] = r.targets;
  j["measured_bytes"] = r.bytes;
  j["nats_per_token"] = nats;
  j["perplexity"] = std::exp(nats);
  j["bits_per_byte"] = bpb;
  write_json("eval", "--json", a.json_path, j.dump(2, ' ', false, json::error_handler_t::replace));
}

}  // namespace

void add_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* cmd = app.add_subcommand("eval", "Measure a text model on a text: nats per token, bits per byte, perplexity");
  Options o(*cmd, "eval");
  o.add(shared::checkpoint().required().with_help(
            "a text model: model.safetensors (or model_best.safetensors) of xgrad train --task text, or its run "
            "folder (its final model.safetensors)"),
        a->checkpoint);
  o.add(shared::text().required(), a->text);
  o.add(shared::tokenizer().with_help("refuse unless the checkpoint's tokenizer is this one ('bytes', a .model file or a llama2.c tokenizer.bin)"),
        a->tokenizer);
  o.add(text_flag("split", "--split", "all, or the documents xgrad train would put in train or val")
            .one_of({"all", "train", "val"}),
        a->split);
  o.add(shared::val_fraction().with_help("with --split: the run's --val-fraction, in (0, 0.5]"), a->val_fraction);
  o.add(value_flag("batch", "--batch", "windows per forward pass").range(1, 65536), a->batch);
  o.add(value_flag("max_windows", "--max-windows", "at most this many windows, evenly spread (as training's validation)")
            .range(1, double(std::size_t(1) << 30)),
        a->max_windows);
  o.add(shared::threads(), a->threads);
  o.add(shared::json(), a->json_path);
  o.add(shared::overwrite(), a->overwrite);
  o.example("xgrad eval --checkpoint run1 --text corpus/ --split val --json -");
  o.on_run([a] { run_eval(*a); });
}

}  // namespace xg::cli
