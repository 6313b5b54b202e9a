// Built-in tasks that need no download:
//   sort     (decoder-only): "d_1 .. d_n | s_1 .. s_n", learn to write the digits sorted;
//            held-out exact match of the whole sorted sequence, greedy.
//   reverse  (encoder-decoder): source digits of random length, target the reversed string;
//            needs cross attention; held-out exact match, greedy.
//   charlm   (decoder-only): character-level language modelling on a text file or a folder of
//            text files (default: the licence texts in /usr/share/common-licenses); validation
//            loss and perplexity on the last 10% of every file.
// Every random draw comes from an explicit Generator, so a seed reproduces the data stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <xgrad/core/array.hpp>
#include <xgrad/core/random.hpp>

namespace xg::train {

constexpr std::int64_t kIgnore = -100;

// Tokens are strings (a digit, a separator, a character); ids index `tokens`.
struct Vocabulary {
  std::vector<std::string> tokens;
  std::size_t size() const { return tokens.size(); }
  std::int64_t id(const std::string& t) const;  // ValueError naming the token if unknown
  std::string decode(const std::vector<std::int64_t>& ids) const;
  std::string to_json() const;  // JSON array of the tokens (saved in checkpoints)
  static Vocabulary from_json(const std::string& json);
};

// Decoder-only batch: next-token targets (kIgnore where no loss is taken).
struct LMBatch {
  IndexArray tokens;   // [B, T]
  IndexArray targets;  // [B, T]
};

// Encoder-decoder batch.
struct Seq2SeqBatch {
  IndexArray src;                        // [B, S], padded with PAD
  std::vector<std::size_t> src_lengths;  // real source tokens per sample
  IndexArray tgt_in;                     // [B, T]: BOS + target (padded)
  IndexArray tgt_out;                    // [B, T]: target + EOS (kIgnore on padding)
};

class SortTask {
 public:
  explicit SortTask(std::size_t n_digits = 8, std::size_t n_values = 10);
  const Vocabulary& vocab() const { return vocab_; }
  std::size_t n() const { return n_; }
  std::size_t context() const { return 2 * n_ + 1; }
  std::vector<std::int64_t> sample_digits(Generator& gen) const;
  // Training batch; a sample that equals a held-out sequence is redrawn.
  LMBatch batch(std::size_t B, Generator& gen) const;
  // Fixed held-out problems (digits) and the prompt "d_1 .. d_n |" for one of them.
  std::vector<std::vector<std::int64_t>> heldout(std::size_t count, std::uint64_t seed) const;
  std::vector<std::int64_t> prompt(const std::vector<std::int64_t>& digits) const;
  std::vector<std::int64_t> answer(const std::vector<std::int64_t>& digits) const;  // sorted
  std::int64_t sep() const { return static_cast<std::int64_t>(values_); }
  void exclude(const std::vector<std::vector<std::int64_t>>& heldout);

 private:
  std::size_t n_, values_;
  Vocabulary vocab_;
  std::vector<std::vector<std::int64_t>> excluded_;
};

class ReverseTask {
 public:
  ReverseTask(std::size_t min_len = 3, std::size_t max_len = 8);
  const Vocabulary& vocab() const { return vocab_; }
  std::size_t max_len() const { return max_len_; }
  std::size_t context() const { return max_len_ + 1; }
  std::int64_t pad() const { return 10; }
  std::int64_t bos() const { return 11; }
  std::int64_t eos() const { return 12; }
  std::vector<std::int64_t> sample(Generator& gen) const;
  Seq2SeqBatch batch(std::size_t B, Generator& gen) const;
  Seq2SeqBatch make_batch(const std::vector<std::vector<std::int64_t>>& sources) const;
  std::vector<std::vector<std::int64_t>> heldout(std::size_t count, std::uint64_t seed) const;
  void exclude(const std::vector<std::vector<std::int64_t>>& heldout);

 private:
  std::size_t min_len_, max_len_;
  Vocabulary vocab_;
  std::vector<std::vector<std::int64_t>> excluded_;
};

// One text of a charlm corpus: its file name (without folder) and its bytes.
struct TextFile {
  std::string name;
  std::string text;
};

class CharLMTask {
 public:
  // Reads the text (FormatError/ValueError if unreadable or shorter than a few windows);
  // the last 10% is the validation split.
  CharLMTask(const std::string& path, std::size_t context);
  // The same from the file's contents, already read (read_text); `path` names it in messages.
  CharLMTask(const std::string& path, std::size_t context, const std::string& contents);
  // A corpus of several texts (read_corpus): the last 10% of every text is the validation
  // split, the first 90% the training split (each split the texts one after the other).
  CharLMTask(const std::string& path, std::size_t context, const std::vector<TextFile>& corpus);
  static std::string read_text(const std::string& path);  // ValueError if unreadable
  // `path` a file: that file. A folder: every regular file in it (symbolic links resolved,
  // a file reached by several names read once, under its own name), sorted by name.
  // ValueError naming the path if it is missing, unreadable or a folder without files.
  static std::vector<TextFile> read_corpus(const std::string& path);
  // "name:bytes:checksum" per text, joined by ";" (FNV-1a 64, hex): saved with a run so that
  // resume can tell that the corpus changed.
  static std::string fingerprint(const std::vector<TextFile>& corpus);
  std::size_t train_size() const { return train_.size(); }
  std::size_t validation_size() const { return val_.size(); }
  const Vocabulary& vocab() const { return vocab_; }
  std::size_t context() const { return context_; }
  LMBatch batch(std::size_t B, Generator& gen, bool validation = false) const;
  std::vector<std::int64_t> encode(const std::string& text) const;

 private:
  std::size_t context_;
  Vocabulary vocab_;
  std::vector<std::int64_t> train_, val_;
};

}  // namespace xg::train
