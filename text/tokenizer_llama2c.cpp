// llama2.c's tokenizer.bin (text/tokenizer.hpp, docs/llama.md): the file format, and the
// encoder and decoder of llama2.c's run.c written again for xgrad. Needs nothing outside xgrad
// (no SentencePiece).
#include <xgrad/text/tokenizer.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <queue>
#include <unordered_map>

#include <xgrad/core/error.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/input_file.hpp>

namespace xg::text {

namespace {

constexpr const char* kOp = "tokenizer";
constexpr std::size_t kFirstByte = 3;                // <0x00> is id 3: run.c's byte fallback is byte + 3
constexpr std::size_t kMinPieces = kFirstByte + 256;  // <unk>, <s>, </s> and the 256 byte pieces
constexpr std::size_t kMaxPieces = std::size_t{1} << 20;
// run.c starts its search for the best merge at this score and takes only a strictly higher
// one, so a piece scored at or below it is never made by a merge.
constexpr float kNoMerge = -1e10f;

std::int32_t read_i32(const std::string& b, std::size_t at) {
  std::uint32_t v = 0;
  for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(k)]);
  std::int32_t s;
  std::memcpy(&s, &v, 4);
  return s;
}

void put_u32(std::string& b, std::uint32_t v) {
  for (int k = 0; k < 4; ++k) b += static_cast<char>((v >> (8 * k)) & 0xFF);
}

void put_f32(std::string& b, float f) {
  std::uint32_t v;
  std::memcpy(&v, &f, 4);
  put_u32(b, v);
}

float read_f32(const std::string& b, std::size_t at) {
  std::uint32_t v = 0;
  for (int k = 3; k >= 0; --k) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(k)]);
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}

std::string hex_byte(unsigned b) {
  static const char* const kHex = "0123456789ABCDEF";
  return std::string(1, kHex[(b >> 4) & 15]) + kHex[b & 15];
}

// A piece for a message: at most 24 bytes, anything but printable ASCII as \xNN.
std::string shown(const std::string& p) {
  std::string out;
  for (std::size_t i = 0; i < p.size() && i < 24; ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    if (c >= 0x20 && c < 0x7F) out += static_cast<char>(c);
    else out += "\\x" + hex_byte(c);
  }
  return p.size() > 24 ? out + "..." : out;
}

class Llama2cTokenizer : public Tokenizer {
 public:
  Llama2cTokenizer(const std::string& bytes, const std::string& where) : bytes_(bytes) {
    const auto bad = [&](const std::string& m) -> void {
      throw FormatError(op_message(kOp, where + ": not a llama2.c tokenizer.bin: " + m));
    };
    const std::size_t n = bytes.size();
    if (n < 4)
      bad("it has " + std::to_string(n) + " bytes, fewer than its 4-byte header (max_token_length)");
    const std::int32_t max_len = read_i32(bytes, 0);
    if (max_len < 1 || static_cast<std::uint64_t>(max_len) > n)
      bad("max_token_length " + std::to_string(max_len) + " must be in [1, " + std::to_string(n) +
          "] (the file has " + std::to_string(n) + " bytes)");
    std::size_t at = 4;
    while (at < n) {
      const std::size_t id = pieces_.size();
      const std::string entry = "piece " + std::to_string(id) + " at byte " + std::to_string(at);
      if (id == kMaxPieces) bad("more than " + std::to_string(kMaxPieces) + " pieces");
      if (n - at < 8)
        bad(entry + " is truncated: its score and length need 8 bytes, the file has " + std::to_string(n - at) +
            " left");
      const float score = read_f32(bytes, at);
      const std::int32_t len = read_i32(bytes, at + 4);
      if (!std::isfinite(score)) bad(entry + " has the score " + std::to_string(score) + ", not a finite number");
      if (len < 0) bad(entry + " has the length " + std::to_string(len) + ", negative");
      if (len > max_len)
        bad(entry + " has the length " + std::to_string(len) + ", more than max_token_length " +
            std::to_string(max_len));
      if (static_cast<std::size_t>(len) > n - at - 8)
        bad(entry + " is truncated: its length " + std::to_string(len) + " needs more bytes than the " +
            std::to_string(n - at - 8) + " left in the file");
      pieces_.push_back(bytes.substr(at + 8, static_cast<std::size_t>(len)));
      scores_.push_back(score);
      at += 8 + static_cast<std::size_t>(len);
    }
    if (pieces_.size() < kMinPieces)
      bad("it has " + std::to_string(pieces_.size()) + " pieces; a llama2.c tokenizer has at least " +
          std::to_string(kMinPieces) + " (<unk>, <s>, </s>, then the 256 byte pieces <0x00>..<0xFF>)");
    for (unsigned b = 0; b < 256; ++b) {
      const std::string want = "<0x" + hex_byte(b) + ">";
      if (pieces_[kFirstByte + b] != want)
        bad("piece " + std::to_string(kFirstByte + b) + " is '" + shown(pieces_[kFirstByte + b]) + "', not the byte piece " +
            want + " (run.c's byte fallback writes byte b as id b + 3)");
    }
    // Pieces are looked up by their bytes; when two pieces have the same bytes the lower id wins
    // (run.c's binary search would find either).
    ids_.reserve(pieces_.size());
    for (std::size_t id = 0; id < pieces_.size(); ++id) ids_.emplace(pieces_[id], static_cast<std::int64_t>(id));
    const auto space = ids_.find(" ");
    space_ = space == ids_.end() ? static_cast<std::int64_t>(kFirstByte + ' ') : space->second;
  }

  std::string kind() const override { return "llama2c"; }
  std::size_t vocab_size() const override { return pieces_.size(); }
  std::string serialized() const override { return bytes_; }
  std::int64_t bos_id() const override { return kLlama2cBos; }
  std::int64_t eos_id() const override { return kLlama2cEos; }

  std::vector<std::int64_t> encode(std::string_view text) const override {
    // run.c's encode(text, bos = 1, eos = 0). Symbols first: BOS, the dummy prefix " " (when
    // the text is not empty), then one per character (a byte and the continuation bytes after
    // it, at most 4 bytes): the character's piece, or its bytes' pieces when it has none.
    std::vector<std::int64_t> sym = {kLlama2cBos};
    if (!text.empty()) sym.push_back(space_);
    for (std::size_t i = 0; i < text.size();) {
      std::size_t len = 1;
      while (i + len < text.size() && len < 4 && (static_cast<unsigned char>(text[i + len]) & 0xC0) == 0x80) ++len;
      const auto it = ids_.find(std::string(text.substr(i, len)));
      if (it != ids_.end()) {
        sym.push_back(it->second);
      } else {
        for (std::size_t k = i; k < i + len; ++k)
          sym.push_back(static_cast<std::int64_t>(kFirstByte + static_cast<unsigned char>(text[k])));
      }
      i += len;
    }
    merge(sym);
    return sym;
  }

  std::string decode(const std::vector<std::int64_t>& ids) const override {
    std::string out;
    bool after_bos = false;
    for (std::int64_t id : ids) {
      check(id);
      const std::size_t i = static_cast<std::size_t>(id);
      const bool strip = after_bos;
      after_bos = id == kLlama2cBos;
      if (id == kLlama2cBos || id == kLlama2cEos) continue;
      const std::string text = i >= kFirstByte && i < kMinPieces ? std::string(1, static_cast<char>(i - kFirstByte))
                                                                 : pieces_[i];
      out.append(text, strip && !text.empty() && text[0] == ' ' ? 1 : 0, std::string::npos);
    }
    return out;
  }

  std::string piece(std::int64_t id) const override {
    check(id);
    return pieces_[static_cast<std::size_t>(id)];
  }

 private:
  void check(std::int64_t id) const {
    if (id < 0 || static_cast<std::uint64_t>(id) >= pieces_.size())
      throw ValueError(op_message(kOp, "id " + std::to_string(id) + " is outside the vocabulary of " +
                                           std::to_string(pieces_.size()) + " (ids 0.." +
                                           std::to_string(pieces_.size() - 1) + ")"));
  }

  // run.c's merge loop: repeatedly replace the adjacent pair whose joined bytes are a piece with
  // the highest score (the leftmost such pair on a tie) by that piece, until no pair joins.
  // Done with a heap of candidate pairs over a linked list instead of run.c's rescan of every
  // pair per merge: the same merges in the same order, in O(n log n).
  void merge(std::vector<std::int64_t>& sym) const {
    const std::size_t n = sym.size();
    if (n < 2) return;
    std::vector<std::size_t> prev(n), next(n);
    std::vector<bool> alive(n, true);
    for (std::size_t i = 0; i < n; ++i) {
      prev[i] = i == 0 ? n : i - 1;
      next[i] = i + 1;  // n: none
    }
    struct Candidate {
      float score;
      std::size_t left;
      std::int64_t left_id, right_id, merged;
    };
    const auto lower = [](const Candidate& a, const Candidate& b) {
      return a.score != b.score ? a.score < b.score : a.left > b.left;
    };
    std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower)> heap(lower);
    const auto consider = [&](std::size_t left) {
      if (left >= n || next[left] >= n) return;
      const std::size_t right = next[left];
      const auto it = ids_.find(pieces_[static_cast<std::size_t>(sym[left])] + pieces_[static_cast<std::size_t>(sym[right])]);
      if (it == ids_.end()) return;
      const float score = scores_[static_cast<std::size_t>(it->second)];
      if (!(score > kNoMerge)) return;
      heap.push({score, left, sym[left], sym[right], it->second});
    };
    for (std::size_t i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      const std::size_t left = c.left;
      // Stale: a symbol of the pair was merged away or changed since the pair was queued.
      if (!alive[left] || sym[left] != c.left_id || next[left] >= n || sym[next[left]] != c.right_id) continue;
      const std::size_t right = next[left];
      sym[left] = c.merged;
      alive[right] = false;
      next[left] = next[right];
      if (next[right] < n) prev[next[right]] = left;
      if (prev[left] < n) consider(prev[left]);
      consider(left);
    }
    std::vector<std::int64_t> out;
    for (std::size_t i = 0; i < n; i = next[i]) out.push_back(sym[i]);
    sym.swap(out);
  }

  std::string bytes_;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, std::int64_t> ids_;
  std::int64_t space_ = 0;  // the dummy prefix: the piece " ", or the byte piece <0x20>
};

}  // namespace

std::unique_ptr<Tokenizer> make_llama2c_tokenizer(const std::string& bytes, const std::string& where) {
  return std::make_unique<Llama2cTokenizer>(bytes, where);
}


std::string llama2c_tokenizer_bytes(const SentencePieceVocabulary& v, const std::string& where) {
  const auto unusable = [&](const std::string& m) -> void {
    throw FormatError(op_message(kOp, where + ": run.c cannot use this SentencePiece model: " + m +
                                          " (run.c takes id 1 as BOS and byte b as id b + 3: it needs <s> at id 1, "
                                          "</s> at id 2 and the byte pieces <0x00>..<0xFF> at ids 3..258, "
                                          "SentencePiece's layout with byte_fallback)"));
  };
  const std::size_t n = v.pieces.size();
  if (v.scores.size() != n)
    throw InternalError(op_message(kOp, where + ": " + std::to_string(n) + " pieces but " +
                                            std::to_string(v.scores.size()) + " scores"));
  if (n < kMinPieces)
    unusable("it has " + std::to_string(n) + " pieces, fewer than the " + std::to_string(kMinPieces) + " it needs");
  if (n > kMaxPieces) unusable("it has " + std::to_string(n) + " pieces, more than " + std::to_string(kMaxPieces));
  if (v.bos_id != kLlama2cBos)
    unusable(v.bos_id < 0 ? std::string("it has no <s> (BOS)") : "its <s> (BOS) is id " + std::to_string(v.bos_id));
  if (v.eos_id != kLlama2cEos)
    unusable(v.eos_id < 0 ? std::string("it has no </s> (EOS)") : "its </s> (EOS) is id " + std::to_string(v.eos_id));
  for (unsigned b = 0; b < 256; ++b) {
    const std::string want = "<0x" + hex_byte(b) + ">";
    if (v.pieces[kFirstByte + b] != want)
      unusable("id " + std::to_string(kFirstByte + b) + " is '" + shown(v.pieces[kFirstByte + b]) + "', not " + want);
  }
  // The converter's pieces: BOS and EOS as it names them, every U+2581 as a space.
  static const std::string kSpaceMarker = "\xE2\x96\x81";
  std::vector<std::string> pieces(n);
  std::size_t longest = 0;
  for (std::size_t id = 0; id < n; ++id) {
    if (id == static_cast<std::size_t>(kLlama2cBos)) {
      pieces[id] = "\n<s>\n";
    } else if (id == static_cast<std::size_t>(kLlama2cEos)) {
      pieces[id] = "\n</s>\n";
    } else {
      const std::string& p = v.pieces[id];
      for (std::size_t i = 0; i < p.size();) {
        if (p.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) {
          pieces[id] += ' ';
          i += kSpaceMarker.size();
        } else {
          pieces[id] += p[i++];
        }
      }
    }
    if (!std::isfinite(v.scores[id]))
      unusable("piece " + std::to_string(id) + " has the score " + std::to_string(v.scores[id]) + ", not a finite number");
    longest = std::max(longest, pieces[id].size());
  }
  std::string out;
  put_u32(out, static_cast<std::uint32_t>(longest));
  for (std::size_t id = 0; id < n; ++id) {
    put_f32(out, v.scores[id]);
    put_u32(out, static_cast<std::uint32_t>(pieces[id].size()));
    out += pieces[id];
  }
  return out;
}

std::unique_ptr<Tokenizer> export_llama2c_tokenizer(const std::string& model, const std::string& out) {
  namespace fs = std::filesystem;
  const std::string op = "tokenizer export";
  std::error_code ec;
  const fs::file_status st = fs::status(model, ec);
  if (!fs::exists(st)) throw UsageError(op_message(op, "MODEL '" + model + "' does not exist"));
  if (fs::is_directory(st))
    throw UsageError(op_message(op, "MODEL '" + model + "' is a folder; give the .model file in it"));
  const std::string bytes = io::read_input_file(model, io::kTokenizerLimit, "[" + op + "] MODEL");
  const std::string bin = llama2c_tokenizer_bytes(read_sentencepiece_vocabulary(bytes, model), model);
  // What run.c will read, read back by xgrad's reader before anything is written.
  std::unique_ptr<Tokenizer> back = make_llama2c_tokenizer(bin, out);
  io::write_atomically(out, bin, op_message(op, out + ": "));
  return back;
}

}  // namespace xg::text
