/// \file
/// A corpus of the user's own text for `xgrad train --task text` and `xgrad eval`: its
/// documents, a deterministic document-level train/validation split, the corpus tokenised once
/// into a token file read through a memory map (like nanoGPT's train.bin), the tokenizer a
/// checkpoint carries, and the validation windows both commands share (the measure through a
/// model is train/evaluation.hpp's). Also the texts of a character-level corpus (TextFile).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/safetensors.hpp>
#include <xgrad/text/tokenizer.hpp>

namespace xg::text {

/// One text of a character-level corpus: its file name (without folder) and its bytes.
struct TextFile {
  std::string name;  ///< The file name, without folder.
  std::string text;  ///< The file's bytes.
};
/// The bytes of the file at `path` (a regular file of at most io::kTextLimit bytes);
/// ValueError if unreadable (or a folder).
std::string read_text(const std::string& path);
/// `path` a file: that file. A folder: every regular file in it (symbolic links resolved,
/// a file reached by several names read once, under its own name), sorted by name.
/// ValueError naming the path if it is missing, unreadable or a folder without files.
std::vector<TextFile> read_corpus(const std::string& path);
/// "name:bytes:checksum" per text, joined by ";" (FNV-1a 64, hex): saved with a run so that
/// resume can tell that the corpus changed.
std::string fingerprint(const std::vector<TextFile>& corpus);

/// One document: a whole file, or a piece of a large one cut at a line end.
struct Document {
  std::string path;      ///< The file it comes from.
  std::string name;      ///< The file's path relative to the corpus root, "#k" for its k-th piece (k > 0).
  std::uint64_t offset = 0;  ///< Where it starts in the file (bytes).
  std::uint64_t size = 0;    ///< Its length in bytes.
};

/// Files are cut at line ends into documents of about a twentieth of the corpus, at least
/// 4 KiB and at most this, so that a corpus of one file still splits into training and
/// validation documents.
constexpr std::uint64_t kDocumentBytes = 1 << 20;

/// The documents under `path` (a file, or a folder: every regular file below it, recursively,
/// in path order; symbolic links followed, a file reached twice read once). UsageError naming
/// the path when it does not exist, is a folder without files, or holds only empty files; a
/// file that looks binary (a NUL byte, or more than 10% of its first 64 KiB not UTF-8) is a
/// UsageError naming it.
///
/// `exclude` (a run's output folder, or ""): when it is inside the folder `path`, nothing in it
/// is read (the run's own token files, logs and checkpoints are not its text); when `path` is
/// that folder or inside it, UsageError.
std::vector<Document> list_documents(const std::string& path, const std::string& exclude = "");

/// The bytes of `doc` (FormatError if its file changed since it was listed).
std::string read_document(const Document& doc);

/// True when `doc` belongs to the validation split: a hash of its name below `fraction`
/// (deterministic: the same corpus always splits the same way).
bool in_validation(const Document& doc, double fraction);

/// The documents of each split. When the hash puts every document on one side, the one whose
/// hash is closest to the other side moves over, so both splits have one (with two or more).
/// UsageError when the corpus has a single document.
void split_documents(const std::vector<Document>& docs, double fraction, std::vector<Document>& train,
                     std::vector<Document>& validation);

/// "name:bytes:checksum" per document file (FNV-1a 64 of its bytes, hex), joined by ";": saved
/// with a run so that --resume can tell that the corpus changed.
std::string corpus_fingerprint(const std::vector<Document>& docs);

/// How the documents of a corpus are joined into one token stream (`--doc-separator`): with
/// nothing between them (none: xgrad before 0.3, and the byte tokenizer's only choice), with
/// the tokenizer's BOS before every document (bos: as llama2.c's and TinyStories' models are
/// trained, each story starting with BOS), or with its EOS after every document (eos). Either
/// way a window of the stream that crosses from one document into the next holds the separator.
enum class DocSeparator {
  none,  ///< Documents follow one another with nothing between.
  bos,   ///< The tokenizer's BOS before every document.
  eos,   ///< The tokenizer's EOS after every document.
};
/// "none", "bos", "eos".
std::string doc_separator_name(DocSeparator s);
/// The separator of its name; FormatError naming `where` for another text (a damaged checkpoint).
DocSeparator doc_separator_from_name(const std::string& name, const std::string& where);
/// The token id of separator `s` with `tok` (-1 for none). UsageError starting with `op` and
/// naming the tokenizer (`tokenizer`: how the user named it) when it has no such token (the byte
/// tokenizer has neither BOS nor EOS).
std::int64_t doc_separator_id(DocSeparator s, const Tokenizer& tok, const std::string& tokenizer, const std::string& op);
/// The ids of one document in the stream: `ids` (its text's ids) with the separator's id
/// `id` before them (bos) or after them (eos); `ids` alone for none.
void add_document_ids(std::vector<std::uint32_t>& stream, const std::vector<std::int64_t>& ids, DocSeparator s,
                      std::int64_t id);

/// The separator a text model's checkpoint metadata `meta` records (key "doc_separator", written
/// by `xgrad train` when not none; absent: none, as models saved before the option were
/// trained), with its id in `tok` (the checkpoint's tokenizer; -1 for none) in `id`.
/// FormatError naming `path` for another value or a token the tokenizer lacks.
DocSeparator saved_doc_separator(const io::safetensors::Metadata& meta, const Tokenizer& tok, const std::string& path,
                                 std::int64_t& id);

/// Token ids in a file: 1, 2 or 4 bytes each (little-endian), as the vocabulary needs.
class TokenFile {
 public:
  /// Opens (memory-maps) a token file written by tokenize_documents; FormatError naming it if
  /// it is not one (a header "xgtok1", width, count, bytes; the ids after it).
  explicit TokenFile(const std::string& path);
  /// The same data held in memory (a rank that received the tokens by broadcast).
  TokenFile(std::vector<std::uint32_t> ids, std::uint64_t bytes);
  TokenFile(const TokenFile&) = delete;             ///< One mapping, one owner.
  TokenFile& operator=(const TokenFile&) = delete;  ///< One mapping, one owner.
  ~TokenFile();                                     ///< Unmaps the file.
  /// The number of tokens.
  std::uint64_t size() const { return count_; }
  /// The bytes of text they encode.
  std::uint64_t bytes() const { return bytes_; }
  /// Token i (i < size()).
  std::uint32_t operator[](std::uint64_t i) const;
  /// Every id, in memory (for a broadcast to other ranks).
  std::vector<std::uint32_t> all() const;

 private:
  const unsigned char* data_ = nullptr;
  std::size_t mapped_ = 0;
  std::vector<std::uint32_t> held_;
  std::uint64_t count_ = 0, bytes_ = 0;
  int width_ = 4;
};

/// Tokenises `docs` (one after the other, joined by `sep`, whose id is `sep_id`:
/// add_document_ids' rule) into the token file `out` (written atomically), reading each
/// document in pieces of about 1 MiB cut at line ends, so a large corpus is never held in
/// memory. Returns the number of tokens. The bytes the file counts are the documents' bytes
/// (a separator stands for none).
std::uint64_t tokenize_documents(const std::vector<Document>& docs, const Tokenizer& tok, const std::string& out,
                                 DocSeparator sep = DocSeparator::none, std::int64_t sep_id = -1);

/// The same, left uncommitted: the tokens are in the returned file's temporary file (flushed,
/// readable through TokenFile), and `out` is untouched until the caller commits it (a refused
/// run then leaves its folder as it was). The file is removed if it is never committed.
std::unique_ptr<io::AtomicFile> tokenize_documents_pending(const std::vector<Document>& docs, const Tokenizer& tok,
                                                           const std::string& out,
                                                           DocSeparator sep = DocSeparator::none,
                                                           std::int64_t sep_id = -1);

/// The metadata a checkpoint carries about its tokenizer: "tokenizer" (its kind),
/// "tokenizer_sha256" and "tokenizer_model" (the model file's bytes, base64; empty for bytes).
io::safetensors::Metadata tokenizer_metadata(const Tokenizer& tok);
/// The tokenizer of checkpoint metadata `meta` (FormatError naming `path` if it lacks one, or
/// its bytes do not match its digest).
std::unique_ptr<Tokenizer> tokenizer_of_metadata(const io::safetensors::Metadata& meta, const std::string& path);

/// The validation measure: the tokens of a text cut into windows of `context` + 1 (each window
/// predicts its last `context` tokens from the ones before, so every token after the first is a
/// target once), at most `max_windows` windows evenly spread over the text.
struct ValidationWindows {
  std::vector<std::uint64_t> starts;  ///< The first token of each window.
  std::size_t context = 0;            ///< Targets per full window.
};
/// Validation evaluates at most this many windows (evenly spread over the validation text), so
/// that an evaluation costs the same on a 10 MB and a 100 MB corpus.
constexpr std::size_t kMaxValidationWindows = 2048;
/// The windows over `tokens` tokens.
ValidationWindows validation_windows(std::uint64_t tokens, std::size_t context, std::size_t max_windows);

/// base64 (RFC 4648, with padding) of `bytes`, and back (FormatError naming `where` for text
/// that is not base64).
/// @{
/// `bytes` for a terminal: valid UTF-8, line breaks and tabs as they are; any other control
/// character, DEL and every byte that is not part of valid UTF-8 as a visible `\xNN`. Samples
/// of a byte-level model that has not learned UTF-8 yet print this way (no escape sequence
/// reaches the terminal, and the output stays valid UTF-8).
std::string printable(const std::string& bytes);
std::string base64_encode(const std::string& bytes);
std::string base64_decode(const std::string& text, const std::string& where);
/// @}

}  // namespace xg::text
