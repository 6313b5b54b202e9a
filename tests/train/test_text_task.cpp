// The text task's corpus (text/corpus.hpp) and the task end to end with the byte tokenizer;
// --doc-separator: the token streams of training and eval, its default and its legacy value.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/train/convert.hpp>
#include <xgrad/train/options.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/text/tokenizer.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
namespace fs = std::filesystem;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string lines(std::size_t n, const std::string& word) {
  std::string s;
  for (std::size_t i = 0; i < n; ++i) s += word + " number " + std::to_string(i) + " is here.\n";
  return s;
}

}  // namespace

TEST_CASE("text corpus: a folder's files are documents in path order with empty files skipped", "[text]") {
  const fs::path dir = xgt::temp_dir("text_docs");
  write(dir / "b.txt", "bee\n");
  write(dir / "a" / "z.txt", "zed\n");
  write(dir / "empty.txt", "");
  const auto docs = text::list_documents(dir.string());
  REQUIRE(docs.size() == 2);
  CHECK(docs[0].name == "a/z.txt");
  CHECK(docs[1].name == "b.txt");
  CHECK(docs[1].size == 4);
}

TEST_CASE("text corpus: a large file is cut into documents at line ends that add up to it", "[text]") {
  const fs::path dir = xgt::temp_dir("text_big");
  const std::string text = lines(60000, "line");  // about 1.6 MB: two documents or more
  write(dir / "big.txt", text);
  const auto docs = text::list_documents((dir / "big.txt").string());
  REQUIRE(docs.size() >= 2);
  std::uint64_t at = 0;
  for (const auto& d : docs) {
    CHECK(d.offset == at);
    CHECK(text[d.offset + d.size - 1] == '\n');
    at += d.size;
  }
  CHECK(at == text.size());
  CHECK(docs[1].name == "big.txt#1");
}

TEST_CASE("text corpus: symbolic-link loops are refused naming the link and FIFOs are refused unopened", "[text]") {
  const fs::path dir = xgt::temp_dir("text_loops");
  const std::string line = "the quick brown fox jumps over the lazy dog.\n";
  std::string text;
  for (int i = 0; i < 200; ++i) text += line;
  write(dir / "c" / "a.txt", text);
  fs::create_directories(dir / "c" / "sub");
  fs::create_directory_symlink("..", dir / "c" / "sub" / "up");  // c/sub/up -> c: a loop
  fs::create_directory_symlink("..", dir / "c" / "sub" / "up2");
  CHECK_THROWS_WITH(text::list_documents((dir / "c").string()),
                    Catch::Contains((dir / "c" / "sub" / "up").string() + " leads back to a folder it is in"));
  write(dir / "d" / "a.txt", text);
  fs::create_symlink("b", dir / "d" / "a");
  fs::create_symlink("a", dir / "d" / "b");
  CHECK_THROWS_WITH(text::list_documents((dir / "d").string()), Catch::Contains("is a loop of symbolic links"));
  // Two links to one folder that is no ancestor: read once, no error.
  write(dir / "e" / "shared" / "a.txt", text);
  fs::create_directory_symlink("shared", dir / "e" / "l1");
  fs::create_directory_symlink("shared", dir / "e" / "l2");
  CHECK(text::list_documents((dir / "e").string()).size() == text::list_documents((dir / "e" / "shared").string()).size());
  const std::string fifo = (dir / "pipe").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH(text::list_documents(fifo), Catch::Contains("is a named pipe (FIFO), not a regular file"));
  CHECK_THROWS_WITH(text::list_documents("/dev/zero"), Catch::Contains("is a character device"));
}

TEST_CASE("text corpus: missing paths and folders without text are usage errors", "[text]") {
  const fs::path dir = xgt::temp_dir("text_bad");
  CHECK_THROWS_AS(text::list_documents((dir / "missing").string()), UsageError);
  fs::create_directories(dir / "none");
  CHECK_THROWS_WITH(text::list_documents((dir / "none").string()), Catch::Contains("without files"));
  write(dir / "empties" / "e.txt", "");
  CHECK_THROWS_WITH(text::list_documents((dir / "empties").string()), Catch::Contains("holds no text"));
  write(dir / "bin" / "x.bin", std::string("abc\0def", 7));
  CHECK_THROWS_WITH(text::list_documents((dir / "bin").string()), Catch::Contains("looks binary"));
  std::string noise;
  for (int i = 0; i < 1000; ++i) noise += static_cast<char>(0x80 + i % 64);
  write(dir / "noise" / "n.txt", noise);
  CHECK_THROWS_WITH(text::list_documents((dir / "noise").string()), Catch::Contains("not UTF-8"));
}

TEST_CASE("text corpus: the split is by document and the same every time with both sides non-empty", "[text]") {
  std::vector<text::Document> docs;
  for (int i = 0; i < 200; ++i) docs.push_back({"p", "doc" + std::to_string(i), 0, 10});
  std::vector<text::Document> tr, val, tr2, val2;
  text::split_documents(docs, 0.1, tr, val);
  text::split_documents(docs, 0.1, tr2, val2);
  CHECK(tr.size() + val.size() == 200);
  CHECK(val.size() >= 8);
  CHECK(val.size() <= 35);
  REQUIRE(val.size() == val2.size());
  for (std::size_t i = 0; i < val.size(); ++i) CHECK(val[i].name == val2[i].name);
  std::vector<text::Document> two = {{"p", "x", 0, 1}, {"p", "y", 0, 1}};
  text::split_documents(two, 0.1, tr, val);
  CHECK(tr.size() == 1);
  CHECK(val.size() == 1);
  CHECK_THROWS_WITH(text::split_documents({{"p", "only", 0, 5}}, 0.1, tr, val), Catch::Contains("one document"));
}

TEST_CASE("text corpus: a token file holds the ids of the text and reads back through its map", "[text]") {
  const fs::path dir = xgt::temp_dir("text_tokens");
  std::string text;
  for (int b = 0; b < 256; ++b) text += static_cast<char>(b == 0 ? 1 : b);
  text += "\n";
  write(dir / "t.txt", text);
  const auto tok = text::make_byte_tokenizer();
  std::vector<text::Document> docs = {{(dir / "t.txt").string(), "t.txt", 0, text.size()}};
  const std::uint64_t n = text::tokenize_documents(docs, *tok, (dir / "t.bin").string());
  CHECK(n == text.size());
  CHECK(fs::file_size(dir / "t.bin") == 24 + text.size());  // one byte a token for 256 ids
  const text::TokenFile f((dir / "t.bin").string());
  REQUIRE(f.size() == text.size());
  CHECK(f.bytes() == text.size());
  std::vector<std::int64_t> ids;
  for (std::uint64_t i = 0; i < f.size(); ++i) ids.push_back(f[i]);
  CHECK(tok->decode(ids) == text);
  write(dir / "bad.bin", "xgtok1 and then nothing that fits");
  CHECK_THROWS_AS(text::TokenFile((dir / "bad.bin").string()), FormatError);
  write(dir / "short.bin", "xg");
  CHECK_THROWS_AS(text::TokenFile((dir / "short.bin").string()), FormatError);
}

TEST_CASE("text corpus: base64 matches RFC 4648 and refuses other text", "[text]") {
  CHECK(text::base64_encode("") == "");
  CHECK(text::base64_encode("f") == "Zg==");
  CHECK(text::base64_encode("fo") == "Zm8=");
  CHECK(text::base64_encode("foobar") == "Zm9vYmFy");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  CHECK(text::base64_decode(text::base64_encode(all), "t") == all);
  CHECK(text::base64_decode("Zm8=", "t") == "fo");
  CHECK_THROWS_AS(text::base64_decode("Zm8", "t"), FormatError);
  CHECK_THROWS_AS(text::base64_decode("Zm!=", "t"), FormatError);
}

TEST_CASE("text corpus: printable keeps UTF-8 and line breaks and escapes control and stray bytes", "[text]") {
  CHECK(text::printable("plain text\n\tnext") == "plain text\n\tnext");
  CHECK(text::printable("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80") == "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  CHECK(text::printable(std::string("a\x1b[2Jb\x07\x7f", 8)) == "a\\x1B[2Jb\\x07\\x7F");
  CHECK(text::printable(std::string("\0", 1)) == "\\x00");
  // Stray continuation, truncated sequence, overlong form, surrogate, above U+10FFFF.
  CHECK(text::printable("\x80x") == "\\x80x");
  CHECK(text::printable("\xC3") == "\\xC3");
  CHECK(text::printable("\xE2\x82") == "\\xE2\\x82");
  CHECK(text::printable("\xC0\xAF") == "\\xC0\\xAF");
  CHECK(text::printable("\xED\xA0\x80") == "\\xED\\xA0\\x80");
  CHECK(text::printable("\xF4\x90\x80\x80") == "\\xF4\\x90\\x80\\x80");
}

TEST_CASE("text corpus: uncapped validation windows make every token after the first a target once", "[text]") {
  for (std::uint64_t n : {2u, 3u, 17u, 64u, 65u, 1000u}) {
    const auto w = text::validation_windows(n, 8, 1000000);
    std::multiset<std::uint64_t> targets;
    for (std::uint64_t s : w.starts)
      for (std::uint64_t t = s + 1; t <= std::min<std::uint64_t>(s + 8, n - 1); ++t) targets.insert(t);
    CHECK(targets.size() == n - 1);
    CHECK(std::set<std::uint64_t>(targets.begin(), targets.end()).size() == n - 1);
  }
  CHECK(text::validation_windows(100000, 8, 10).starts.size() == 10);
}

TEST_CASE("text task: bytes training logs bits per byte as val_loss over ln 2 and reports it", "[text]") {
  const fs::path dir = xgt::temp_dir("text_train");
  for (int i = 0; i < 12; ++i) write(dir / "corpus" / ("doc" + std::to_string(i) + ".txt"), lines(40, "word" + std::to_string(i)));
  train::TrainOptions o;
  o.task = "text";
  o.text = (dir / "corpus").string();
  o.out = (dir / "run").string();
  o.steps = 6;
  o.lr = 0.005;
  o.batch = 4;
  o.context = 16;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.eval_every = 3;
  o.progress = o.plot = false;
  std::ostringstream log;
  const train::TrainResult r = train::run_training(o, log);
  CHECK(r.metric_name == "val_bits_per_byte");
  CHECK_THAT(log.str(), Catch::Contains("RESULT val_bits_per_byte"));
  std::istringstream csv(xgt::read_file(dir / "run" / "log.csv"));
  std::string line;
  std::getline(csv, line);
  CHECK(line == "step,lr,loss,grad_norm,tokens_per_s,elapsed_s,val_loss,val_bpb");
  int evaluated = 0;
  double last_bpb = 0;
  while (std::getline(csv, line)) {
    std::vector<std::string> f(1);
    for (char ch : line)
      if (ch == ',')
        f.emplace_back();
      else
        f.back().push_back(ch);
    REQUIRE(f.size() == 8);
    const std::string val = f[6], bpb = f[7];
    CHECK(val.empty() == bpb.empty());
    if (val.empty()) continue;
    ++evaluated;
    last_bpb = std::stod(bpb);
    CHECK(std::abs(std::stod(bpb) - std::stod(val) / std::log(2.0)) < 1e-12 * std::stod(bpb));  // bytes: a token is a byte
  }
  CHECK(evaluated == 2);
  CHECK(std::abs(r.metric - last_bpb) < 1e-9);
  CHECK(fs::exists(dir / "run" / "train.bin"));
  CHECK(fs::exists(dir / "run" / "model_best.safetensors"));
  // Resuming a finished run's folder after its texts changed is refused, naming them.
  train::TrainOptions again;
  again.resume = o.out;
  again.progress = again.plot = false;
  write(dir / "corpus" / "doc0.txt", "changed\n");
  CHECK_THROWS_WITH(train::run_training(again, log), Catch::Contains("changed since the run was saved"));
}

TEST_CASE("text corpus: one file of a few pages still splits into documents", "[text]") {
  const fs::path dir = xgt::temp_dir("text_one_file");
  write(dir / "one.txt", lines(1500, "page"));  // about 40 KB
  const auto docs = text::list_documents((dir / "one.txt").string());
  CHECK(docs.size() >= 8);
  std::vector<text::Document> tr, val;
  text::split_documents(docs, 0.1, tr, val);
  CHECK(!tr.empty());
  CHECK(!val.empty());
}

TEST_CASE("text task: a corpus smaller than one training window is a usage error naming --context", "[text]") {
  const fs::path dir = xgt::temp_dir("text_tiny");
  write(dir / "corpus" / "a.txt", "tiny text\n");
  write(dir / "corpus" / "b.txt", "more tiny\n");
  train::TrainOptions o;
  o.task = "text";
  o.text = (dir / "corpus").string();
  o.out = (dir / "run").string();
  o.steps = 2;
  o.lr = 0.005;
  o.context = 64;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.progress = o.plot = false;
  std::ostringstream log;
  CHECK_THROWS_AS(train::run_training(o, log), UsageError);
  CHECK_THROWS_WITH(train::run_training(o, log), Catch::Contains("--context"));
}

TEST_CASE("text corpus: the run's own --out folder inside --text is not read / --text inside --out is refused", "[text]") {
  const fs::path dir = xgt::temp_dir("text_out_inside");
  write(dir / "a.txt", lines(200, "alpha"));
  write(dir / "b.txt", lines(200, "beta"));
  write(dir / "run" / "log.csv", "step,lr\n1,0.1\n");  // a run's files: not text of the corpus
  write(dir / "run" / "deep" / "notes.txt", "not read\n");
  const auto docs = text::list_documents(dir.string(), (dir / "run").string());
  std::set<std::string> names;
  for (const auto& d : docs) names.insert(d.name.substr(0, d.name.find('#')));
  CHECK(names == std::set<std::string>{"a.txt", "b.txt"});
  CHECK(text::list_documents(dir.string()).size() > docs.size());  // without the exclusion they are read
  CHECK_THROWS_WITH(text::list_documents((dir / "run").string(), (dir / "run").string()),
                    Catch::Contains("is the output folder"));
  CHECK_THROWS_WITH(text::list_documents((dir / "run" / "deep").string(), (dir / "run").string()),
                    Catch::Contains("inside it"));
  // End to end: `--text DIR --out DIR/run`, stopped and resumed, reads only a.txt and b.txt
  // both times (the resume would otherwise find the run's token files and logs in its text).
  fs::remove_all(dir / "run");
  train::TrainOptions o;
  o.task = "text";
  o.text = dir.string();
  o.out = (dir / "run").string();
  o.steps = 4;
  o.stop_at = 2;
  o.lr = 0.005;
  o.batch = 4;
  o.context = 16;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.threads = 1;
  o.progress = o.plot = false;
  std::ostringstream log;
  train::run_training(o, log);
  train::TrainOptions again;
  again.resume = o.out;
  again.progress = again.plot = false;
  CHECK(train::run_training(again, log).steps_done == 4);
  CHECK_THAT(log.str(), Catch::Contains(std::to_string(docs.size()) + " documents,"));
}

TEST_CASE("text task: the model records --val-fraction and convert holds out the same documents", "[text]") {
  const fs::path dir = xgt::temp_dir("text_val_fraction");
  for (int i = 0; i < 12; ++i) write(dir / "corpus" / ("doc" + std::to_string(i) + ".txt"), lines(40, "word" + std::to_string(i)));
  train::TrainOptions o;
  o.task = "text";
  o.text = (dir / "corpus").string();
  o.out = (dir / "run").string();
  o.val_fraction = 0.5;
  o.steps = 2;
  o.lr = 0.005;
  o.batch = 4;
  o.context = 16;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.threads = 1;
  o.progress = o.plot = false;
  std::ostringstream log;
  train::run_training(o, log);
  const std::string model = (dir / "run" / "model.safetensors").string();
  CHECK(io::safetensors::load_header(model).metadata.at("val_fraction") == "0.5");
  train::ConvertOptions c;
  c.in = model;
  c.out = (dir / "half.safetensors").string();
  c.kv_heads = 2;
  c.text = o.text;
  const std::size_t positions = train::convert_checkpoint(c).positions;
  // The same model said to be of a run with the old default: other documents, other positions.
  io::safetensors::File f = io::safetensors::load(model);
  f.metadata["val_fraction"] = train::exact(0.1);
  const std::string tenth = (dir / "tenth.safetensors").string();
  io::safetensors::save(tenth, f.tensors, f.metadata);
  c.in = tenth;
  c.out = (dir / "tenth_out.safetensors").string();
  const std::size_t positions_tenth = train::convert_checkpoint(c).positions;
  CHECK(positions != positions_tenth);
  // A model saved before the key: 0.1.
  f.metadata.erase("val_fraction");
  const std::string old = (dir / "old.safetensors").string();
  io::safetensors::save(old, f.tensors, f.metadata);
  c.in = old;
  c.out = (dir / "old_out.safetensors").string();
  CHECK(train::convert_checkpoint(c).positions == positions_tenth);
}

// --doc-separator (text/corpus.hpp DocSeparator) --------------------------------------------

namespace {

// A tokenizer for the separator tests that needs no SentencePiece: bytes as ids 0..255, BOS
// 256, EOS 257 (the byte tokenizer itself has neither).
class BytesWithMarks : public text::Tokenizer {
 public:
  std::string kind() const override { return "test"; }
  std::size_t vocab_size() const override { return 258; }
  std::vector<std::int64_t> encode(std::string_view t) const override {
    std::vector<std::int64_t> ids;
    for (char c : t) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string decode(const std::vector<std::int64_t>& ids) const override {
    std::string s;
    for (std::int64_t id : ids)
      if (id < 256) s += static_cast<char>(id);
    return s;
  }
  std::string piece(std::int64_t id) const override { return std::to_string(id); }
  std::string serialized() const override { return ""; }
  std::int64_t bos_id() const override { return 256; }
  std::int64_t eos_id() const override { return 257; }
};

std::vector<std::uint32_t> token_file_ids(const fs::path& p) {
  const text::TokenFile f(p.string());
  std::vector<std::uint32_t> ids;
  for (std::uint64_t i = 0; i < f.size(); ++i) ids.push_back(f[i]);
  return ids;
}

train::TrainOptions small_text_run(const fs::path& dir, const std::string& tokenizer, const std::string& out) {
  train::TrainOptions o;
  o.task = "text";
  o.text = (dir / "corpus").string();
  o.tokenizer = tokenizer;
  o.out = (dir / out).string();
  o.steps = 4;
  o.lr = 0.005;
  o.batch = 4;
  o.context = 16;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 1;
  o.threads = 1;
  o.checkpoint_every = 0;
  o.progress = o.plot = false;
  return o;
}

}  // namespace

TEST_CASE("text corpus: with a separator every window that crosses a document boundary holds it", "[text]") {
  const fs::path dir = xgt::temp_dir("text_doc_separator");
  const std::vector<std::string> texts = {"first document\n", "the second one, a little longer\n", "3rd\n",
                                          "and the fourth and last document of the corpus\n"};
  std::vector<text::Document> docs;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    const fs::path p = dir / ("d" + std::to_string(i) + ".txt");
    write(p, texts[i]);
    docs.push_back({p.string(), p.filename().string(), 0, texts[i].size()});
  }
  const BytesWithMarks tok;
  const std::size_t T = 8;
  for (text::DocSeparator sep : {text::DocSeparator::bos, text::DocSeparator::eos, text::DocSeparator::none}) {
    const std::string name = text::doc_separator_name(sep);
    INFO("--doc-separator " << name);
    const std::int64_t id = text::doc_separator_id(sep, tok, "test", "train");
    CHECK(id == (sep == text::DocSeparator::bos ? 256 : sep == text::DocSeparator::eos ? 257 : -1));
    const fs::path bin = dir / (name + ".bin");
    const std::uint64_t n = text::tokenize_documents(docs, tok, bin.string(), sep, id);
    const std::vector<std::uint32_t> got = token_file_ids(bin);
    // The stream, spelled out: BOS before / EOS after each document's bytes.
    std::vector<std::uint32_t> want;
    std::vector<int> doc_of;  // the document of each position (-1: the separator)
    for (std::size_t d = 0; d < texts.size(); ++d) {
      if (sep == text::DocSeparator::bos) want.push_back(256), doc_of.push_back(-1);
      for (char c : texts[d]) want.push_back(static_cast<unsigned char>(c)), doc_of.push_back(static_cast<int>(d));
      if (sep == text::DocSeparator::eos) want.push_back(257), doc_of.push_back(-1);
    }
    CHECK(n == want.size());
    CHECK(got == want);
    // eval's and convert's stream (add_document_ids over the same documents) is the same.
    std::vector<std::uint32_t> in_memory;
    for (const text::Document& d : docs) text::add_document_ids(in_memory, tok.encode(text::read_document(d)), sep, id);
    CHECK(in_memory == got);
    // Every training window (T + 1 tokens from any start, as the task draws them) that holds
    // text of two documents holds the separator; without one, some window crosses bare.
    std::size_t crossing = 0, bare = 0;
    for (std::size_t s = 0; s + T + 1 <= want.size(); ++s) {
      std::set<int> text_docs;
      bool separator = false;
      for (std::size_t t = s; t <= s + T; ++t) {
        if (doc_of[t] < 0) separator = true;
        else text_docs.insert(doc_of[t]);
      }
      if (text_docs.size() < 2) continue;
      ++crossing;
      if (!separator) ++bare;
    }
    CHECK(crossing > 0);
    if (sep == text::DocSeparator::none) CHECK(bare == crossing);
    else CHECK(bare == 0);
  }
  // The byte tokenizer has neither token: a usage error naming it.
  const auto bytes = text::make_byte_tokenizer();
  CHECK(xgt::error_of<UsageError>([&] { text::doc_separator_id(text::DocSeparator::bos, *bytes, "bytes", "train"); })
            .find("--doc-separator bos: the tokenizer bytes has no BOS token") != std::string::npos);
  CHECK(xgt::error_of<UsageError>([&] { text::doc_separator_id(text::DocSeparator::eos, *bytes, "bytes", "train"); })
            .find("--doc-separator eos: the tokenizer bytes has no EOS token") != std::string::npos);
  CHECK(xgt::error_of<FormatError>([] { text::doc_separator_from_name("auto", "m.safetensors"); })
            .find("m.safetensors: document separator 'auto' is not bos, eos or none") != std::string::npos);
}

TEST_CASE("text task: --doc-separator defaults to bos with a BOS and none with bytes and is refused without one", "[text]") {
  const fs::path dir = xgt::temp_dir("text_doc_separator_run");
  for (int i = 0; i < 8; ++i) write(dir / "corpus" / ("doc" + std::to_string(i) + ".txt"), lines(30, "word" + std::to_string(i)));
  std::ostringstream log;
  // Bytes: auto is none; nothing about it is saved (the checkpoints of earlier versions' bytes).
  train::TrainOptions b = small_text_run(dir, "bytes", "bytes_run");
  train::run_training(b, log);
  CHECK(io::safetensors::load_header((dir / "bytes_run" / "model.safetensors").string()).metadata.count("doc_separator") == 0);
  CHECK(io::safetensors::load_header((dir / "bytes_run" / "train_state.safetensors").string()).metadata.count("opt.doc_separator") == 0);
  CHECK(token_file_ids(dir / "bytes_run" / "train.bin").size() == text::TokenFile((dir / "bytes_run" / "train.bin").string()).bytes());
  train::TrainOptions bad = small_text_run(dir, "bytes", "bad_run");
  bad.doc_separator = "bos";
  CHECK(xgt::error_of<UsageError>([&] { train::run_training(bad, log); })
            .find("--doc-separator bos: the tokenizer bytes has no BOS token") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "bad_run" / "train.bin"));
  if (!text::sentencepiece_available()) {
    WARN("xgrad without SentencePiece: the BOS default is not tested here");
    return;
  }
  text::TokenizerTrainOptions to;
  to.vocab_size = 300;
  text::train_sentencepiece({(dir / "corpus").string()}, to, (dir / "tok.model").string());
  const std::string tok_path = (dir / "tok.model").string();
  const std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(tok_path);
  REQUIRE(tok->bos_id() == 1);
  // The default with a SentencePiece model: bos, saved in the run's state and in the model.
  train::TrainOptions s = small_text_run(dir, tok_path, "sp_run");
  train::run_training(s, log);
  CHECK_THAT(log.str(), Catch::Contains("documents joined by BOS (id 1) before each"));
  const fs::path run = dir / "sp_run";
  CHECK(io::safetensors::load_header((run / "model.safetensors").string()).metadata.at("doc_separator") == "bos");
  io::safetensors::Metadata state = io::safetensors::load_header((run / "train_state.safetensors").string()).metadata;
  CHECK(state.at("opt.doc_separator") == "bos");
  // A state saved before the option (no key) means none: documents joined with nothing between,
  // what the text task did then.
  state.erase("opt.doc_separator");
  CHECK(train::options_from_metadata(state, train::TrainOptions{}, "state").doc_separator == "none");
  // train.bin and val.bin: the split's documents, each after a BOS (the rule eval applies).
  std::vector<text::Document> tr, val;
  text::split_documents(text::list_documents((dir / "corpus").string()), s.val_fraction, tr, val);
  for (const auto& [docs, file] : {std::pair{tr, "train.bin"}, std::pair{val, "val.bin"}}) {
    std::vector<std::uint32_t> want;
    for (const text::Document& d : docs) text::add_document_ids(want, tok->encode(text::read_document(d)), text::DocSeparator::bos, 1);
    const std::vector<std::uint32_t> got = token_file_ids(run / file);
    CHECK(got == want);
    CHECK(static_cast<std::size_t>(std::count(got.begin(), got.end(), 1u)) == docs.size());
    CHECK(got.front() == 1u);
  }
  // --doc-separator none with the same tokenizer: no key saved (a run of before the option
  // looks the same), and --resume keeps none: the resumed run ends bit for bit where an
  // uninterrupted none run ends, and elsewhere than the bos run.
  train::TrainOptions n = small_text_run(dir, tok_path, "none_run");
  n.doc_separator = "none";
  train::run_training(n, log);
  train::TrainOptions stopped = small_text_run(dir, tok_path, "none_resumed");
  stopped.doc_separator = "none";
  stopped.stop_at = 2;
  train::run_training(stopped, log);
  CHECK(io::safetensors::load_header((dir / "none_resumed" / "train_state.safetensors").string()).metadata.count("opt.doc_separator") == 0);
  train::TrainOptions again;
  again.resume = stopped.out;
  again.threads = 1;
  again.progress = again.plot = false;
  train::run_training(again, log);
  const auto weights = [](const fs::path& p) {
    std::map<std::string, std::vector<double>> out;
    for (const auto& [k, t] : io::safetensors::load(p.string()).tensors) out[k] = t.to_vector();
    return out;
  };
  const auto w_none = weights(dir / "none_run" / "model.safetensors");
  CHECK(weights(dir / "none_resumed" / "model.safetensors") == w_none);
  CHECK(weights(run / "model.safetensors") != w_none);
  CHECK(io::safetensors::load_header((dir / "none_run" / "model.safetensors").string()).metadata.count("doc_separator") == 0);
}
