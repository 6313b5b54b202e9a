// `xgrad tokenizer train|encode|decode` (docs/cli.md): trains a SentencePiece tokenizer on
// text files, and turns text into ids and back with it (or with the byte tokenizer, or a
// llama2.c tokenizer.bin), exactly:
// decode(encode(s)) == s for any bytes (text/tokenizer.hpp has the rule).
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/text/tokenizer.hpp>

namespace xg::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

struct TrainArgs {
  text::TokenizerTrainOptions o;
  std::vector<std::string> paths;
  std::string out;
  bool overwrite = false;
};

struct CodeArgs {
  std::string tokenizer;
  std::string text, ids;
  std::vector<std::string> files;  // encode: each file on its own
  CLI::Option* text_given = nullptr;
  CLI::Option* ids_given = nullptr;
  bool json = false;
};

// All of stdin (explicit: no --text or --ids), at most kTextLimit bytes.
std::string read_stdin() {
  std::string s;
  char buf[65536];
  while (std::cin.read(buf, sizeof buf) || std::cin.gcount() > 0) {
    s.append(buf, static_cast<std::size_t>(std::cin.gcount()));
    if (s.size() > io::kTextLimit)
      throw UsageError(op_message("tokenizer", "stdin holds more than " + io::size_text(io::kTextLimit) +
                                                   ", the limit of a text read whole"));
  }
  if (std::cin.bad()) throw ValueError(op_message("tokenizer", "reading stdin failed"));
  return s;
}

void run_train(const TrainArgs& a) {
  const std::string cmd = "tokenizer train";
  // Without SentencePiece, that is the one thing to say (the library says it).
  if (!text::sentencepiece_available()) (void)text::train_sentencepiece(a.paths, a.o, a.out);
  std::error_code ec;
  if (fs::exists(a.out, ec) && !fs::is_directory(a.out, ec) && !a.overwrite)
    throw UsageError(op_message(cmd, "--out '" + a.out + "' exists; pass --overwrite to replace it"));
  std::vector<FileRole> roles = {{"--out", a.out, true}};
  for (const std::string& p : a.paths) roles.push_back({"FILES", p, false});
  check_distinct_files(cmd, roles);
  check_output_file(cmd, "--out", a.out);
  std::cout << text::train_sentencepiece(a.paths, a.o, a.out) << std::flush;
}

json tokenizer_json(const text::Tokenizer& t, const std::string& spec) {
  return {{"kind", t.kind()},
          {"spec", spec},
          {"vocab_size", t.vocab_size()},
          {"sha256", t.digest()}};
}

// A FILES operand of `encode`, whole (any bytes): a regular file of at most kTextLimit bytes
// (a FIFO or a device is refused by name, before it is opened).
std::string read_operand(const std::string& path) {
  return io::read_input_file(path, io::kTextLimit, "[tokenizer encode] FILES");
}

// One text's line: the ids, or with --json one object (with "file" for a FILES operand).
void print_encoded(const text::Tokenizer& t, const CodeArgs& a, const std::string& text, const std::string* file) {
  const std::vector<std::int64_t> ids = t.encode(text);
  if (!a.json) {
    std::string line;
    for (std::size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::cout << line << "\n";
    return;
  }
  json pieces = json::array();
  for (std::int64_t id : ids) pieces.push_back(t.piece(id));
  json j;
  j["tokenizer"] = tokenizer_json(t, a.tokenizer);
  if (file) j["file"] = *file;
  j["ids"] = ids;
  j["pieces"] = pieces;
  j["bytes"] = text.size();
  j["tokens"] = ids.size();
  // A llama2.c piece need not be UTF-8: such bytes are written as U+FFFD.
  std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
}

void run_encode(const CodeArgs& a) {
  const std::unique_ptr<text::Tokenizer> t = text::load_tokenizer(a.tokenizer);
  if (a.files.empty()) {
    print_encoded(*t, a, a.text_given->count() > 0 ? a.text : read_stdin(), nullptr);
    return;
  }
  // Every operand is read before anything is printed: a bad one prints nothing.
  std::vector<std::string> texts;
  texts.reserve(a.files.size());
  for (const std::string& f : a.files) texts.push_back(read_operand(f));
  for (std::size_t i = 0; i < texts.size(); ++i) print_encoded(*t, a, texts[i], &a.files[i]);
}

void run_decode(const CodeArgs& a) {
  const std::unique_ptr<text::Tokenizer> t = text::load_tokenizer(a.tokenizer);
  const std::string text = a.ids_given->count() > 0 ? a.ids : read_stdin();
  const std::string out = t->decode(text::parse_token_ids(text, t->vocab_size()));
  std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
}

CLI::Option* add_tokenizer_flag(CLI::App* cmd, std::string& target) {
  return cmd->add_option("--tokenizer", target, "a SentencePiece .model file, a llama2.c tokenizer.bin, or 'bytes' (256 ids, one per byte)")
      ->required()
      ->check(non_empty_path());
}

}  // namespace

void add_tokenizer(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "tokenizer", "SentencePiece tokenizers: train one on text files; encode text to ids and decode ids to text, losslessly");
  cmd->require_subcommand(1);

  auto t = std::make_shared<TrainArgs>();
  CLI::App* tr = cmd->add_subcommand("train", "Train a SentencePiece tokenizer (byte fallback, text kept exactly) on text files");
  tr->add_option("--vocab-size", t->o.vocab_size, "pieces in the vocabulary (at least 260: 256 bytes, 3 control, 1 of text)")
      ->capture_default_str()
      ->check(non_negative_integer());
  tr->add_option("--model-type", t->o.model_type, "bpe, unigram or char")->capture_default_str();
  tr->add_option("--out", t->out, "the .model file to write")->required()->check(non_empty_path());
  tr->add_flag("--overwrite", t->overwrite, "replace an existing --out");
  tr->add_option("--threads", t->o.threads, "SentencePiece trainer threads (1..128); the model depends on it")
      ->capture_default_str()
      ->check(integer());
  tr->add_option("--character-coverage", t->o.character_coverage,
                 "fraction of the characters with a piece of their own, in (0, 1]; 0: chosen from --vocab-size")
      ->capture_default_str()
      ->check(number());
  tr->add_option("--max-sentences", t->o.max_sentences, "train on at most this many lines, drawn at random")
      ->capture_default_str()
      ->check(non_negative_integer());
  tr->add_option("--seed", t->o.seed, "seed of that draw and of SentencePiece's trainer")
      ->capture_default_str()
      ->check(non_negative_integer());
  tr->add_option("files", t->paths, "FILES|DIRS: text files, or folders of them (every file in the folder)")
      ->required()
      ->check(non_empty_path());
  tr->callback([t] { run_train(*t); });

  auto e = std::make_shared<CodeArgs>();
  CLI::App* en = cmd->add_subcommand(
      "encode", "Text (--text, stdin, or each of FILES on its own) to ids: one line per text, or JSON with --json");
  add_tokenizer_flag(en, e->tokenizer);
  e->text_given = en->add_option("--text", e->text, "the text to encode (default: all of stdin)");
  en->add_flag("--json", e->json,
               "print {\"tokenizer\", \"ids\", \"pieces\", \"bytes\", \"tokens\"} as JSON (and \"file\" for FILES)");
  en->add_option("files", e->files, "FILES: encode each file's whole bytes on its own, one output line per file, in order")
      ->check(non_empty_path())
      ->excludes(e->text_given);
  en->callback([e] { run_encode(*e); });

  auto d = std::make_shared<CodeArgs>();
  CLI::App* de = cmd->add_subcommand("decode", "Ids (--ids, or stdin; separated by whitespace) to the exact bytes on stdout");
  add_tokenizer_flag(de, d->tokenizer);
  d->ids_given = de->add_option("--ids", d->ids, "the ids, e.g. \"1 2 3\" (default: all of stdin)");
  de->callback([d] { run_decode(*d); });
}

}  // namespace xg::cli
