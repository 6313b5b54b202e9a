// Tokenizers (text/tokenizer.hpp): the byte tokenizer; SentencePiece models trained here on
// a small mixed corpus (ASCII, accented Latin, CJK, emoji, tabs, CR/LF, control bytes), whose
// encoding must be lossless for every byte string; the errors of loading and training; and
// the ids text that `xgrad tokenizer decode` reads. In a build without SentencePiece the
// SentencePiece tests check the refusal instead.
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/core/detail/sha256.hpp>
#include <xgrad/text/tokenizer.hpp>

namespace {

using namespace xg;
using xgt::error_of;
using text::Tokenizer;



// A mixed corpus: lines drawn from several scripts and kinds of text, about 60 KB.
std::string mixed_corpus(std::uint64_t seed) {
  const char* const lines[] = {
      "The quick brown fox jumps over the lazy dog.",
      "Licensed under the terms of the license, without warranties or conditions.",
      "Le c\xC5\x93ur a ses raisons que la raison ne conna\xC3\xAEt point; \xC3\xA9t\xC3\xA9, na\xC3\xAFve, \xC3\xA0 bient\xC3\xB4t.",
      "Gr\xC3\xBC\xC3\x9F" "e aus M\xC3\xBCnchen: \xC3\x84pfel, \xC3\x96l und \xC3\x9C" "bermut.",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88\xE3\x81\xA7\xE3\x81\x99\xE3\x80\x82",
      "\xE4\xB8\xAD\xE6\x96\x87\xE6\x96\x87\xE6\x9C\xAC\xEF\xBC\x8C\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82",
      "emoji \xF0\x9F\x98\x80 \xF0\x9F\x8E\x89 party \xF0\x9F\x9A\x80 rocket",
      "int main() {\n\treturn 0;\n}",
      "windows line\r\nends here\r\n",
      "tabs\tand\tcolumns\t1\t2\t3",
      "bell\x07 and escape\x1b[0m codes",
      "numbers 12345 67890 3.14159 2.71828",
  };
  Generator g(seed);
  std::string text;
  while (text.size() < 60000) {
    text += lines[g.below(std::size(lines))];
    text += g.below(4) == 0 ? "\n\n" : "\n";
  }
  return text;
}

// The vocabulary trained for each model type (the corpus supports at most 413 unigram pieces).
std::size_t vocab_of(const std::string& model_type) {
  return model_type == "char" ? 300 : model_type == "unigram" ? 400 : 420;
}

// The corpus folder (two files) and a model trained on it, once per test run.
struct Trained {
  std::filesystem::path dir, corpus, model;
};

const Trained& trained(const std::string& model_type = "bpe") {
  static std::map<std::string, Trained> cache;
  auto it = cache.find(model_type);
  if (it != cache.end()) return it->second;
  Trained t;
  t.dir = xgt::temp_dir("tokenizer_" + model_type);
  t.corpus = t.dir / "corpus";
  std::filesystem::create_directories(t.corpus);
  xgt::write_file(t.corpus / "a.txt", mixed_corpus(1));
  xgt::write_file(t.corpus / "b.txt", mixed_corpus(2));
  t.model = t.dir / "tok.model";
  text::TokenizerTrainOptions o;
  o.model_type = model_type;
  o.vocab_size = vocab_of(model_type);
  text::train_sentencepiece({t.corpus.string()}, o, t.model.string());
  return cache.emplace(model_type, t).first->second;
}

std::vector<std::string> hard_cases() {
  return {"",
          "plain ASCII text.",
          "  leading spaces, double  spaces and trailing ones  ",
          "caf\xC3\xA9 na\xC3\xAF" "ve \xC3\x85ngstr\xC3\xB6m",
          "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE4\xB8\xAD\xE6\x96\x87",
          "\xF0\x9F\x98\x80\xF0\x9F\x8E\x89\xF0\x9F\xA6\x84",  // emoji, the last one unseen in training
          std::string("nul\0inside\0\0", 13),
          "\x01\x02\x03\x7f control bytes \x1b",
          "cr\r\nlf\n\r\n\ttab\t",
          "\x80 lone continuation \xBF",
          "truncated \xC3 and \xE6\x97 and \xF0\x9F\x98",
          "overlong \xC0\x80 \xE0\x80\x80 \xF0\x80\x80\x80",
          "surrogate \xED\xA0\x80 and above U+10FFFF \xF4\x90\x80\x80 and \xF8\x88\x80\x80\x80",
          "\xFF\xFE\xFD",
          "\xE2\x96\x81",  // U+2581 itself
          "\xE2\x96\x81" "a\xE2\x96\x81\xE2\x96\x81 b \xE2\x96\x81",
          "mixed \xE2\x96\x81 and \xFF and \xE6\x97\xA5 in one",
          "\xEF\xBF\xBD is U+FFFD itself",
          "<s> </s> <unk> <0x41> look like pieces",
          std::string(5000, 'a') + std::string(3000, ' ') + "\xE6\x97\xA5"};
}

// Random byte strings: mostly pieces of UTF-8 text and fragments of it, some uniform bytes.
std::vector<std::string> random_strings(std::size_t count, std::uint64_t seed) {
  const std::string alphabet[] = {"a", "b", " ", "  ", "\n", "\r", "\t", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80",
                                  "\xE2\x96\x81", "\xC3", "\x9F", "\xF0\x9F", std::string(1, '\0'), "the ", "\xEF\xBF\xBD"};
  Generator g(seed);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < count; ++i) {
    std::string s;
    const std::size_t n = g.below(40);
    for (std::size_t j = 0; j < n; ++j) {
      if (g.below(3) == 0)
        s += static_cast<char>(g.below(256));
      else
        s += alphabet[g.below(std::size(alphabet))];
    }
    out.push_back(s);
  }
  return out;
}

std::string hex_of(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    out += "0123456789abcdef"[c >> 4];
    out += "0123456789abcdef"[c & 15];
  }
  return out;
}

void require_round_trip(const Tokenizer& t, const std::string& s) {
  const std::vector<std::int64_t> ids = t.encode(s);
  for (std::int64_t id : ids) {
    INFO("text " << hex_of(s));
    REQUIRE(id >= 0);
    REQUIRE(static_cast<std::size_t>(id) < t.vocab_size());
  }
  const std::string back = t.decode(ids);
  INFO("text " << hex_of(s) << " came back as " << hex_of(back));
  REQUIRE(back == s);
}

}  // namespace

TEST_CASE("byte tokenizer maps every byte to its value and back", "[tokenizer]") {
  const auto t = text::make_byte_tokenizer();
  CHECK(t->kind() == "bytes");
  CHECK(t->vocab_size() == 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::vector<std::int64_t> ids = t->encode(all);
  REQUIRE(ids.size() == 256);
  for (int b = 0; b < 256; ++b) CHECK(ids[static_cast<std::size_t>(b)] == b);
  CHECK(t->decode(ids) == all);
  for (const std::string& s : random_strings(500, 7)) require_round_trip(*t, s);
  CHECK(t->piece('A') == "A");
  CHECK(t->piece(' ') == " ");
  CHECK(t->piece(10) == "<0x0A>");
  CHECK(t->piece(0xC3) == "<0xC3>");
  CHECK(t->serialized().empty());
  CHECK(t->digest() == "277089d91c0bdf4f2e6862ba7e4a07605119431f5d13f726dd352b06f1b206a9");  // sha256("bytes")
  CHECK(t->description() == "bytes (256)");
  CHECK(error_of<ValueError>([&] { t->decode({1, 256}); }).find("id 256 is outside the vocabulary of 256") !=
        std::string::npos);
  CHECK(error_of<ValueError>([&] { t->decode({-1}); }).find("id -1") != std::string::npos);
  CHECK(error_of<ValueError>([&] { t->piece(300); }).find("id 300") != std::string::npos);
  CHECK(text::load_tokenizer("bytes")->kind() == "bytes");
  CHECK(text::tokenizer_from_serialized("bytes", "", "test")->vocab_size() == 256);
  CHECK(error_of<ValueError>([] { text::tokenizer_from_serialized("bytes", "x", "ckpt"); }).find("ckpt") !=
        std::string::npos);
  CHECK(error_of<ValueError>([] { text::tokenizer_from_serialized("wordpiece", "", "ckpt"); })
            .find("unknown tokenizer kind 'wordpiece'") != std::string::npos);
}

TEST_CASE("token ids text is whitespace-separated decimal ids inside the vocabulary", "[tokenizer]") {
  CHECK(text::parse_token_ids("", 10).empty());
  CHECK(text::parse_token_ids(" \n\t ", 10).empty());
  CHECK(text::parse_token_ids("1 2 3", 10) == std::vector<std::int64_t>{1, 2, 3});
  CHECK(text::parse_token_ids("\t0\n9  \r\n5 ", 10) == std::vector<std::int64_t>{0, 9, 5});
  CHECK(text::parse_token_ids("007", 10) == std::vector<std::int64_t>{7});
  const auto usage = [](const std::string& text) {
    return error_of<UsageError>([&] { text::parse_token_ids(text, 10); });
  };
  CHECK(usage("1 2 10").find("id 10 (word 3) is outside the vocabulary of 10 (ids 0..9)") != std::string::npos);
  CHECK(usage("-1").find("id -1 (word 1) is outside the vocabulary of 10") != std::string::npos);
  CHECK(usage("99999999999999999999999").find("outside the vocabulary of 10") != std::string::npos);
  CHECK(usage("1 x").find("'x' (word 2) is not an id") != std::string::npos);
  CHECK(usage("1,2").find("'1,2' (word 1) is not an id") != std::string::npos);
  CHECK(usage("-").find("'-' (word 1) is not an id") != std::string::npos);
  CHECK(usage("0x10").find("not an id") != std::string::npos);
  CHECK(usage("1.5").find("not an id") != std::string::npos);
  CHECK(usage("\xFF").find("'\\xff'") != std::string::npos);  // shown escaped, never raw
}

TEST_CASE("sentencepiece tokenizer round-trips every byte string exactly", "[tokenizer]") {
  if (!text::sentencepiece_available()) {
    CHECK(error_of<UsageError>([] { text::load_tokenizer("tok.model"); })
              .find("xgrad was built without SentencePiece (libsentencepiece-dev)") != std::string::npos);
    return;
  }
  for (const std::string type : {"bpe", "unigram", "char"}) {
    INFO("model type " << type);
    const auto t = text::load_tokenizer(trained(type).model.string());
    CHECK(t->kind() == "sentencepiece");
    CHECK(t->vocab_size() == vocab_of(type));
    for (const std::string& s : hard_cases()) require_round_trip(*t, s);
    for (const std::string& s : random_strings(3000, 11)) require_round_trip(*t, s);
    // The training text itself, whole.
    const std::string corpus = xgt::read_file(trained(type).corpus / "a.txt");
    const std::vector<std::int64_t> ids = t->encode(corpus);
    CHECK(t->decode(ids) == corpus);
    if (type != "char") CHECK(ids.size() < corpus.size() * 7 / 10);  // it learned pieces longer than bytes
  }
}

TEST_CASE("sentencepiece tokenizer writes invalid UTF-8 and U+2581 as byte pieces between runs", "[tokenizer]") {
  if (!text::sentencepiece_available()) return;  // checked by the round-trip test
  const auto t = text::load_tokenizer(trained().model.string());
  const auto byte_id = [&](unsigned char b) {
    const std::vector<std::int64_t> ids = t->encode(std::string(1, static_cast<char>(b)));
    REQUIRE(ids.size() == 1);
    return ids[0];
  };
  // Byte pieces are shown as SentencePiece names them.
  CHECK(t->piece(byte_id(0xFF)) == "<0xFF>");
  CHECK(t->piece(byte_id(0x80)) == "<0x80>");
  // Text around a raw byte is encoded as if it stood alone (no dummy prefix in xgrad's models).
  const auto cat = [](std::vector<std::int64_t> a, const std::vector<std::int64_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const std::string left = "The quick brown fox", right = " jumps over the lazy dog.";
  CHECK(t->encode(left + "\xFF" + right) == cat(cat(t->encode(left), {byte_id(0xFF)}), t->encode(right)));
  CHECK(t->encode(left + "\xE2\x96\x81" + right) ==
        cat(cat(t->encode(left), {byte_id(0xE2), byte_id(0x96), byte_id(0x81)}), t->encode(right)));
  CHECK(t->encode(left + "\xC3" + right) == cat(cat(t->encode(left), {byte_id(0xC3)}), t->encode(right)));
  // A space inside a run is SentencePiece's U+2581 piece; it decodes as a space.
  const std::vector<std::int64_t> sp = t->encode("a b");
  std::string pieces;
  for (std::int64_t id : sp) pieces += t->piece(id);
  CHECK(pieces == "a\xE2\x96\x81" "b");
  CHECK(t->decode(sp) == "a b");
  CHECK(error_of<ValueError>([&] { t->decode({static_cast<std::int64_t>(t->vocab_size())}); })
            .find("outside the vocabulary of 420") != std::string::npos);
}

TEST_CASE("sentencepiece tokenizer is identified by the SHA-256 of its model", "[tokenizer]") {
  if (!text::sentencepiece_available()) return;  // checked by the round-trip test
  const Trained& a = trained("bpe");
  const std::string bytes = xgt::read_file(a.model);
  const auto t = text::load_tokenizer(a.model.string());
  CHECK(t->serialized() == bytes);
  CHECK(t->digest() == detail::sha256_hex("sentencepiece" + bytes));
  CHECK(t->description() == "sentencepiece, vocabulary 420, sha256 " + t->digest().substr(0, 16));
  // The same bytes embedded (as a checkpoint would) give the same tokenizer.
  const auto u = text::tokenizer_from_serialized("sentencepiece", bytes, "checkpoint");
  CHECK(u->digest() == t->digest());
  for (const std::string& s : hard_cases()) CHECK(u->encode(s) == t->encode(s));
  // Training is deterministic: the same corpus and options give the same bytes.
  const auto dir = xgt::temp_dir("tokenizer_digest");
  text::TokenizerTrainOptions o;
  o.vocab_size = 420;
  text::train_sentencepiece({a.corpus.string()}, o, (dir / "same.model").string());
  CHECK(xgt::read_file(dir / "same.model") == bytes);
  // With 2 threads: another model (SentencePiece's trainer depends on the count), the same
  // one every time.
  o.threads = 2;
  text::train_sentencepiece({a.corpus.string()}, o, (dir / "t2a.model").string());
  text::train_sentencepiece({a.corpus.string()}, o, (dir / "t2b.model").string());
  CHECK(xgt::read_file(dir / "t2a.model") == xgt::read_file(dir / "t2b.model"));
  o.threads = 1;
  // Another model (another vocabulary size, another type) has another digest.
  o.vocab_size = 421;
  text::train_sentencepiece({a.corpus.string()}, o, (dir / "other.model").string());
  CHECK(text::load_tokenizer((dir / "other.model").string())->digest() != t->digest());
  CHECK(text::load_tokenizer(trained("unigram").model.string())->digest() != t->digest());
}

TEST_CASE("sentencepiece training reads every file of a folder and writes only the model", "[tokenizer]") {
  if (!text::sentencepiece_available()) {
    CHECK(error_of<UsageError>([] { text::train_sentencepiece({"x"}, {}, "o.model"); })
              .find("xgrad was built without SentencePiece (libsentencepiece-dev)") != std::string::npos);
    return;
  }
  const Trained& a = trained("bpe");
  const auto dir = xgt::temp_dir("tokenizer_files");
  text::TokenizerTrainOptions o;
  o.vocab_size = 420;
  const std::string report = text::train_sentencepiece(
      {(a.corpus / "a.txt").string(), (a.corpus / "b.txt").string()}, o, (dir / "t.model").string());
  // The two files named one by one make the same model as their folder.
  CHECK(xgt::read_file(dir / "t.model") == xgt::read_file(a.model));
  CHECK(report.find("vocabulary 420 (256 byte pieces, 3 control, 161 of text)") != std::string::npos);
  CHECK(report.find("corpus: 2 files, ") != std::string::npos);
  CHECK(report.find("wrote " + (dir / "t.model").string()) != std::string::npos);
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.insert(e.path().filename().string());
  CHECK(files == std::set<std::string>{"t.model"});  // no .vocab, no temporary file left
  // At most --max-sentences lines, drawn with the seed: another model, still lossless.
  o.max_sentences = 200;
  const std::string drawn = text::train_sentencepiece({a.corpus.string()}, o, (dir / "d.model").string());
  CHECK(drawn.find("(200 drawn with seed 0)") != std::string::npos);
  const auto d = text::load_tokenizer((dir / "d.model").string());
  for (const std::string& s : hard_cases()) require_round_trip(*d, s);
}

TEST_CASE("loading a tokenizer refuses files that are missing or empty or truncated or corrupt or foreign", "[tokenizer]") {
  if (!text::sentencepiece_available()) return;  // checked by the round-trip test
  const auto dir = xgt::temp_dir("tokenizer_bad_files");
  const std::string good = xgt::read_file(trained().model);
  const auto format_error = [&](const std::string& name, const std::string& bytes) {
    xgt::write_file(dir / name, bytes);
    const std::string path = (dir / name).string();
    const std::string m = error_of<FormatError>([&] { text::load_tokenizer(path); });
    CHECK(m.find(path) != std::string::npos);
    return m;
  };
  CHECK(format_error("empty.model", "").find("is empty") != std::string::npos);
  CHECK(format_error("cut.model", good.substr(0, good.size() / 2)).find("not a SentencePiece model") != std::string::npos);
  CHECK(format_error("ten.model", good.substr(0, 10)).find("not a SentencePiece model") != std::string::npos);
  CHECK(format_error("text.model", "hello world\n").find("not a SentencePiece model") != std::string::npos);
  CHECK(format_error("json.model", "{\"pieces\": []}").find("not a SentencePiece model") != std::string::npos);
  std::string safetensors("\x10\0\0\0\0\0\0\0{\"__metadata__\":{}}", 26);
  CHECK(format_error("st.model", safetensors).find("not a SentencePiece model") != std::string::npos);
  // Flipped bytes: whatever SentencePiece says, it is a FormatError naming the file, or
  // (rarely) a model that still loads and then round-trips.
  Generator g(3);
  for (int i = 0; i < 200; ++i) {
    std::string bad = good;
    for (int k = 0; k < 3; ++k) bad[g.below(bad.size())] = static_cast<char>(g.below(256));
    xgt::write_file(dir / "flip.model", bad);
    try {
      const auto t = text::load_tokenizer((dir / "flip.model").string());
      for (const std::string& s : hard_cases()) require_round_trip(*t, s);
    } catch (const FormatError& e) {
      CHECK(std::string(e.what()).find("flip.model") != std::string::npos);
    }
  }
  const std::string missing = (dir / "missing.model").string();
  CHECK(error_of<UsageError>([&] { text::load_tokenizer(missing); }).find("'" + missing + "' does not exist") !=
        std::string::npos);
  CHECK(error_of<UsageError>([&] { text::load_tokenizer(dir.string()); }).find("is a folder") != std::string::npos);
  CHECK(error_of<FormatError>([&] { text::tokenizer_from_serialized("sentencepiece", "junk", "ckpt.safetensors"); })
            .find("ckpt.safetensors is not a SentencePiece model") != std::string::npos);
}

TEST_CASE("sentencepiece training refuses bad options and corpora before writing anything", "[tokenizer]") {
  const auto dir = xgt::temp_dir("tokenizer_bad_training");
  const std::string out = (dir / "out.model").string();
  const auto usage = [&](const std::vector<std::string>& paths, const text::TokenizerTrainOptions& o) {
    return error_of<UsageError>([&] { text::train_sentencepiece(paths, o, out); });
  };
  text::TokenizerTrainOptions o;
  o.vocab_size = 259;
  CHECK(usage({"x"}, o).find("--vocab-size 259: must be at least 260") != std::string::npos);
  o.vocab_size = 2000000;
  CHECK(usage({"x"}, o).find("--vocab-size 2000000: must be at most 1048576") != std::string::npos);
  o = {};
  o.model_type = "word";
  CHECK(usage({"x"}, o).find("--model-type 'word': must be bpe, unigram or char") != std::string::npos);
  o = {};
  o.byte_fallback = false;
  CHECK(usage({"x"}, o).find("byte_fallback must be on") != std::string::npos);
  o = {};
  o.threads = 0;
  CHECK(usage({"x"}, o).find("--threads 0: must be in [1, 128]") != std::string::npos);
  o.threads = 129;
  CHECK(usage({"x"}, o).find("--threads 129: must be in [1, 128]") != std::string::npos);
  o = {};
  o.character_coverage = 1.5;
  CHECK(usage({"x"}, o).find("--character-coverage") != std::string::npos);
  if (!text::sentencepiece_available()) return;  // the rest needs SentencePiece (checked above)

  o = {};
  o.vocab_size = 260;
  const Trained& a = trained();
  CHECK(usage({(dir / "none").string()}, o).find("no such file or folder") != std::string::npos);
  std::filesystem::create_directories(dir / "empty_folder");
  CHECK(usage({(dir / "empty_folder").string()}, o).find("holds no files") != std::string::npos);
  // More pieces than the corpus has: a UsageError naming the largest that works.
  xgt::write_file(dir / "small.txt", "abc abc abd\n");
  o.vocab_size = 400;
  const std::string high = usage({(dir / "small.txt").string()}, o);
  CHECK(high.find("--vocab-size 400") != std::string::npos);
  CHECK(high.find("the largest vocabulary it supports is") != std::string::npos);
  // "char": as many pieces as characters, at most (a b c d, the space as U+2581, the newline).
  o.model_type = "char";
  CHECK(usage({(dir / "small.txt").string()}, o).find("the largest vocabulary it supports is 265") != std::string::npos);
  o.model_type = "bpe";
  // --character-coverage 1 keeps every character: more than 300 - 259 pieces for the mixed
  // corpus; the vocabulary the message asks for then trains.
  o.vocab_size = 300;
  o.character_coverage = 1;
  const std::string cov = usage({a.corpus.string()}, o);
  const std::size_t give = cov.find("give --vocab-size ");
  REQUIRE(give != std::string::npos);
  CHECK(cov.find("--character-coverage 1") != std::string::npos);
  o.vocab_size = std::stoul(cov.substr(give + 18));
  CHECK(o.vocab_size > 300);
  CHECK(text::train_sentencepiece({a.corpus.string()}, o, out).find("(100% of the text)") != std::string::npos);
  CHECK(text::load_tokenizer(out)->vocab_size() == o.vocab_size);
  std::filesystem::remove(out);
  o = {};
  // The output may not be the corpus or sit in a corpus folder.
  CHECK(error_of<UsageError>([&] {
          text::train_sentencepiece({(dir / "small.txt").string()}, o, (dir / "small.txt").string());
        }).find("the output would replace the input") != std::string::npos);
  CHECK(error_of<UsageError>([&] {
          text::train_sentencepiece({a.corpus.string()}, o, (a.corpus / "t.model").string());
        }).find("is in the corpus folder") != std::string::npos);

  const auto value = [&](const std::vector<std::string>& paths) {
    return error_of<ValueError>([&] { text::train_sentencepiece(paths, {}, out); });
  };
  xgt::write_file(dir / "empty.txt", "");
  CHECK(value({(dir / "empty.txt").string()}).find("no text") != std::string::npos);
  xgt::write_file(dir / "marks.txt", "\xE2\x96\x81\xE2\x96\x81");  // only what the pre-split takes out
  CHECK(value({(dir / "marks.txt").string()}).find("no text") != std::string::npos);
  xgt::write_file(dir / "nul.bin", std::string("text\0more text", 14));
  CHECK(value({(dir / "nul.bin").string()}).find("nul.bin' looks binary, not text: a NUL byte at offset 4") !=
        std::string::npos);
  std::string latin1;
  for (int i = 0; i < 1000; ++i) latin1 += i % 3 ? "a" : "\xE9";  // a third of the bytes not UTF-8
  xgt::write_file(dir / "latin1.txt", latin1);
  CHECK(value({(dir / "latin1.txt").string()}).find("334 of its first 1000 bytes are not UTF-8") != std::string::npos);
  // A binary file inside a corpus folder is named with its folder.
  std::filesystem::create_directories(dir / "with_binary");
  xgt::write_file(dir / "with_binary" / "a.txt", "text\n");
  xgt::write_file(dir / "with_binary" / "b.bin", std::string("\x7f" "ELF\0\0", 6));
  CHECK(value({(dir / "with_binary").string()}).find((dir / "with_binary" / "b.bin").string()) != std::string::npos);
  CHECK(!std::filesystem::exists(out));
}
