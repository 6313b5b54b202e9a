// Tokenizers (text/tokenizer.hpp): the byte tokenizer, and SentencePiece models wrapped so
// that encoding is lossless for every byte string. The only file that includes SentencePiece
// (when built with XGRAD_WITH_SENTENCEPIECE).
#include <xgrad/text/tokenizer.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/core/detail/sha256.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/text/corpus.hpp>

#ifdef XGRAD_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace xg::text {

namespace fs = std::filesystem;

namespace {

constexpr const char* kOp = "tokenizer";
constexpr const char* kTrainOp = "tokenizer train";
const std::string kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's whitespace marker
constexpr std::size_t kControlPieces = 3;         // <unk>, <s>, </s> in a model xgrad trains
constexpr std::size_t kMinVocab = 256 + kControlPieces + 1;
constexpr std::size_t kMaxVocab = std::size_t{1} << 20;

// `what` needs SentencePiece; `instead` says what works without it ("" for nothing).
[[noreturn]] void without_sentencepiece(const std::string& op, const std::string& what, const std::string& instead) {
  throw UsageError(op_message(op, "xgrad was built without SentencePiece (libsentencepiece-dev): " + what +
                                      " needs it; rebuild xgrad with it installed (docs/install.md)" + instead));
}

// The length of the valid UTF-8 sequence (RFC 3629) at the start of `s`, or 0 if it is not
// one: no overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF. These are
// the sequences SentencePiece 0.1.97 keeps; it turns every other byte into U+FFFD.
std::size_t utf8_length(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const auto cont = [&](std::size_t i) { return i < s.size() && (b(i) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0;  // a continuation byte, or C0/C1 (always overlong)
  if (c < 0xE0) return cont(1) ? 2 : 0;
  if (c < 0xF0) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // a surrogate
    return 3;
  }
  if (c < 0xF5) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

// The pre-split of the lossless rule: calls f(begin, end, raw) for consecutive segments of
// `s`: runs of valid UTF-8 without U+2581 (raw false), and the bytes that are not in a run
// (raw true: invalid UTF-8, and U+2581's three bytes). With `lines`, a run also ends after
// every stretch of newlines ('\n') that something else follows.
template <class F>
void pre_split(std::string_view s, bool lines, F&& f) {
  std::size_t run = 0, i = 0;
  while (i < s.size()) {
    std::size_t len = utf8_length(s.substr(i));
    const bool raw = len == 0 || s.compare(i, len, kSpaceMarker) == 0;
    if (!raw) {
      i += len;
      if (lines && s[i - 1] == '\n' && i < s.size() && s[i] != '\n') {
        f(run, i, false);
        run = i;
      }
      continue;
    }
    if (len == 0) len = 1;
    if (run < i) f(run, i, false);
    f(i, i + len, true);
    i += len;
    run = i;
  }
  if (run < s.size()) f(run, s.size(), false);
}

// A byte as SentencePiece names its byte piece: <0x0A>.
std::string byte_piece(unsigned char b) {
  static const char* const kHex = "0123456789ABCDEF";
  return std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
}

// Text for a message: at most 40 bytes, control characters and invalid UTF-8 as \xNN.
std::string printable(std::string_view s) {
  std::string out;
  const std::size_t n = std::min<std::size_t>(s.size(), 40);
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const std::size_t len = utf8_length(s.substr(i, n - i));
    if (len > 1 || (c >= 0x20 && c < 0x7F)) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      static const char* const kHex = "0123456789abcdef";
      out += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
      ++i;
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

void check_id(std::int64_t id, std::size_t vocab) {
  if (id < 0 || static_cast<std::uint64_t>(id) >= vocab)
    throw ValueError(op_message(kOp, "id " + std::to_string(id) + " is outside the vocabulary of " +
                                         std::to_string(vocab) + " (ids 0.." + std::to_string(vocab - 1) + ")"));
}

class ByteTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  std::size_t vocab_size() const override { return 256; }
  std::vector<std::int64_t> encode(std::string_view text) const override {
    std::vector<std::int64_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<std::int64_t>& ids) const override {
    std::string out(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      check_id(ids[i], 256);
      out[i] = static_cast<char>(ids[i]);
    }
    return out;
  }
  std::string piece(std::int64_t id) const override {
    check_id(id, 256);
    if (id >= 0x20 && id < 0x7F) return std::string(1, static_cast<char>(id));
    return byte_piece(static_cast<unsigned char>(id));
  }
  std::string serialized() const override { return ""; }
};

#ifdef XGRAD_WITH_SENTENCEPIECE

namespace sp = sentencepiece;

// A SentencePiece model behind the lossless rule (text/tokenizer.hpp). Every id's decoded
// text is computed once at load.
class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& bytes, const std::string& where) : bytes_(bytes) {
    if (bytes.empty()) throw FormatError(op_message(kOp, where + " is empty, not a SentencePiece model"));
    const sp::util::Status st = sp_.LoadFromSerializedProto(bytes);
    if (!st.ok()) {
      const std::string m = st.message();
      throw FormatError(op_message(
          kOp, where + " is not a SentencePiece model (" +
                   (m.find("ParseFromArray") != std::string::npos
                        ? "it does not parse as one: truncated, corrupt, or another kind of file"
                        : "SentencePiece refuses it: " + m) +
                   ")"));
    }
    const int n = sp_.GetPieceSize();
    if (n <= 0) throw FormatError(op_message(kOp, where + " is a SentencePiece model without pieces"));
    text_.resize(static_cast<std::size_t>(n));
    kind_.resize(static_cast<std::size_t>(n), Piece::normal);
    byte_id_.fill(-1);
    for (int id = 0; id < n; ++id) {
      const std::string& p = sp_.IdToPiece(id);
      const std::size_t i = static_cast<std::size_t>(id);
      if (sp_.IsByte(id)) {
        // "<0xNN>": SentencePiece checked the form when it loaded the model.
        const int b = static_cast<int>(std::strtol(p.substr(3, 2).c_str(), nullptr, 16));
        kind_[i] = Piece::byte;
        text_[i] = std::string(1, static_cast<char>(b));
        byte_id_[static_cast<std::size_t>(b)] = id;
      } else if (sp_.IsControl(id)) {
        kind_[i] = Piece::control;
      } else if (sp_.IsUnknown(id)) {
        kind_[i] = Piece::unknown;
        text_[i] = " \xE2\x81\x87 ";  // SentencePiece's default unk_surface, U+2047
      } else {
        // A normal or user-defined piece, or an unused one (which encoding never gives).
        const bool lead = p.compare(0, kSpaceMarker.size(), kSpaceMarker) == 0;
        kind_[i] = sp_.IsUnused(id) ? (lead ? Piece::unused_after_space : Piece::unused)
                                    : (lead ? Piece::normal_after_space : Piece::normal);
        text_[i] = spaces(p);
        // A newline followed by something else inside a piece: text cannot be cut into lines.
        for (std::size_t k = p.find('\n'); k != std::string::npos && lines_; k = p.find('\n', k + 1))
          if (k + 1 < p.size() && p[k + 1] != '\n') lines_ = false;
      }
    }
    for (int b = 0; b < 256; ++b)
      if (byte_id_[static_cast<std::size_t>(b)] < 0)
        throw FormatError(op_message(kOp, where + " has no byte piece " + byte_piece(static_cast<unsigned char>(b)) +
                                              ": xgrad needs all 256 byte-fallback pieces to encode any text "
                                              "losslessly (train the model with byte_fallback)"));
    // How the model treats whitespace: xgrad takes a model that keeps every space where it
    // is, with or without a dummy prefix (a U+2581 added before the text).
    const std::string probe = " a  b ", plain = spell(sp_encode(probe));
    const std::string kept = "\xE2\x96\x81" "a\xE2\x96\x81\xE2\x96\x81" "b\xE2\x96\x81";
    if (plain == kept) {
      dummy_ = false;
    } else if (plain == kSpaceMarker + kept) {
      dummy_ = true;
    } else {
      throw FormatError(op_message(kOp, where + ": this SentencePiece model changes whitespace (it writes '" + printable(probe) +
                                              "' as '" + printable(plain) +
                                              "'): xgrad takes only models that keep text as it is (train with "
                                              "remove_extra_whitespaces=false, escape_whitespaces and "
                                              "treat_whitespace_as_suffix at their defaults)"));
    }
    // With a dummy prefix, a run after the start of the text is encoded behind a character
    // the model writes as its byte piece (so it joins nothing), and that prefix is dropped.
    for (int c = 1; dummy_ && separator_.empty() && c < 0x80; ++c) {
      if (c == 0x20) c = 0x7F;  // the control characters U+0001..U+001F, U+007F
      const std::string sep(1, static_cast<char>(c));
      const std::vector<int> ids = sp_encode(sep);
      if (ids.size() >= 2 && ids.back() == byte_id_[static_cast<std::size_t>(c)] &&
          spell(std::vector<int>(ids.begin(), ids.end() - 1)) == kSpaceMarker) {
        separator_ = sep;
        separator_ids_ = ids;
      }
    }
    if (dummy_ && separator_.empty())
      throw FormatError(op_message(kOp, where + ": this SentencePiece model adds a dummy prefix and has a piece for "
                                              "every control character; xgrad cannot encode text after a raw byte "
                                              "or a line the way SentencePiece does"));
  }

  std::string kind() const override { return "sentencepiece"; }
  std::size_t vocab_size() const override { return text_.size(); }

  std::vector<std::int64_t> encode(std::string_view text) const override {
    std::vector<std::int64_t> out;
    out.reserve(text.size() / 3 + 1);
    pre_split(text, lines_, [&](std::size_t b, std::size_t e, bool raw) {
      if (raw) {
        for (std::size_t i = b; i < e; ++i) out.push_back(byte_id_[static_cast<unsigned char>(text[i])]);
      } else {
        encode_run(text.substr(b, e - b), b == 0, out);
      }
    });
    return out;
  }

  std::string decode(const std::vector<std::int64_t>& ids) const override {
    for (std::int64_t id : ids) check_id(id, text_.size());
    return decode_checked(ids.begin(), ids.end(), dummy_);
  }

  std::string piece(std::int64_t id) const override {
    check_id(id, text_.size());
    return sp_.IdToPiece(static_cast<int>(id));
  }

  std::string serialized() const override { return bytes_; }
  std::int64_t bos_id() const override { return sp_.bos_id(); }
  std::int64_t eos_id() const override { return sp_.eos_id(); }

 private:
  // What an id is; *_after_space: its piece starts with U+2581.
  enum class Piece : unsigned char { normal, normal_after_space, unused, unused_after_space, byte, control, unknown };

  static std::string spaces(const std::string& piece) {
    std::string out;
    for (std::size_t i = 0; i < piece.size();) {
      if (piece.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) {
        out += ' ';
        i += kSpaceMarker.size();
      } else {
        out += piece[i++];
      }
    }
    return out;
  }

  std::vector<int> sp_encode(std::string_view text) const {
    std::vector<int> ids;
    const sp::util::Status st = sp_.Encode(text, &ids);
    if (!st.ok()) throw InternalError(op_message(kOp, std::string("SentencePiece failed to encode: ") + st.message()));
    return ids;
  }

  // The pieces of `ids` concatenated as they are (byte pieces as their bytes, U+2581 kept).
  std::string spell(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) out += kind_[static_cast<std::size_t>(id)] == Piece::byte ? text_[static_cast<std::size_t>(id)]
                                                                                  : sp_.IdToPiece(id);
    return out;
  }

  // decode() of ids known to be in range. `strip`: the model's dummy prefix is at the start,
  // so the first id that is not a control piece loses its leading space if it is a normal (or
  // unused) piece starting with U+2581.
  template <class It>
  std::string decode_checked(It begin, It end, bool strip) const {
    std::string out;
    for (It it = begin; it != end; ++it) {
      const std::size_t id = static_cast<std::size_t>(*it);
      if (strip && kind_[id] != Piece::control) {
        strip = false;
        if (kind_[id] == Piece::normal_after_space || kind_[id] == Piece::unused_after_space) {
          out.append(text_[id], 1, std::string::npos);
          continue;
        }
      }
      out += text_[id];
    }
    return out;
  }

  // One run of the pre-split (valid UTF-8 without U+2581); `at_start`: it starts the text.
  void encode_run(std::string_view run, bool at_start, std::vector<std::int64_t>& out) const {
    std::vector<int> ids;
    if (dummy_ && !at_start) {
      // SentencePiece puts its dummy prefix before every text it encodes; this run follows
      // other text. Encoded behind the separator, the run's pieces are those SentencePiece
      // gives it after a character it has no piece for (as after a newline in Llama's
      // models); the separator's own pieces come first and are dropped.
      ids = sp_encode(separator_ + std::string(run));
      if (ids.size() < separator_ids_.size() || !std::equal(separator_ids_.begin(), separator_ids_.end(), ids.begin()))
        ids.clear();  // not as expected: the bytes below
      else
        ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(separator_ids_.size()));
    } else {
      ids = sp_encode(run);
    }
    if (decode_checked(ids.begin(), ids.end(), dummy_ && at_start) != run) {
      // The model changed the text (a normaliser the load-time probe did not catch): the
      // run's bytes instead, so that the rule holds.
      for (char c : run) out.push_back(byte_id_[static_cast<unsigned char>(c)]);
      return;
    }
    out.insert(out.end(), ids.begin(), ids.end());
  }

  sp::SentencePieceProcessor sp_;
  std::string bytes_;
  std::vector<std::string> text_;  // what each id decodes to (U+2581 as a space)
  std::vector<Piece> kind_;
  std::array<int, 256> byte_id_{};
  bool dummy_ = false;      // the model adds a dummy prefix (U+2581) before the text
  bool lines_ = true;       // no piece joins a newline to the character after it
  std::string separator_;   // with dummy_: the character runs after the start are encoded behind
  std::vector<int> separator_ids_;  // and its pieces, dropped again
};

#endif  // XGRAD_WITH_SENTENCEPIECE

}  // namespace

// ---------------------------------------------------------------------------------------

std::string Tokenizer::digest() const { return detail::sha256_hex(kind() + serialized()); }

std::string Tokenizer::description() const {
  if (kind() == "bytes") return "bytes (256)";
  return kind() + ", vocabulary " + std::to_string(vocab_size()) + ", sha256 " + digest().substr(0, 16);
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

bool sentencepiece_available() {
#ifdef XGRAD_WITH_SENTENCEPIECE
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Tokenizer> tokenizer_from_serialized(const std::string& kind, const std::string& bytes,
                                                     const std::string& where) {
  if (kind == "bytes") {
    if (!bytes.empty())
      throw ValueError(op_message(kOp, where + ": the byte tokenizer has no model bytes, got " +
                                           std::to_string(bytes.size())));
    return make_byte_tokenizer();
  }
  if (kind == "llama2c") return make_llama2c_tokenizer(bytes, where);
  if (kind != "sentencepiece")
    throw ValueError(op_message(kOp, where + ": unknown tokenizer kind '" + printable(kind) +
                                         "' (bytes, sentencepiece or llama2c)"));
#ifdef XGRAD_WITH_SENTENCEPIECE
  return std::make_unique<SentencePieceTokenizer>(bytes, where);
#else
  without_sentencepiece(kOp, where + " (a SentencePiece tokenizer)", "");
#endif
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "bytes") return make_byte_tokenizer();
  const bool bin = fs::path(spec).extension() == ".bin";
  // Without SentencePiece only a tokenizer.bin can be read: anything else is that error first.
  if (!sentencepiece_available() && !bin && !fs::is_regular_file(spec))
    without_sentencepiece(kOp, "the tokenizer " + spec, ", or use --tokenizer bytes or a llama2.c tokenizer.bin");
  std::error_code ec;
  const fs::file_status st = fs::status(spec, ec);
  if (!fs::exists(st))
    throw UsageError(op_message(kOp, "--tokenizer '" + spec +
                                         "' does not exist (give a SentencePiece .model file, a llama2.c "
                                         "tokenizer.bin, or 'bytes')"));
  if (fs::is_directory(st))
    throw UsageError(op_message(kOp, "--tokenizer '" + spec + "' is a folder; give the .model or .bin file in it"));
  // Not a FIFO or a device (refused by name), and at most kTokenizerLimit bytes.
  const std::string bytes = io::read_input_file(spec, io::kTokenizerLimit, "[" + std::string(kOp) + "] --tokenizer");
  if (bin) return make_llama2c_tokenizer(bytes, spec);
  try {  // a tokenizer.bin by another name
    return make_llama2c_tokenizer(bytes, spec);
  } catch (const FormatError&) {
  }
  if (!sentencepiece_available())
    without_sentencepiece(kOp, "the tokenizer " + spec + " (not a llama2.c tokenizer.bin)",
                          ", or use --tokenizer bytes or a llama2.c tokenizer.bin");
  return tokenizer_from_serialized("sentencepiece", bytes, spec);
}

SentencePieceVocabulary read_sentencepiece_vocabulary(const std::string& bytes, const std::string& where) {
  const auto foreign = [&](const std::string& why) {
    bool bin = false;  // a llama2.c tokenizer.bin is worth naming as one
    try {
      (void)make_llama2c_tokenizer(bytes, where);
      bin = true;
    } catch (const FormatError&) {
    }
    throw FormatError(op_message(kOp, where + " is not a SentencePiece model (" +
                                          (bin ? "it is a llama2.c tokenizer.bin already" : why) + ")"));
  };
  if (bytes.empty()) foreign("it is empty");
#ifndef XGRAD_WITH_SENTENCEPIECE
  without_sentencepiece(kOp, "reading the SentencePiece model " + where, "");
#else
  sp::SentencePieceProcessor model;
  const sp::util::Status st = model.LoadFromSerializedProto(bytes);
  if (!st.ok()) {
    const std::string m = st.message();
    foreign(m.find("ParseFromArray") != std::string::npos
                ? "it does not parse as one: truncated, corrupt, or another kind of file"
                : "SentencePiece refuses it: " + m);
  }
  const int n = model.GetPieceSize();
  if (n <= 0) throw FormatError(op_message(kOp, where + " is a SentencePiece model without pieces"));
  SentencePieceVocabulary v;
  v.pieces.reserve(static_cast<std::size_t>(n));
  v.scores.reserve(static_cast<std::size_t>(n));
  for (int id = 0; id < n; ++id) {
    v.pieces.push_back(model.IdToPiece(id));
    v.scores.push_back(model.GetScore(id));
  }
  v.bos_id = model.bos_id();
  v.eos_id = model.eos_id();
  return v;
#endif
}

std::vector<std::int64_t> parse_token_ids(std::string_view text, std::size_t vocab_size) {
  std::vector<std::int64_t> ids;
  const char* const ws = " \t\n\r\f\v";
  std::size_t i = text.find_first_not_of(ws), word = 0;
  while (i != std::string_view::npos) {
    std::size_t e = text.find_first_of(ws, i);
    if (e == std::string_view::npos) e = text.size();
    const std::string_view w = text.substr(i, e - i);
    ++word;
    const std::size_t digits = w[0] == '-' ? 1 : 0;
    if (w.size() == digits || w.find_first_not_of("0123456789", digits) != std::string_view::npos)
      throw UsageError(op_message(kOp, "'" + printable(w) + "' (word " + std::to_string(word) +
                                           ") is not an id: ids are decimal integers 0.." +
                                           std::to_string(vocab_size - 1) + " (vocabulary " +
                                           std::to_string(vocab_size) + ")"));
    errno = 0;
    const long long v = std::strtoll(std::string(w).c_str(), nullptr, 10);
    if (errno == ERANGE || v < 0 || static_cast<unsigned long long>(v) >= vocab_size)
      throw UsageError(op_message(kOp, "id " + printable(w) + " (word " + std::to_string(word) +
                                           ") is outside the vocabulary of " + std::to_string(vocab_size) +
                                           " (ids 0.." + std::to_string(vocab_size - 1) + ")"));
    ids.push_back(v);
    i = text.find_first_not_of(ws, e);
  }
  return ids;
}

std::string binary_reason(std::string_view text) {
  const std::size_t n = std::min<std::size_t>(text.size(), 65536);
  const std::size_t nul = text.substr(0, n).find('\0');
  if (nul != std::string_view::npos) return "a NUL byte at offset " + std::to_string(nul);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n;) {
    const std::size_t len = utf8_length(text.substr(i));
    bad += len == 0;
    i += len == 0 ? 1 : len;
  }
  if (4 * bad > n)
    return std::to_string(bad) + " of its first " + std::to_string(n) + " bytes are not UTF-8";
  return "";
}

// ---------------------------------------------------------------------------------------
// Training.

namespace {

void check_options(const TokenizerTrainOptions& o) {
  const auto bad = [](const std::string& m) { throw UsageError(op_message(kTrainOp, m)); };
  if (o.model_type != "bpe" && o.model_type != "unigram" && o.model_type != "char")
    bad("--model-type '" + printable(o.model_type) + "': must be bpe, unigram or char");
  if (o.vocab_size < kMinVocab)
    bad("--vocab-size " + std::to_string(o.vocab_size) + ": must be at least " + std::to_string(kMinVocab) +
        " (256 byte pieces, <unk>, <s>, </s> and at least one piece of text)");
  if (o.vocab_size > kMaxVocab)
    bad("--vocab-size " + std::to_string(o.vocab_size) + ": must be at most " + std::to_string(kMaxVocab));
  if (!o.byte_fallback)
    bad("byte_fallback must be on: xgrad loads only models with the 256 byte pieces (lossless encoding needs them)");
  if (o.threads < 1 || o.threads > 128)  // SentencePiece's own limit
    bad("--threads " + std::to_string(o.threads) + ": must be in [1, 128]");
  if (!(o.character_coverage >= 0.0 && o.character_coverage <= 1.0))
    bad("--character-coverage " + number_text(o.character_coverage) + ": must be in (0, 1], or 0 for automatic");
  if (o.max_sentences < 1) bad("--max-sentences 0: must be at least 1");
}

#ifdef XGRAD_WITH_SENTENCEPIECE

constexpr std::size_t kMaxSentenceBytes = 16384;  // a training sentence, at most
// The sentences SentencePiece trains on: the runs of the pre-split (cut after every stretch of
// newlines), in pieces of at most kMaxSentenceBytes (cut before a space when there is one,
// always between characters).
void add_sentences(std::string_view run, std::vector<std::string_view>& out) {
  while (!run.empty()) {
    std::size_t e = run.size();
    if (e > kMaxSentenceBytes) {
      e = kMaxSentenceBytes;
      const std::size_t space = run.rfind(' ', e - 1);
      if (space != std::string_view::npos && space > 0) {
        e = space;
      } else {
        while (e > 0 && (static_cast<unsigned char>(run[e]) & 0xC0) == 0x80) --e;
      }
    }
    out.push_back(run.substr(0, e));
    run.remove_prefix(e);
  }
}

// Decodes one valid UTF-8 character at the start of s (pre-split runs are valid).
char32_t code_point(std::string_view s, std::size_t len) {
  const auto b = [&](std::size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(s[i])); };
  if (len == 1) return b(0);
  if (len == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (len == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

// The characters SentencePiece will give a piece of their own, chosen by xgrad (SentencePiece's
// own --character_coverage cannot go below 0.98, too high for a small vocabulary over CJK
// text): the most frequent ones (ties: the lower code point first) of the sampled sentences,
// counted as SentencePiece counts them (a space as U+2581; NUL and tab never get a piece:
// SentencePiece 0.1.97 leaves them out of its alphabet, so they are always byte pieces).
struct CharChoice {
  std::uint64_t total = 0;     // characters in the sentences
  std::size_t distinct = 0;    // distinct characters
  std::uint64_t covered = 0;   // characters of the text that are kept
  std::unordered_set<char32_t> kept;
};

// Keeps the `budget` most frequent characters, or with `coverage` > 0 the fewest that make up
// at least that fraction of the text.
CharChoice choose_characters(const std::vector<std::string_view>& sentences, std::size_t budget, double coverage) {
  std::unordered_map<char32_t, std::uint64_t> counts;
  CharChoice c;
  for (std::string_view s : sentences)
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t len = utf8_length(s.substr(i));
      const char32_t ch = code_point(s.substr(i), len);
      i += len;
      if (ch != 0 && ch != U'\t') ++counts[ch == U' ' ? char32_t{0x2581} : ch];
    }
  std::vector<std::pair<std::uint64_t, char32_t>> order;
  for (const auto& kv : counts) {
    c.total += kv.second;
    order.emplace_back(kv.second, kv.first);
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  c.distinct = order.size();
  for (const auto& [count, ch] : order) {
    const bool enough = coverage > 0 ? static_cast<double>(c.covered) >= coverage * static_cast<double>(c.total)
                                     : c.kept.size() >= budget;
    if (enough) break;
    c.kept.insert(ch);
    c.covered += count;
  }
  return c;
}

// The sentences cut at every character not kept (and without it): SentencePiece then sees
// only kept characters, and writes the others as byte pieces.
std::vector<std::string_view> keep_characters(const std::vector<std::string_view>& sentences, const CharChoice& c) {
  std::vector<std::string_view> out;
  for (std::string_view s : sentences) {
    std::size_t from = 0;
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t len = utf8_length(s.substr(i));
      const char32_t ch = code_point(s.substr(i), len);
      if (c.kept.count(ch == U' ' ? char32_t{0x2581} : ch) == 0) {
        if (from < i) out.push_back(s.substr(from, i - from));
        from = i + len;
      }
      i += len;
    }
    if (from < s.size()) out.push_back(s.substr(from));
  }
  return out;
}


// The corpus of `paths`, checked: UsageError for a missing path, a folder without files or
// `out` among the inputs; ValueError for a file that looks binary.
std::vector<TextFile> read_texts(const std::vector<std::string>& paths, const std::string& out) {
  if (paths.empty()) throw UsageError(op_message(kTrainOp, "no corpus: give text files or folders of them"));
  std::vector<TextFile> corpus;
  std::uint64_t total = 0;
  std::error_code ec;
  // Where --out really is (a link named elsewhere may point into a corpus folder).
  const fs::path real_out = fs::weakly_canonical(fs::absolute(out, ec), ec);
  const fs::path out_dir = real_out.has_parent_path() ? real_out.parent_path()
                           : fs::path(out).parent_path().empty() ? fs::path(".") : fs::path(out).parent_path();
  for (const std::string& p : paths) {
    const fs::file_status st = fs::status(p, ec);
    if (!fs::exists(st)) throw UsageError(op_message(kTrainOp, "'" + p + "': no such file or folder"));
    const bool dir = fs::is_directory(st);
    if (dir) {
      bool any = false;
      std::error_code list;
      for (fs::directory_iterator it(p, list), end; !list && it != end && !any; it.increment(list)) {
        std::error_code kind;
        any = fs::is_regular_file(it->path(), kind);
      }
      if (list)  // e.g. no permission to read it: not the same as an empty folder
        throw UsageError(op_message(kTrainOp, "the folder '" + p + "' cannot be listed: " + list.message()));
      if (!any) throw UsageError(op_message(kTrainOp, "the folder '" + p + "' holds no files"));
      if (fs::equivalent(out_dir, p, ec))
        throw UsageError(op_message(kTrainOp, "--out '" + out + "' is in the corpus folder '" + p +
                                                  "', where it would be read as text; write it elsewhere"));
    } else if (fs::equivalent(out, p, ec)) {
      throw UsageError(op_message(kTrainOp, "--out '" + out + "' is the corpus file '" + p +
                                                "': the output would replace the input; write it elsewhere"));
    }
    // A FIFO or a device is refused by name before it is opened (opening a FIFO waits).
    if (!dir) io::require_input_file(p, "[" + std::string(kTrainOp) + "] FILES");
    for (TextFile& f : read_corpus(p)) {
      total += f.text.size();
      if (total > io::kTextLimit)
        throw UsageError(op_message(kTrainOp, "the corpus is more than " + io::size_text(io::kTextLimit) +
                                                  " (the limit of a text read whole) after '" + p + "'"));
      const std::string why = binary_reason(f.text);
      const std::string where = dir ? (fs::path(p) / f.name).string() : p;
      if (!why.empty())
        throw ValueError(op_message(kTrainOp, "'" + where + "' looks binary, not text: " + why +
                                                  " (a NUL byte, or more than a quarter of the bytes not UTF-8, in "
                                                  "the first 64 KiB); leave it out of the corpus"));
      corpus.push_back(std::move(f));
    }
  }
  return corpus;
}

class SentenceList : public sp::SentenceIterator {
 public:
  explicit SentenceList(const std::vector<std::string_view>& s) : s_(s) { load(); }
  bool done() const override { return i_ >= s_.size(); }
  void Next() override {
    ++i_;
    load();
  }
  const std::string& value() const override { return current_; }
  sp::util::Status status() const override { return sp::util::Status(); }

 private:
  void load() {
    if (i_ < s_.size()) current_.assign(s_[i_].data(), s_[i_].size());
  }
  const std::vector<std::string_view>& s_;
  std::size_t i_ = 0;
  std::string current_;
};

// A vocabulary larger than the corpus gives: `most` is the largest it supports ("" unknown).
[[noreturn]] void vocabulary_too_large(const TokenizerTrainOptions& o, const std::string& most) {
  throw UsageError(op_message(kTrainOp, "--vocab-size " + std::to_string(o.vocab_size) +
                                            ": the corpus gives fewer distinct pieces for model type " + o.model_type +
                                            (most.empty() ? "" : "; the largest vocabulary it supports is " + most) +
                                            " (give a smaller --vocab-size or more text)"));
}

// SentencePiece's training errors as xgrad errors: a vocabulary larger than the corpus gives
// is the user's to change ("Vocabulary size too high (N). Please set it to a value <= M.").
[[noreturn]] void training_failed(const sp::util::Status& st, const TokenizerTrainOptions& o) {
  const std::string m = st.message();
  const std::size_t at = m.find("Vocabulary size too high");
  if (at != std::string::npos) {
    const std::size_t le = m.find("<= ", at);
    vocabulary_too_large(o, le == std::string::npos ? "" : std::to_string(std::strtoull(m.c_str() + le + 3, nullptr, 10)));
  }
  throw ValueError(op_message(kTrainOp, "SentencePiece could not train: " + m));
}

std::string thousands(std::uint64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<std::size_t>(i), ",");
  return s;
}

#endif  // XGRAD_WITH_SENTENCEPIECE

}  // namespace

std::string train_sentencepiece(const std::vector<std::string>& paths, const TokenizerTrainOptions& o,
                                const std::string& out) {
  check_options(o);
  if (!sentencepiece_available()) without_sentencepiece(kTrainOp, "training a tokenizer", "");
#ifndef XGRAD_WITH_SENTENCEPIECE
  (void)paths;
  (void)out;
  return {};
#else
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<TextFile> corpus = read_texts(paths, out);
  std::uint64_t bytes = 0;
  std::vector<std::string_view> sentences;
  for (const TextFile& f : corpus) {
    bytes += f.text.size();
    const std::string_view text(f.text);
    pre_split(text, true, [&](std::size_t b, std::size_t e, bool raw) {
      if (!raw) add_sentences(text.substr(b, e - b), sentences);
    });
  }
  // At most max_sentences of them, drawn at random (the first k of a seeded shuffle), kept
  // in corpus order.
  const std::size_t all_sentences = sentences.size();
  if (sentences.size() > o.max_sentences) {
    Generator gen(o.seed);
    std::vector<std::size_t> pick(sentences.size());
    for (std::size_t i = 0; i < pick.size(); ++i) pick[i] = i;
    for (std::size_t i = 0; i < o.max_sentences; ++i) std::swap(pick[i], pick[i + gen.below(pick.size() - i)]);
    pick.resize(o.max_sentences);
    std::sort(pick.begin(), pick.end());
    std::vector<std::string_view> kept;
    for (std::size_t i : pick) kept.push_back(sentences[i]);
    sentences.swap(kept);
  }
  const std::size_t learnable = o.vocab_size - 256 - kControlPieces;
  const std::size_t budget = o.model_type == "char" ? learnable : std::max<std::size_t>(1, learnable / 2);
  const CharChoice chars = choose_characters(sentences, budget, o.character_coverage);
  if (chars.total == 0)
    throw ValueError(op_message(kTrainOp, "the corpus has no text to train on (" + std::to_string(corpus.size()) +
                                              " files, " + std::to_string(bytes) +
                                              " bytes, none of it characters SentencePiece counts)"));
  if (chars.kept.size() > learnable)
    throw UsageError(op_message(kTrainOp, "--vocab-size " + std::to_string(o.vocab_size) + ": --character-coverage " +
                                              std::to_string(o.character_coverage) + " keeps " +
                                              std::to_string(chars.kept.size()) +
                                              " characters, more than the " + std::to_string(learnable) +
                                              " pieces left after the byte and control pieces; give --vocab-size " +
                                              std::to_string(kMinVocab - 1 + chars.kept.size()) +
                                              " or more, or a smaller --character-coverage"));
  const std::vector<std::string_view> kept = keep_characters(sentences, chars);

  const std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"character_coverage", "1"},   // the characters were chosen above
      {"input_sentence_size", "0"},  // and the sentences drawn
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"num_threads", std::to_string(o.threads)},
      {"minloglevel", "2"},  // errors only: no progress lines on stderr
  };
  sp::SetRandomGeneratorSeed(static_cast<unsigned>(o.seed % 0xFFFFFFFFull));  // 2^32 - 1 means "random"
  SentenceList it(kept);
  std::string model;
  const sp::util::Status st = sp::SentencePieceTrainer::Train(args, &it, &model);
  if (!st.ok()) training_failed(st, o);
  const SentencePieceTokenizer tok(model, "the trained model");
  if (tok.vocab_size() != o.vocab_size)  // "char" stops at the characters it has
    vocabulary_too_large(o, std::to_string(tok.vocab_size()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  io::write_atomically(out, model, op_message(kTrainOp, out + ": "));

  std::ostringstream r;
  r.precision(3);
  r << "trained a " << o.model_type << " tokenizer, vocabulary " << tok.vocab_size() << " (256 byte pieces, "
    << kControlPieces << " control, " << tok.vocab_size() - 256 - kControlPieces << " of text)\n";
  r << "corpus: " << corpus.size() << (corpus.size() == 1 ? " file, " : " files, ") << thousands(bytes) << " bytes, "
    << thousands(all_sentences) << " sentences"
    << (sentences.size() < all_sentences ? " (" + thousands(sentences.size()) + " drawn with seed " +
                                               std::to_string(o.seed) + ")"
                                         : std::string())
    << "\n";
  r << "characters: " << thousands(chars.distinct) << " distinct, " << chars.kept.size() << " with a piece of their own ("
    << 100.0 * static_cast<double>(chars.covered) / static_cast<double>(chars.total)
    << "% of the text), the others written as byte pieces\n";
  r << "trained in " << seconds << " s with " << o.threads << (o.threads == 1 ? " thread\n" : " threads\n");
  r << "wrote " << out << ": " << tok.description() << "\n";
  return r.str();
#endif
}

}  // namespace xg::text
