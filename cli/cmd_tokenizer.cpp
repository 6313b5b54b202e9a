// `xgrad tokenizer train|encode|decode|export` (docs/cli.md): trains a SentencePiece tokenizer
// on text files, and turns text into ids and back with it (or with the byte tokenizer, or a
// llama2.c tokenizer.bin), exactly:
// decode(encode(s)) == s for any bytes (text/tokenizer.hpp has the rule); writes a
// SentencePiece model as llama2.c's tokenizer.bin.
#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.hpp"
#include "options.hpp"
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
  CLI::Option* json_given = nullptr;
  std::string json_path;  // encode --json [FILE|-]: '-' (also --json alone): stdout
  bool overwrite = false;
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

// One text's line: the ids on stdout (unless --json -), and with --json one object (with
// "file" for a FILES operand) on `json_out`.
void print_encoded(const text::Tokenizer& t, const CodeArgs& a, const std::string& text, const std::string* file,
                   std::ostream& json_out) {
  const std::vector<std::int64_t> ids = t.encode(text);
  if (a.json_path != "-") {
    std::string line;
    for (std::size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
    std::cout << line << "\n";
  }
  if (a.json_path.empty()) return;
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
  json_out << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
}

void run_encode(CodeArgs a) {
  const std::string cmd = "tokenizer encode";
  if (a.json_given->count() > 0 && a.json_path.empty())
    throw UsageError(op_message(cmd, "--json '': must name a file ('-' or --json alone: stdout)"));
  if (a.json_path != "-") {
    std::vector<FileRole> roles = {{"--json", a.json_path, true}, {"--tokenizer", a.tokenizer, false}};
    for (const std::string& f : a.files) roles.push_back({"FILES", f, false});
    check_distinct_files(cmd, roles);
    check_new_output(cmd, "--json", a.json_path, a.overwrite);
  }
  const std::unique_ptr<text::Tokenizer> t = text::load_tokenizer(a.tokenizer);
  // Every text is read before anything is printed: a bad one prints nothing.
  std::vector<std::string> texts;
  if (a.files.empty())
    texts.push_back(a.text_given->count() > 0 ? a.text : read_stdin());
  for (const std::string& f : a.files) texts.push_back(read_operand(f));
  std::ostringstream lines;
  std::ostream& json_out = a.json_path == "-" ? static_cast<std::ostream&>(std::cout) : lines;
  for (std::size_t i = 0; i < texts.size(); ++i) print_encoded(*t, a, texts[i], a.files.empty() ? nullptr : &a.files[i], json_out);
  if (!a.json_path.empty() && a.json_path != "-") {
    std::string text = lines.str();
    if (!text.empty()) text.pop_back();  // write_json ends the document with its newline
    write_json(cmd, "--json", a.json_path, text);
  }
}

void run_decode(const CodeArgs& a) {
  const std::unique_ptr<text::Tokenizer> t = text::load_tokenizer(a.tokenizer);
  const std::string text = a.ids_given->count() > 0 ? a.ids : read_stdin();
  const std::string out = t->decode(text::parse_token_ids(text, t->vocab_size()));
  std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
}

struct ExportArgs {
  std::string format, model, out;
  bool overwrite = false;
};

void run_export(const ExportArgs& a) {
  const std::string cmd = "tokenizer export";
  check_distinct_files(cmd, {{"OUT", a.out, true}, {"MODEL", a.model, false}});
  check_new_output(cmd, "OUT", a.out, a.overwrite);
  const std::unique_ptr<text::Tokenizer> t = text::export_llama2c_tokenizer(a.model, a.out);
  std::cout << "xgrad tokenizer export: " << a.model << " -> " << a.out << " (llama2.c tokenizer.bin, "
            << t->vocab_size() << " pieces)\n";
}

CLI::Option* add_tokenizer_flag(Options& o, std::string& target) {
  return o.add(shared::tokenizer()
                   .with_help("a SentencePiece .model file, a llama2.c tokenizer.bin, or 'bytes' (256 ids, one per byte)")
                   .required(),
               target);
}

}  // namespace

void add_tokenizer(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "tokenizer", "SentencePiece tokenizers: train one on text files; encode text to ids and decode ids to text, losslessly; "
      "export one as llama2.c's tokenizer.bin");
  cmd->require_subcommand(1);
  help_footer(*cmd, "xgrad tokenizer train --vocab-size 512 --out tok.model corpus/");

  auto t = std::make_shared<TrainArgs>();
  CLI::App* tr = cmd->add_subcommand("train", "Train a SentencePiece tokenizer (byte fallback, text kept exactly) on text files");
  // The ranges of these are the tokenizer trainer's own (text/tokenizer.hpp), checked with the corpus.
  Options to(*tr, "tokenizer train");
  to.add(value_flag("vocab_size", "--vocab-size", "pieces in the vocabulary (at least 260: 256 bytes, 3 control, 1 of text)"),
         t->o.vocab_size);
  to.add(text_flag("model_type", "--model-type", "bpe, unigram or char"), t->o.model_type);
  to.add(path_flag("out", "--out", "the .model file to write").required(), t->out);
  to.add(shared::overwrite(), t->overwrite);
  to.add(value_flag("threads", "--threads",
                    "SentencePiece trainer threads (1..128); the model depends on it, so the default is 1, not the cores"),
         t->o.threads);
  to.add(value_flag("character_coverage", "--character-coverage",
                    "fraction of the characters with a piece of their own, in (0, 1]; 0: chosen from --vocab-size"),
         t->o.character_coverage);
  to.add(value_flag("max_sentences", "--max-sentences", "train on at most this many lines, drawn at random"),
         t->o.max_sentences);
  to.add(shared::seed().with_help("seed of that draw and of SentencePiece's trainer"), t->o.seed);
  tr->add_option("files", t->paths, "FILES|DIRS: text files, or folders of them (every file in the folder)")
      ->required()
      ->check(non_empty_path());
  to.example("xgrad tokenizer train --vocab-size 512 --out tok.model corpus/");
  to.on_run([t] { run_train(*t); });

  auto e = std::make_shared<CodeArgs>();
  CLI::App* en = cmd->add_subcommand(
      "encode", "Text (--string, stdin, or each of FILES on its own) to ids: one line per text, and JSON with --json");
  Options eo(*en, "tokenizer encode");
  add_tokenizer_flag(eo, e->tokenizer);
  e->text_given = eo.add(text_flag("string", "--string", "the text to encode (default: all of stdin)")
                             .type("TEXT")
                             .shown_default("-")
                             .was("--text"),
                         e->text);
  e->json_given = eo.add(shared::json().with_help(
                             "also write {\"tokenizer\", \"ids\", \"pieces\", \"bytes\", \"tokens\"} (and \"file\" "
                             "for FILES), one JSON object a line, to FILE; '-' or --json alone: to stdout, in place "
                             "of the ids"),
                         e->json_path);
  e->json_given->expected(0, 1)->default_str("-");  // --json alone: stdout
  eo.add(shared::overwrite(), e->overwrite);
  en->add_option("files", e->files, "FILES: encode each file's whole bytes on its own, one output line per file, in order")
      ->check(non_empty_path())
      ->excludes(e->text_given);
  eo.example("xgrad tokenizer encode --tokenizer tok.model --string 'hello' --json -");
  eo.on_run([e] { run_encode(*e); });

  auto d = std::make_shared<CodeArgs>();
  CLI::App* de = cmd->add_subcommand("decode", "Ids (--ids, or stdin; separated by whitespace) to the exact bytes on stdout");
  Options dopt(*de, "tokenizer decode");
  add_tokenizer_flag(dopt, d->tokenizer);
  d->ids_given = dopt.add(text_flag("ids", "--ids", "the ids, e.g. \"1 2 3\" (default: all of stdin)").shown_default("-"),
                          d->ids);
  dopt.example("xgrad tokenizer decode --tokenizer tok.model --ids '1 2 3'");
  dopt.on_run([d] { run_decode(*d); });

  auto x = std::make_shared<ExportArgs>();
  CLI::App* ex = cmd->add_subcommand(
      "export", "Write a SentencePiece .model in another program's format: llama2.c's tokenizer.bin (run.c reads it)");
  Options xo(*ex, "tokenizer export");
  xo.add(text_flag("format", "--format", "the format to write: llama2c (llama2.c's tokenizer.bin, as its tokenizer.py writes it)")
             .one_of({"llama2c"})
             .required(),
         x->format);
  xo.add(shared::overwrite().with_help("replace an existing OUT"), x->overwrite);
  ex->add_option("model", x->model, "MODEL: the SentencePiece .model file")->required()->check(non_empty_path());
  ex->add_option("out", x->out, "OUT: the file to write (tokenizer.bin)")->required()->check(non_empty_path());
  xo.example("xgrad tokenizer export --format llama2c tok.model tokenizer.bin");
  xo.on_run([x] { run_export(*x); });
}

}  // namespace xg::cli
