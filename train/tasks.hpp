/// \file
/// Built-in tasks that need no download:
/// - sort (decoder-only): "d_1 .. d_n | s_1 .. s_n", learn to write the digits sorted;
///   held-out exact match of the whole sorted sequence, greedy.
/// - reverse (encoder-decoder): source digits of random length, target the reversed string;
///   needs cross attention; held-out exact match, greedy.
/// - charlm (decoder-only): character-level language modelling on a text file or a folder of
///   text files (default: the licence texts in /usr/share/common-licenses); validation
///   loss and perplexity on the last 10% of every file.
///
/// Every random draw comes from an explicit Generator, so a seed reproduces the data stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <xgrad/core/array.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/text/vocabulary.hpp>

namespace xg::train {

/// The target id that takes no loss (the cross-entropy's ignore_index): prompts and padding.
constexpr std::int64_t kIgnore = -100;

/// Decoder-only batch: next-token targets (kIgnore where no loss is taken).
struct LMBatch {
  IndexArray tokens;   ///< Input ids [B, T].
  IndexArray targets;  ///< Target ids [B, T]: the token after each input position, or kIgnore.
};

/// Encoder-decoder batch.
struct Seq2SeqBatch {
  IndexArray src;                        ///< Source ids [B, S], padded with PAD.
  std::vector<std::size_t> src_lengths;  ///< Real source tokens per sample.
  IndexArray tgt_in;                     ///< Decoder input [B, T]: BOS + target (padded).
  IndexArray tgt_out;                    ///< Decoder targets [B, T]: target + EOS (kIgnore on padding).
};

/// The sort task (decoder-only): n random digits, the separator "|", then the same digits
/// sorted. The loss is taken on the sorted half only.
class SortTask {
 public:
  /// Sequences of `n_digits` digits drawn from `n_values` values 0 .. n_values - 1.
  /// ValueError unless n_digits >= 1 and 2 <= n_values <= 10.
  explicit SortTask(std::size_t n_digits = 8, std::size_t n_values = 10);
  /// The digits 0 .. n_values - 1 and then "|" (id sep()).
  const text::Vocabulary& vocab() const { return vocab_; }
  /// n, the number of digits per problem.
  std::size_t n() const { return n_; }
  /// The length of a whole sequence, 2n + 1 (digits, separator, sorted digits).
  std::size_t context() const { return 2 * n_ + 1; }
  /// n uniformly random digits: one problem.
  std::vector<std::int64_t> sample_digits(Generator& gen) const;
  /// Training batch of B sequences [B, 2n] (the last token is only a target); a sample that
  /// equals a held-out sequence (exclude()) is redrawn.
  LMBatch batch(std::size_t B, Generator& gen) const;
  /// `count` fixed, distinct held-out problems (digits) drawn from `seed`. ValueError when
  /// they would be more than half of all possible problems.
  std::vector<std::vector<std::int64_t>> heldout(std::size_t count, std::uint64_t seed) const;
  /// The prompt "d_1 .. d_n |" for one problem.
  std::vector<std::int64_t> prompt(const std::vector<std::int64_t>& digits) const;
  /// The expected answer: the digits sorted.
  std::vector<std::int64_t> answer(const std::vector<std::int64_t>& digits) const;
  /// The separator's id, n_values.
  std::int64_t sep() const { return static_cast<std::int64_t>(values_); }
  /// Problems batch() must never draw (the held-out set), replacing any given before.
  void exclude(const std::vector<std::vector<std::int64_t>>& heldout);

 private:
  std::size_t n_, values_;
  text::Vocabulary vocab_;
  std::vector<std::vector<std::int64_t>> excluded_;
};

/// The reverse task (encoder-decoder): a source of min_len .. max_len random digits, the
/// target the same digits reversed. text::Vocabulary: the digits 0 .. 9, then PAD "_", BOS "<" and
/// EOS ">".
class ReverseTask {
 public:
  /// Sources of `min_len` to `max_len` digits (each length equally likely). ValueError unless
  /// 1 <= min_len <= max_len.
  ReverseTask(std::size_t min_len = 3, std::size_t max_len = 8);
  /// The digits, PAD, BOS and EOS.
  const text::Vocabulary& vocab() const { return vocab_; }
  /// The longest source, max_len.
  std::size_t max_len() const { return max_len_; }
  /// The longest decoder sequence, max_len + 1 (BOS or EOS added to the target).
  std::size_t context() const { return max_len_ + 1; }
  /// The padding id (token "_").
  std::int64_t pad() const { return 10; }
  /// The beginning-of-sequence id (token "<"), the decoder's first input.
  std::int64_t bos() const { return 11; }
  /// The end-of-sequence id (token ">"), the last target.
  std::int64_t eos() const { return 12; }
  /// One random source: a length drawn uniformly from [min_len, max_len], then that many
  /// random digits.
  std::vector<std::int64_t> sample(Generator& gen) const;
  /// Training batch of B random sources (S = max_len, T = max_len + 1); a source in the
  /// held-out set (exclude()) is redrawn.
  Seq2SeqBatch batch(std::size_t B, Generator& gen) const;
  /// The batch of the given sources, padded as batch() pads.
  Seq2SeqBatch make_batch(const std::vector<std::vector<std::int64_t>>& sources) const;
  /// `count` fixed, distinct held-out sources drawn from `seed`. ValueError when they would be
  /// more than half of the problems available.
  std::vector<std::vector<std::int64_t>> heldout(std::size_t count, std::uint64_t seed) const;
  /// Sources batch() must never draw (the held-out set), replacing any given before.
  void exclude(const std::vector<std::vector<std::int64_t>>& heldout);

 private:
  std::size_t min_len_, max_len_;
  text::Vocabulary vocab_;
  std::vector<std::vector<std::int64_t>> excluded_;
};

/// The charlm task (decoder-only): next-byte prediction over a corpus of texts. The
/// vocabulary is the set of bytes in the corpus, one token each, in byte order.
class CharLMTask {
 public:
  /// Reads the text (FormatError/ValueError if unreadable or shorter than a few windows);
  /// the last 10% is the validation split. `path` is a file or a folder (text::read_corpus);
  /// `context` is the window T of every batch.
  CharLMTask(const std::string& path, std::size_t context);
  /// The same from the file's contents, already read (text::read_text); `path` names it in messages.
  CharLMTask(const std::string& path, std::size_t context, const std::string& contents);
  /// A corpus of several texts (text::read_corpus): the last 10% of every text is the validation
  /// split, the first 90% the training split (each split the texts one after the other).
  CharLMTask(const std::string& path, std::size_t context, const std::vector<text::TextFile>& corpus);
  /// The number of tokens (bytes) in the training split.
  std::size_t train_size() const { return train_.size(); }
  /// The number of tokens (bytes) in the validation split.
  std::size_t validation_size() const { return val_.size(); }
  /// One token per distinct byte of the corpus, in byte order.
  const text::Vocabulary& vocab() const { return vocab_; }
  /// The window T of a batch.
  std::size_t context() const { return context_; }
  /// B windows [B, context] at uniformly random offsets of the training split (or the
  /// validation split), targets the next byte at every position.
  LMBatch batch(std::size_t B, Generator& gen, bool validation = false) const;
  /// The ids of the bytes of `text`; ValueError for a byte not in the vocabulary.
  std::vector<std::int64_t> encode(const std::string& text) const;

 private:
  std::size_t context_;
  text::Vocabulary vocab_;
  std::vector<std::int64_t> train_, val_;
};

}  // namespace xg::train
