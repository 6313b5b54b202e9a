/// \file
/// Tokenizers: text (any bytes) to token ids and back, exactly.
///
/// Three kinds:
/// - `bytes`: 256 ids, id == byte value. Needs nothing.
/// - `sentencepiece`: a SentencePiece model (a `.model` file: trained by `xgrad tokenizer
///   train`, by SentencePiece's own trainer, or brought along, e.g. a Llama tokenizer.model).
///   Needs xgrad built with SentencePiece (CMake option XGRAD_WITH_SENTENCEPIECE, Debian
///   libsentencepiece-dev); otherwise loading one is a UsageError saying so.
/// - `llama2c`: llama2.c's `tokenizer.bin` (docs/llama.md has the format): pieces with merge
///   scores, encoded and decoded as llama2.c's run.c does. Needs nothing. Its encode() is run.c's
///   encode(text, bos = 1, eos = 0): BOS (id 1) first; when the text is not empty the dummy
///   prefix, the piece " " (or the byte piece <0x20> if there is none); then one symbol per
///   character (a byte and the up to 3 continuation bytes after it; no other UTF-8 check): the
///   character's piece, or when it has none its bytes' pieces (byte b is id b + 3); then,
///   repeatedly, the adjacent pair whose joined bytes are a piece with the highest score (the
///   leftmost on a tie; only scores above -1e10, as run.c) becomes that piece. decode() is run.c's:
///   each id gives its piece's bytes, a byte piece (ids 3..258) its byte, BOS and EOS (ids 1, 2)
///   nothing, and the id after a BOS loses a leading space. So decode(encode(s)) == s for every
///   s, with one exception run.c shares: a vocabulary with a piece that a merge can spell from the
///   *text* of a byte piece or of BOS/EOS (run.c joins pieces' texts, so `<0x41>` + `b` makes a
///   piece `<0x41>b` if there is one, which decodes as those 7 bytes); llama2.c's vocabularies,
///   exported from SentencePiece models, have none.
///   Differences from run.c, all for input run.c cannot handle: a NUL byte is encoded as <0x00>
///   (run.c's C string would end there); pieces with the same bytes resolve to the lower id; the
///   id after a BOS also loses the space of the byte piece <0x20> (a vocabulary without " ").
///
/// The rest of this comment is about SentencePiece models.
///
/// **Lossless, for every byte string.** `decode(encode(s)) == s` for every `s`, invalid UTF-8
/// included. SentencePiece alone is not: it replaces each byte of invalid UTF-8 with U+FFFD,
/// and it writes a space as U+2581 (its whitespace marker), so a U+2581 in the text would come
/// back as a space. xgrad therefore encodes in three steps:
/// 1. **Pre-split.** The text is cut into *runs*, maximal stretches of valid UTF-8 (RFC 3629:
///    no overlong forms, no surrogates, nothing above U+10FFFF) without U+2581, and *raw bytes*:
///    every byte of invalid UTF-8 and the three bytes of each U+2581. A run also ends after
///    every stretch of newlines that something else follows, unless the model has a piece that
///    joins a newline to a following character (then runs are not cut at lines).
/// 2. **Runs go through SentencePiece**, one call each. A model that adds a dummy prefix (a
///    U+2581 before the text, as Llama's does) adds it to every call; a run that does not
///    start the text is therefore encoded behind a separator, the first control character
///    (U+0001..U+001F, U+007F) that the model writes as its byte piece, and the pieces of
///    that separator (U+2581 and the byte piece) are dropped: what remains are the pieces
///    SentencePiece gives the run after a character it has no piece for.
/// 3. **Raw bytes become byte pieces** `<0x00>` .. `<0xFF>` directly (SentencePiece's byte
///    fallback pieces, which every model xgrad loads must have).
///
/// A run whose pieces do not spell it back exactly (a model whose normaliser changes text
/// that the checks at load time did not catch) is encoded as its byte pieces instead, so the
/// rule holds for every model. Cutting at lines changes nothing for a model whose pieces never
/// join a newline to what follows (those xgrad trains, Llama's): text without invalid UTF-8
/// and U+2581 gets exactly the ids SentencePiece gives it, while encoding stays linear in the
/// length (SentencePiece's own time grows faster than the length of one call's text).
///
/// decode() is xgrad's own, piece by piece (SentencePiece's would turn invalid UTF-8 into
/// U+FFFD): a byte piece gives its byte, a normal, user-defined or unused piece its text with
/// every U+2581 read as a space, `<s>`, `</s>` and other control pieces nothing, `<unk>`
/// " U+2047 " (SentencePiece's default; encode() never produces it). A model with a dummy
/// prefix drops the leading space of the first id that is not a control piece when that id is
/// a piece starting with U+2581.
///
/// Models xgrad refuses (FormatError naming the file): models without the 256 byte pieces
/// (trained without byte_fallback), models that drop or move whitespace (SentencePiece's
/// remove_extra_whitespaces, treat_whitespace_as_suffix, or escape_whitespaces off; found by
/// encoding " a  b " when the model is loaded), and models with a dummy prefix that have a
/// piece for every control character (no separator).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace xg::text {

/// Text (bytes) to token ids and back; see the file comment for the lossless rule.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;  ///< Tokenizers are owned through this interface.
  /// "bytes", "sentencepiece" or "llama2c".
  virtual std::string kind() const = 0;
  /// The number of ids, V: ids are 0 .. V-1.
  virtual std::size_t vocab_size() const = 0;
  /// The ids of `text`, any bytes. Lossless: decode(encode(s)) == s for every byte string s
  /// (llama2c: with the exception in the file comment).
  virtual std::vector<std::int64_t> encode(std::string_view text) const = 0;
  /// The bytes the ids stand for; ValueError naming the id for an id outside [0, vocab_size()).
  virtual std::string decode(const std::vector<std::int64_t>& ids) const = 0;
  /// The display text of one id: the SentencePiece piece (`▁the`, `<0x0A>`, `<s>`); for bytes,
  /// printable ASCII as itself and any other byte as `<0xNN>`; for llama2c the piece's bytes as
  /// the file has them (` Once`, `<0x0A>`, `\n<s>\n`). ValueError for a bad id.
  virtual std::string piece(std::int64_t id) const = 0;
  /// The id of the beginning-of-text token BOS (`<s>`), -1 when the tokenizer has none (bytes).
  /// encode() never gives it for a SentencePiece model; a llama2c tokenizer starts every text
  /// with it (id 1). `--doc-separator bos` puts it before every document.
  virtual std::int64_t bos_id() const { return -1; }
  /// The id of the end-of-text token EOS (`</s>`), -1 when the tokenizer has none (bytes).
  virtual std::int64_t eos_id() const { return -1; }
  /// The model file's bytes ("" for bytes; the tokenizer.bin for llama2c): what a checkpoint embeds to rebuild the tokenizer
  /// with tokenizer_from_serialized().
  virtual std::string serialized() const = 0;
  /// The SHA-256 (64 hex digits) of kind() + serialized(): identifies the tokenizer.
  std::string digest() const;
  /// One line for people: "bytes (256)", "sentencepiece, vocabulary 1024, sha256 <16 hex digits>".
  std::string description() const;
};

/// The byte tokenizer: 256 ids, id == byte value.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

/// BOS of a llama2c tokenizer (run.c's fixed id): it starts every encoded prompt.
constexpr std::int64_t kLlama2cBos = 1;
/// EOS of a llama2c tokenizer (run.c's fixed id): never added by encoding.
constexpr std::int64_t kLlama2cEos = 2;

/// The llama2c tokenizer of a tokenizer.bin's bytes; FormatError naming `where` for a file that
/// is not one: shorter than its header, max_token_length outside [1, file size], a piece whose
/// score is not finite, whose length is negative, above max_token_length or past the end of
/// the file, fewer than 259 pieces, or ids 3..258 that are not the byte pieces <0x00>..<0xFF>.
/// Every size is checked against the bytes there are before anything is allocated for it.
std::unique_ptr<Tokenizer> make_llama2c_tokenizer(const std::string& bytes, const std::string& where);

/// "bytes", or the path of a tokenizer file: a llama2.c tokenizer.bin when the name ends in
/// ".bin" or the file reads completely as one, otherwise a SentencePiece .model file.
/// FormatError naming the path for a corrupt, truncated, empty or foreign file or a model xgrad
/// cannot use losslessly (see the file comment); UsageError when the file is missing or a
/// folder, or when a SentencePiece model is given to an xgrad built without SentencePiece.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

/// The tokenizer of `kind` ("bytes", "sentencepiece" or "llama2c") from its serialized() bytes,
/// as a checkpoint embeds them; `where` names the source in errors (FormatError as for
/// load_tokenizer, ValueError for an unknown kind or bytes for the byte tokenizer).
std::unique_ptr<Tokenizer> tokenizer_from_serialized(const std::string& kind, const std::string& bytes,
                                                     const std::string& where);

/// Whether this xgrad was built with SentencePiece (CMake option XGRAD_WITH_SENTENCEPIECE).
bool sentencepiece_available();

/// The pieces of a SentencePiece model as its file stores them, in id order: what
/// llama2c_tokenizer_bytes() turns into a tokenizer.bin.
struct SentencePieceVocabulary {
  std::vector<std::string> pieces;  ///< as the model spells them: U+2581 for a space, `<0x0A>`, `<s>`
  std::vector<float> scores;        ///< SentencePiece's score of each piece
  std::int64_t bos_id = -1;         ///< `<s>`'s id, -1 when the model has none
  std::int64_t eos_id = -1;         ///< `</s>`'s id, -1 when the model has none
};

/// The vocabulary of a SentencePiece model file's bytes. FormatError naming `where` for bytes
/// that are not a SentencePiece model (empty, truncated, another kind of file; a llama2.c
/// tokenizer.bin is named as one); UsageError when xgrad was built without SentencePiece.
/// Unlike load_tokenizer() it takes any model SentencePiece loads (no lossless-rule checks).
SentencePieceVocabulary read_sentencepiece_vocabulary(const std::string& bytes, const std::string& where);

/// llama2.c's tokenizer.bin (docs/llama.md) for a SentencePiece vocabulary, by the rules of
/// llama2.c's own converter (its tokenizer.py): for each id in order, the piece with every
/// U+2581 written as a space, except BOS and EOS, written as "\n<s>\n" and "\n</s>\n"; each
/// piece as its float32 score, its length (uint32) and its bytes, after a uint32 header with
/// the longest piece's length (max_token_length); all little-endian. FormatError naming
/// `where` for a vocabulary run.c cannot use: run.c takes id 1 as BOS and byte b as id b + 3,
/// so the model must have BOS at id 1, EOS at id 2 and the byte pieces <0x00>..<0xFF> at ids
/// 3..258 (SentencePiece's own layout when trained with byte_fallback, as `xgrad tokenizer
/// train` and llama2.c's scripts train).
std::string llama2c_tokenizer_bytes(const SentencePieceVocabulary& vocabulary, const std::string& where);

/// `xgrad tokenizer export --format llama2c MODEL OUT`: reads the SentencePiece model file
/// `model` (at most io::kTokenizerLimit bytes; errors as read_sentencepiece_vocabulary and
/// llama2c_tokenizer_bytes, UsageError for a missing file or a folder) and writes its
/// tokenizer.bin to `out` atomically (a temporary file renamed over `out`: a failure leaves no
/// part of a file; FormatError naming `out`). Returns the written file read back as a llama2c
/// tokenizer.
std::unique_ptr<Tokenizer> export_llama2c_tokenizer(const std::string& model, const std::string& out);

/// Options of train_sentencepiece() (`xgrad tokenizer train`).
struct TokenizerTrainOptions {
  /// The number of pieces, exactly: at least 260 (the 256 byte pieces, `<unk>`, `<s>`, `</s>`
  /// and at least one piece of text), at most 1048576; a UsageError names the largest the
  /// corpus supports when it gives fewer.
  std::size_t vocab_size = 1024;
  /// "bpe", "unigram" or "char".
  std::string model_type = "bpe";
  /// Must stay true: xgrad loads only models with byte fallback (the lossless rule needs the
  /// 256 byte pieces), so false is a UsageError.
  bool byte_fallback = true;
  /// Threads SentencePiece's trainer uses, 1 .. 128. The model depends on it: the same corpus
  /// and options give the same bytes, another thread count may give another model.
  int threads = 1;
  /// Which characters get a piece of their own (the others are written as byte pieces):
  /// 0 (automatic) keeps the most frequent ones, as many as half of the pieces left after the
  /// byte and control pieces (all of them for "char"); a fraction in (0, 1] keeps the fewest
  /// most frequent characters that make up at least that much of the text (UsageError when
  /// they need more pieces than the vocabulary has). xgrad chooses them itself and trains
  /// SentencePiece on the text cut at every other character, because SentencePiece's own
  /// character_coverage cannot go below 0.98.
  double character_coverage = 0;
  /// Training reads at most this many sentences (lines, split after each run of newlines and
  /// at 16 KiB), drawn at random with `seed` when the corpus has more; at least 1.
  std::size_t max_sentences = 1000000;
  /// Seeds the draw of sentences and SentencePiece's own random generator.
  std::uint64_t seed = 0;
};

/// Trains a SentencePiece model on the texts of `paths` (each a file or a folder, read as
/// read_corpus reads it) and writes it to `out` atomically (a temporary file,
/// fsync, rename). Returns a short report (pieces, corpus bytes, sentences, characters,
/// seconds) for the CLI.
///
/// Training settings, chosen so that the model never changes text: identity normalisation,
/// no dummy prefix, no removal of extra whitespace, byte fallback. The texts are pre-split as
/// encode() does (invalid UTF-8 and U+2581 are left out of training).
///
/// Errors: UsageError for a bad option (naming --vocab-size, --model-type, ...), a vocabulary
/// larger than the corpus supports (naming the largest that works), a missing path, a folder
/// without files, or `out` inside a corpus folder; ValueError for a file that looks binary
/// (a NUL byte, or more than a quarter of the bytes not UTF-8, in its first 64 KiB), a corpus
/// without text, or SentencePiece failing; FormatError when `out` cannot be written.
std::string train_sentencepiece(const std::vector<std::string>& paths, const TokenizerTrainOptions& options,
                                const std::string& out);

/// Why `text` does not look like text, judged by its first 64 KiB ("" when it does): a NUL
/// byte, or more than a quarter of the bytes not in valid UTF-8. The rule for the files of a
/// corpus (`xgrad tokenizer train`, `xgrad train --task text`).
std::string binary_reason(std::string_view text);

/// The ids written as text, separated by ASCII whitespace ("1 2 3"), as `xgrad tokenizer
/// decode` reads them: UsageError naming the id and `vocab_size` for a word that is not a
/// decimal integer or an id outside [0, vocab_size).
std::vector<std::int64_t> parse_token_ids(std::string_view text, std::size_t vocab_size);

}  // namespace xg::text
