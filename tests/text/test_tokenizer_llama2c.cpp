// llama2.c's tokenizer.bin (text/tokenizer_llama2c.cpp): run.c's encode on small vocabularies
// whose ids are worked out by hand in the comments (the leading-space rule, byte fallback,
// UTF-8 grouping, best-score merges with the leftmost on a tie, BOS first and no EOS), decode,
// loading by path, and one error per kind of bad file.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <xgrad/core/error.hpp>
#include <xgrad/text/tokenizer.hpp>

#include "tests/support/helpers.hpp"

namespace {

using namespace xg;
using xgt::error_of;
using Ids = std::vector<std::int64_t>;


void put_u32(std::string& s, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) s += static_cast<char>((v >> (8 * k)) & 0xFF);
}

void put_f32(std::string& s, float f) {
  std::uint32_t v;
  std::memcpy(&v, &f, 4);
  put_u32(s, v);
}

struct Piece {
  std::string text;
  float score;
};

// A tokenizer.bin: max_token_length, then score, length and bytes of each piece.
std::string file_of(const std::vector<Piece>& pieces, std::int64_t max_len = -1) {
  std::size_t longest = 0;
  for (const Piece& p : pieces) longest = std::max(longest, p.text.size());
  std::string s;
  put_u32(s, static_cast<std::uint32_t>(max_len >= 0 ? max_len : static_cast<std::int64_t>(longest)));
  for (const Piece& p : pieces) {
    put_f32(s, p.score);
    put_u32(s, static_cast<std::uint32_t>(p.text.size()));
    s += p.text;
  }
  return s;
}

// ids 0..258 as every llama2.c tokenizer has them: <unk>, BOS, EOS, <0x00>..<0xFF>.
std::vector<Piece> base_pieces() {
  std::vector<Piece> p = {{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) p.push_back({std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 0});
  return p;
}

// The hand vocabulary: ids 259.. below.
std::vector<Piece> hand_pieces() {
  std::vector<Piece> p = base_pieces();
  const std::vector<Piece> extra = {
      {" ", 0},              // 259
      {"a", 0},              // 260
      {"b", 0},              // 261
      {"c", 0},              // 262
      {"ab", -1},            // 263
      {" a", -2},            // 264
      {" ab", -0.5f},        // 265
      {"bc", -1},            // 266: ties with "ab"
      {"abc", -3},           // 267
      {"\xC3\xA9", 0},       // 268: e acute, one character of two bytes
      {"cc", -2e10f},        // 269: scored below run.c's -1e10: never made by a merge
  };
  p.insert(p.end(), extra.begin(), extra.end());
  return p;
}

std::unique_ptr<text::Tokenizer> hand() { return text::make_llama2c_tokenizer(file_of(hand_pieces()), "hand.bin"); }

}  // namespace

TEST_CASE("llama2c tokenizer: BOS first and the dummy space only before non-empty text", "[llama2c-tokenizer]") {
  const auto t = hand();
  CHECK(t->kind() == "llama2c");
  CHECK(t->vocab_size() == 270);
  CHECK(t->encode("") == Ids{1});  // BOS alone, no " "
  // "a": BOS, " " (259), "a" (260); " a" (264) is a piece: [1, 264].
  CHECK(t->encode("a") == Ids{1, 264});
  // " a": BOS, " ", " ", "a"; "  " is no piece, " a" is: [1, 259, 264].
  CHECK(t->encode(" a") == Ids{1, 259, 264});
  CHECK(t->decode({1, 259, 264}) == " a");  // only the first space (the dummy one) is dropped
  CHECK(t->decode({1, 264}) == "a");
  CHECK(t->decode({264}) == " a");  // no BOS before it: nothing dropped
}

TEST_CASE("llama2c tokenizer: merges take the best score and the leftmost pair on a tie", "[llama2c-tokenizer]") {
  const auto t = hand();
  // "ab": [1, " ", a, b]; candidates " a" -2, "ab" -1 -> "ab": [1, " ", ab]; then " ab" -0.5.
  CHECK(t->encode("ab") == Ids{1, 265});
  // "abc": candidates " a" -2, "ab" -1, "bc" -1: the tie goes to the left pair "ab" ->
  // [1, " ", ab, c]; then " ab" -0.5 beats "abc" -3 -> [1, " ab", c]; " abc" is no piece.
  // (Taking "bc" first would give [1, " a", bc] = [1, 264, 266].)
  CHECK(t->encode("abc") == Ids{1, 265, 262});
  // "bc" alone: [1, " ", b, c] -> "bc" (" b" is no piece): [1, 259, 266].
  CHECK(t->encode("bc") == Ids{1, 259, 266});
  // "cc" has a piece but its score is below -1e10: run.c never merges to it.
  CHECK(t->encode("cc") == Ids{1, 259, 262, 262});
  CHECK(t->decode(t->encode("abc")) == "abc");
}

TEST_CASE("llama2c tokenizer: characters without a piece fall back to their bytes as id byte + 3",
          "[llama2c-tokenizer]") {
  const auto t = hand();
  // Z (0x5A) has no piece: id 0x5A + 3 = 93; " a" still merges: [1, 264, 93].
  CHECK(t->encode("aZ") == Ids{1, 264, 93});
  // e acute (C3 A9) is one character with a piece: 268; " " + it is no piece.
  CHECK(t->encode("\xC3\xA9") == Ids{1, 259, 268});
  // The euro sign (E2 82 AC) has none: its three bytes, 0xE2 + 3 = 229, 0x82 + 3 = 133, 0xAC + 3 = 175.
  CHECK(t->encode("\xE2\x82\xAC") == Ids{1, 259, 229, 133, 175});
  // Not UTF-8: C3 followed by 'a' is a character of one byte (198), then a (260).
  CHECK(t->encode("\xC3" "a") == Ids{1, 259, 198, 260});
  // A stray continuation byte starts a character of its own: A9 + 3 = 172.
  CHECK(t->encode("\xA9") == Ids{1, 259, 172});
  // A lead byte takes at most 3 continuation bytes: F0 9F 98 80 80 is a 4-byte character
  // (no piece: 243, 162, 155, 131) and a stray 80 (131).
  CHECK(t->encode("\xF0\x9F\x98\x80\x80") == Ids{1, 259, 243, 162, 155, 131, 131});
  // A NUL is one more byte (run.c's C string would end there): <0x00> is id 3.
  CHECK(t->encode(std::string("a\0b", 3)) == Ids{1, 264, 3, 261});
  // Byte pieces decode to their bytes, and every text comes back.
  CHECK(t->decode({1, 259, 229, 133, 175}) == "\xE2\x82\xAC");
  for (const std::string& s : {std::string("a\0b", 3), std::string("\xF0\x9F\x98\x80\x80"), std::string(" \xC3 abc\n"),
                              std::string("  ")})
    CHECK(t->decode(t->encode(s)) == s);
}

TEST_CASE("llama2c tokenizer: without a \" \" piece the dummy prefix is the byte piece <0x20>", "[llama2c-tokenizer]") {
  std::vector<Piece> p = base_pieces();
  p.push_back({"x", 0});       // 259
  p.push_back({"xx", -1});     // 260
  p.push_back({"xx", 5});      // 261: the same bytes; the lower id (260) is the piece
  const auto t = text::make_llama2c_tokenizer(file_of(p), "nospace.bin");
  // BOS, <0x20> (0x20 + 3 = 35), x, x -> xx (260, not 261).
  CHECK(t->encode("xx") == Ids{1, 35, 260});
  CHECK(t->decode({1, 35, 260}) == "xx");
  CHECK(t->decode({35, 260}) == " xx");
}

TEST_CASE("llama2c tokenizer: decode drops BOS and EOS and checks ids and pieces are the file's", "[llama2c-tokenizer]") {
  const auto t = hand();
  CHECK(t->decode({1, 265, 262, 2}) == "abc");
  CHECK(t->decode({2, 264}) == " a");  // after EOS the space stays
  CHECK(t->decode({0}) == "<unk>");
  CHECK(t->piece(1) == "\n<s>\n");
  CHECK(t->piece(3 + 0x41) == "<0x41>");
  CHECK(t->piece(265) == " ab");
  CHECK(error_of<ValueError>([&] { t->decode({270}); }).find("id 270 is outside the vocabulary of 270") !=
        std::string::npos);
  CHECK_THROWS_AS(t->piece(-1), ValueError);
}

TEST_CASE("llama2c tokenizer: loaded by path and from a checkpoint's bytes", "[llama2c-tokenizer]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "xgrad_test_llama2c_tokenizer";
  fs::create_directories(dir);
  const std::string bytes = file_of(hand_pieces());
  for (const char* name : {"tokenizer.bin", "renamed.model"}) {  // by its name, and by its contents
    std::ofstream(dir / name, std::ios::binary) << bytes;
    const auto t = text::load_tokenizer((dir / name).string());
    CHECK(t->kind() == "llama2c");
    CHECK(t->serialized() == bytes);
    CHECK(t->encode("ab") == Ids{1, 265});
  }
  const auto t = text::tokenizer_from_serialized("llama2c", bytes, "checkpoint");
  CHECK(t->digest() == hand()->digest());
  CHECK(t->description().rfind("llama2c, vocabulary 270, sha256 ", 0) == 0);
  // A .bin that is not one says so as a tokenizer.bin.
  std::ofstream(dir / "bad.bin", std::ios::binary) << "hello";
  CHECK(error_of<FormatError>([&] { text::load_tokenizer((dir / "bad.bin").string()); })
            .find("not a llama2.c tokenizer.bin") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("llama2c tokenizer: a bad tokenizer.bin is a FormatError naming what is wrong", "[llama2c-tokenizer]") {
  const auto err = [](const std::string& bytes) {
    return error_of<FormatError>([&] { text::make_llama2c_tokenizer(bytes, "t.bin"); });
  };
  const std::string good = file_of(hand_pieces());
  CHECK(err("").find("t.bin: not a llama2.c tokenizer.bin: it has 0 bytes, fewer than its 4-byte header") !=
        std::string::npos);
  CHECK(err(good.substr(0, 3)).find("fewer than its 4-byte header") != std::string::npos);
  // max_token_length 0, negative, and larger than the file.
  for (std::uint32_t m : {0u, 0x80000000u, 0x7FFFFFFFu}) {
    std::string b = good;
    std::string h;
    put_u32(h, m);
    b.replace(0, 4, h);
    CHECK(err(b).find("max_token_length " + std::to_string(static_cast<std::int32_t>(m)) + " must be in [1, " +
                      std::to_string(good.size()) + "]") != std::string::npos);
  }
  // Cut inside the second piece's score, and inside its bytes.
  CHECK(err(good.substr(0, 4 + 8 + 5 + 3)).find("piece 1 at byte 17 is truncated: its score and length need 8 bytes") !=
        std::string::npos);
  CHECK(err(good.substr(0, 4 + 8 + 5 + 8 + 2)).find("piece 1 at byte 17 is truncated: its length 5 needs more") !=
        std::string::npos);
  // Truncated at a piece boundary: too few pieces.
  CHECK(err(good.substr(0, 4 + 8 + 5)).find("it has 1 pieces; a llama2.c tokenizer has at least 259") !=
        std::string::npos);
  // A negative length, a length above max_token_length, a length past the end of the file.
  std::string neg = good;
  std::string v;
  put_u32(v, static_cast<std::uint32_t>(-5));
  neg.replace(4 + 4, 4, v);
  CHECK(err(neg).find("piece 0 at byte 4 has the length -5, negative") != std::string::npos);
  std::vector<Piece> p = hand_pieces();
  CHECK(err(file_of(p, 3)).find("piece 0 at byte 4 has the length 5, more than max_token_length 3") !=
        std::string::npos);
  // A length within max_token_length (here the file's size) but past the end of the file.
  std::string huge = good;
  std::string h;
  put_u32(h, static_cast<std::uint32_t>(good.size()));
  huge.replace(0, 4, h);
  huge.replace(4 + 4, 4, h);
  CHECK(err(huge).find("piece 0 at byte 4 is truncated: its length " + std::to_string(good.size()) +
                       " needs more bytes than the " + std::to_string(good.size() - 12) + " left") != std::string::npos);
  // A score that is not a number.
  std::string nan = good;
  v.clear();
  put_u32(v, 0x7FC00000u);
  nan.replace(4, 4, v);
  CHECK(err(nan).find("piece 0 at byte 4 has the score nan, not a finite number") != std::string::npos);
  // Byte pieces out of place.
  p[3 + 0x41].text = "A";
  CHECK(err(file_of(p)).find("piece 68 is 'A', not the byte piece <0x41>") != std::string::npos);
}
