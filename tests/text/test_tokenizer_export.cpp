// llama2c_tokenizer_bytes (text/tokenizer_llama2c.cpp): a SentencePiece vocabulary made by hand
// written as llama2.c's converter writes it (BOS and EOS renamed, U+2581 as a space, score and
// length before each piece, the longest piece's length first), the bytes spelled out here field
// by field; the result read back by xgrad's llama2c reader; and the vocabularies run.c cannot
// use refused. tests/interop/tokenizer_export_check.py compares real models with Python's
// sentencepiece and the converter's rule.
#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <xgrad/core/error.hpp>
#include <xgrad/text/tokenizer.hpp>

#include "tests/support/helpers.hpp"

namespace {

using namespace xg;
using xgt::error_of;

const std::string kMark = "\xE2\x96\x81";  // U+2581

// SentencePiece's layout with byte fallback: <unk>, <s>, </s>, <0x00>..<0xFF>, then `extra`.
text::SentencePieceVocabulary vocabulary(const std::vector<std::pair<std::string, float>>& extra) {
  text::SentencePieceVocabulary v;
  v.pieces = {"<unk>", "<s>", "</s>"};
  v.scores = {0, 0, 0};
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    v.pieces.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    v.scores.push_back(0);
  }
  for (const auto& [p, s] : extra) {
    v.pieces.push_back(p);
    v.scores.push_back(s);
  }
  v.bos_id = 1;
  v.eos_id = 2;
  return v;
}

std::string le32(std::uint32_t v) {
  std::string s;
  for (int k = 0; k < 4; ++k) s += static_cast<char>((v >> (8 * k)) & 0xFF);
  return s;
}

std::string entry(float score, const std::string& bytes) {
  std::uint32_t bits;
  std::memcpy(&bits, &score, 4);
  return le32(bits) + le32(static_cast<std::uint32_t>(bytes.size())) + bytes;
}

}  // namespace

TEST_CASE("tokenizer export: the bytes llama2.c's converter writes for a hand vocabulary", "[tokenizer-export]") {
  const text::SentencePieceVocabulary v = vocabulary({{kMark, -1},
                                                      {kMark + "the", -2.5f},
                                                      {"e" + kMark + kMark + "x", -3},  // two markers inside
                                                      {"\xC3\xA9", -0.25f},           // e acute: kept as UTF-8
                                                      {"th", -1.5f},
                                                      {"t", 0},
                                                      {"h", 0},
                                                      {"e", 0},
                                                      {"the", -2}});
  const std::string got = text::llama2c_tokenizer_bytes(v, "hand.model");
  // Spelled out field by field; the longest pieces ("\n</s>\n", the byte pieces) have 6 bytes.
  std::string want = le32(6) + entry(0, "<unk>") + entry(0, "\n<s>\n") + entry(0, "\n</s>\n");
  for (std::size_t b = 0; b < 256; ++b) want += entry(0, v.pieces[3 + b]);
  want += entry(-1, " ") + entry(-2.5f, " the") + entry(-3, "e  x") + entry(-0.25f, "\xC3\xA9") + entry(-1.5f, "th") +
          entry(0, "t") + entry(0, "h") + entry(0, "e") + entry(-2, "the");
  CHECK(got.size() == want.size());
  CHECK(got == want);

  // Read back by xgrad's reader and encoded by run.c's algorithm. "the": symbols BOS, the dummy
  // prefix " " (259), "t" (264), "h" (265), "e" (266); the best pair "t"+"h" -> "th" (263, -1.5),
  // then "th"+"e" -> "the" (267, -2), then " "+"the" -> " the" (260, -2.5): the piece whose
  // U+2581 became a space.
  const std::unique_ptr<text::Tokenizer> t = text::make_llama2c_tokenizer(got, "hand.bin");
  REQUIRE(t->vocab_size() == 268);
  CHECK(t->encode("the") == std::vector<std::int64_t>{1, 260});
  CHECK(t->decode(t->encode("the")) == "the");
  CHECK(t->piece(1) == "\n<s>\n");
  CHECK(t->piece(261) == "e  x");
  CHECK(t->encode("\xC3\xA9") == std::vector<std::int64_t>{1, 259, 262});
}

TEST_CASE("tokenizer export: vocabularies run.c cannot use are refused naming the reason", "[tokenizer-export]") {
  const auto err = [](const text::SentencePieceVocabulary& v) {
    return error_of<FormatError>([&] { text::llama2c_tokenizer_bytes(v, "m.model"); });
  };
  text::SentencePieceVocabulary v = vocabulary({{"a", -1}});
  v.bos_id = 0;
  CHECK(err(v).find("m.model: run.c cannot use this SentencePiece model: its <s> (BOS) is id 0") != std::string::npos);
  v.bos_id = -1;
  CHECK(err(v).find("it has no <s> (BOS)") != std::string::npos);
  v = vocabulary({{"a", -1}});
  v.eos_id = 5;
  CHECK(err(v).find("its </s> (EOS) is id 5") != std::string::npos);
  v = vocabulary({{"a", -1}});
  std::swap(v.pieces[3], v.pieces[4]);
  CHECK(err(v).find("id 3 is '<0x01>', not <0x00>") != std::string::npos);
  v = vocabulary({});
  v.pieces.resize(100);
  v.scores.resize(100);
  CHECK(err(v).find("it has 100 pieces, fewer than the 259 it needs") != std::string::npos);
  v = vocabulary({{"a", std::numeric_limits<float>::infinity()}});
  CHECK(err(v).find("piece 259 has the score inf") != std::string::npos);
}

TEST_CASE("tokenizer export: bytes that are not a SentencePiece model are a FormatError", "[tokenizer-export]") {
  if (!text::sentencepiece_available()) {
    CHECK(error_of<UsageError>([] { text::read_sentencepiece_vocabulary("x", "m.model"); })
              .find("without SentencePiece") != std::string::npos);
    return;
  }
  CHECK(error_of<FormatError>([] { text::read_sentencepiece_vocabulary("", "m.model"); })
            .find("m.model is not a SentencePiece model (it is empty)") != std::string::npos);
  CHECK(error_of<FormatError>([] { text::read_sentencepiece_vocabulary("hello world\n", "m.model"); })
            .find("m.model is not a SentencePiece model") != std::string::npos);
}
