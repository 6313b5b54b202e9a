#include <xgrad/text/corpus.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xgrad/core/error.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/input_file.hpp>

namespace xg::text {

namespace fs = std::filesystem;

namespace {

std::uint64_t fnv1a(const char* p, std::size_t n, std::uint64_t h = 1469598103934665603ull) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// The split's hash of a document name: FNV-1a, then mixed (MurmurHash3's finaliser) so that
// names that differ in their last characters spread over the whole range.
std::uint64_t split_hash(const std::string& name) {
  std::uint64_t h = fnv1a(name.data(), name.size());
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The first 64 KiB of a file must look like text (tokenizer.hpp's binary_reason).
void check_not_binary(const std::string& path, const std::string& head) {
  const std::string why = binary_reason(head);
  if (!why.empty())
    throw UsageError(op_message("train", "--text: " + path + " looks binary (" + why + "); give text files"));
}

std::string read_range(const std::string& path, std::uint64_t offset, std::uint64_t size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(op_message("train", "--text: cannot read " + path));
  in.seekg(static_cast<std::streamoff>(offset));
  std::string s(size, '\0');
  in.read(s.data(), static_cast<std::streamsize>(size));
  if (static_cast<std::uint64_t>(in.gcount()) != size)
    throw FormatError("[train] --text: " + path + " changed while it was read (shorter than " +
                      std::to_string(offset + size) + " bytes)");
  return s;
}

// Pieces of about `target` bytes of [offset, offset + size) of `path`, cut just after a '\n'
// when there is one in the last half of the piece.
template <class Fn>
void for_each_piece(const std::string& path, std::uint64_t offset, std::uint64_t size, std::uint64_t target, Fn fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(op_message("train", "--text: cannot read " + path));
  in.seekg(static_cast<std::streamoff>(offset));
  std::string carry;
  std::uint64_t left = size;
  std::string buf;
  while (left > 0 || !carry.empty()) {
    const std::uint64_t want = std::min<std::uint64_t>(left, target);
    buf.assign(want, '\0');
    in.read(buf.data(), static_cast<std::streamsize>(want));
    if (static_cast<std::uint64_t>(in.gcount()) != want)
      throw FormatError("[train] --text: " + path + " changed while it was read");
    left -= want;
    std::string piece = carry + buf;
    carry.clear();
    if (left > 0) {
      const std::size_t cut = piece.rfind('\n');
      if (cut != std::string::npos && cut + 1 >= piece.size() / 2) {
        carry = piece.substr(cut + 1);
        piece.resize(cut + 1);
      }
    }
    fn(piece);
    if (left == 0 && !carry.empty()) {
      fn(carry);
      carry.clear();
    }
  }
}

// The regular files under `dir` (symbolic links followed) into `files`, each file once. A link
// that leads back to a folder it is in (a loop the walk would follow forever) is a UsageError
// naming it; a folder reached twice by other links is walked once. Entries that are not regular
// files (FIFOs, devices, sockets, dangling links) are left out.
// p is dir or below it (both canonical).
bool inside(const fs::path& p, const fs::path& dir) {
  auto d = dir.begin(), q = p.begin();
  for (; d != dir.end(); ++d, ++q)
    if (q == p.end() || *q != *d) return false;
  return true;
}

// Collects the regular files below `dir` in sorted order, each once (by canonical path),
// leaving out the folder `skip` (canonical; "" for none: the run's own --out) and refusing
// symbolic-link loops by name.
void walk_folder(const std::string& arg, const fs::path& dir, const fs::path& skip,
                 std::vector<std::pair<dev_t, ino_t>>& open, std::set<std::pair<dev_t, ino_t>>& walked,
                 std::set<fs::path>& seen, std::vector<fs::path>& files) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0)
    throw UsageError(op_message("train", "--text '" + arg + "': cannot read the folder " + dir.string() + ": " +
                                             std::strerror(errno)));
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  if (std::find(open.begin(), open.end(), id) != open.end())
    throw UsageError(op_message("train", "--text '" + arg + "': " + dir.string() +
                                             " leads back to a folder it is in (a symbolic-link loop); remove the link"));
  if (!walked.insert(id).second) return;
  open.push_back(id);
  std::error_code ec;
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  if (ec)  // e.g. no permission to read it
    throw UsageError(op_message("train", "--text '" + arg + "': cannot list the folder " + dir.string() + ": " +
                                             ec.message()));
  std::sort(entries.begin(), entries.end());
  for (const fs::path& e : entries) {
    struct stat es;
    if (::stat(e.c_str(), &es) != 0) {
      if (errno == ELOOP)
        throw UsageError(op_message("train", "--text '" + arg + "': " + e.string() +
                                                 " is a loop of symbolic links; remove it"));
      continue;  // a dangling link
    }
    if (S_ISDIR(es.st_mode)) {
      std::error_code probe;
      if (!skip.empty() && fs::canonical(e, probe) == skip) continue;  // the run's own folder: not the text
      walk_folder(arg, e, skip, open, walked, seen, files);
    } else if (S_ISREG(es.st_mode)) {
      const fs::path canon = fs::canonical(e, ec);
      if (ec || (!skip.empty() && inside(canon, skip))) continue;  // reached through a link
      if (seen.insert(canon).second) files.push_back(e);
    }
  }
  open.pop_back();
}

constexpr char kMagic[6] = {'x', 'g', 't', 'o', 'k', '1'};
constexpr std::size_t kHeader = 6 + 2 + 8 + 8;  // magic, width (u16), count (u64), bytes (u64)

}  // namespace

std::string read_text(const std::string& path) {
  // A regular file of at most kTextLimit bytes: a FIFO or a device is refused by name.
  return io::read_input_file(path, io::kTextLimit, "[charlm] the text file");
}

std::vector<TextFile> read_corpus(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (!fs::exists(path, ec))
      throw ValueError(op_message("charlm", "cannot read the text file " + path +
                                                " (no such file or folder; pass --text FILE, a text file or a folder of them)"));
    return {{fs::path(path).filename().string(), read_text(path)}};
  }
  std::vector<std::pair<std::string, fs::path>> files;  // (name, resolved path)
  std::set<std::string> seen;
  fs::directory_iterator it(path, ec), end;
  if (ec)
    throw ValueError(op_message("charlm", "cannot read the text folder " + path + ": " + ec.message() +
                                              " (pass --text FILE)"));
  for (; it != end; it.increment(ec)) {
    if (ec) throw ValueError(op_message("charlm", "cannot list the text folder " + path + ": " + ec.message()));
    std::error_code e2;
    const fs::path target = fs::canonical(it->path(), e2);
    if (e2 || !fs::is_regular_file(target, e2)) continue;  // a dangling link, a subfolder, a device
    if (seen.insert(target.string()).second) files.emplace_back(target.filename().string(), target);
  }
  if (files.empty())
    throw ValueError(op_message("charlm", "the text folder " + path + " holds no files (pass --text FILE)"));
  std::sort(files.begin(), files.end());
  // The folder is read whole: its files together stay within the limit of one text.
  std::uint64_t total = 0;
  for (const auto& f : files) {
    std::error_code e2;
    const std::uintmax_t n = fs::file_size(f.second, e2);
    total += e2 ? 0 : static_cast<std::uint64_t>(n);
  }
  if (total > io::kTextLimit)
    throw UsageError(op_message("charlm", "the text folder " + path + " holds " + std::to_string(total) +
                                              " bytes, more than the limit of " + io::size_text(io::kTextLimit) +
                                              " for a text read whole"));
  std::vector<TextFile> corpus;
  for (const auto& f : files) corpus.push_back({f.first, read_text(f.second.string())});
  return corpus;
}

std::string fingerprint(const std::vector<TextFile>& corpus) {
  std::string out;
  for (const TextFile& f : corpus) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : f.text) h = (h ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    out += (out.empty() ? "" : ";") + f.name + ":" + std::to_string(f.text.size()) + ":" + hex;
  }
  return out;
}

std::vector<Document> list_documents(const std::string& path, const std::string& exclude) {
  std::error_code ec;
  if (path.empty()) throw UsageError(op_message("train", "--text needs a file or a folder, got ''"));
  if (!fs::exists(path, ec)) throw UsageError(op_message("train", "--text '" + path + "' does not exist"));
  std::vector<fs::path> files;
  const fs::path root(path);
  // The excluded folder, canonical, when it exists ("" otherwise: nothing of it to read).
  fs::path skip;
  if (!exclude.empty() && fs::is_directory(exclude, ec)) skip = fs::canonical(exclude, ec);
  if (fs::is_directory(root, ec)) {
    if (!skip.empty() && inside(fs::canonical(root, ec), skip))
      throw UsageError(op_message("train", "--text '" + shown_value(path) + "' is the output folder --out '" +
                                               shown_value(exclude) + "' or inside it; give the text's own folder"));
    std::set<fs::path> seen;
    std::set<std::pair<dev_t, ino_t>> walked;
    std::vector<std::pair<dev_t, ino_t>> open;
    walk_folder(path, root, skip, open, walked, seen, files);
    std::sort(files.begin(), files.end());
    if (files.empty()) throw UsageError(op_message("train", "--text '" + path + "' is a folder without files"));
  } else {
    // A FIFO or a device is refused by name: it has no size, and opening a FIFO waits.
    io::require_input_file(path, "[train] --text");
    files.push_back(root);
  }
  std::vector<std::uint64_t> sizes;
  std::uint64_t total = 0;
  for (const fs::path& f : files) {
    sizes.push_back(fs::file_size(f, ec));
    if (ec) throw UsageError(op_message("train", "--text: cannot read " + f.string()));
    total += sizes.back();
  }
  // Documents of about a twentieth of the corpus (at least 4 KiB, at most kDocumentBytes), so
  // that even a corpus of one file splits into training and validation documents.
  const std::uint64_t piece = std::clamp<std::uint64_t>(total / 20, 4096, kDocumentBytes);
  std::vector<Document> docs;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const fs::path& f = files[i];
    const std::string p = f.string();
    const std::uint64_t size = sizes[i];
    if (size == 0) continue;
    check_not_binary(p, read_range(p, 0, std::min<std::uint64_t>(size, 65536)));
    const std::string rel = fs::is_directory(root, ec) ? fs::relative(f, root, ec).string() : f.filename().string();
    std::uint64_t k = 0, at = 0;
    for_each_piece(p, 0, size, piece, [&](const std::string& text) {
      docs.push_back({p, k == 0 ? rel : rel + "#" + std::to_string(k), at, text.size()});
      at += text.size();
      ++k;
    });
  }
  if (docs.empty()) throw UsageError(op_message("train", "--text '" + path + "' holds no text (only empty files)"));
  return docs;
}

std::string read_document(const Document& doc) { return read_range(doc.path, doc.offset, doc.size); }

bool in_validation(const Document& doc, double fraction) {
  const std::uint64_t h = split_hash(doc.name);
  return static_cast<double>(h >> 11) / 9007199254740992.0 < fraction;  // 53 bits in [0, 1)
}

void split_documents(const std::vector<Document>& docs, double fraction, std::vector<Document>& train,
                     std::vector<Document>& validation) {
  if (docs.size() < 2)
    throw UsageError(op_message("train", "--text: the corpus is one document (" + docs.front().name +
                                             ", " + std::to_string(docs.front().size) +
                                             " bytes); a validation split needs at least two: give more text"));
  train.clear();
  validation.clear();
  for (const Document& d : docs) (in_validation(d, fraction) ? validation : train).push_back(d);
  auto h = [](const Document& d) { return split_hash(d.name); };
  if (validation.empty()) {  // the document closest to the validation side moves there
    auto it = std::min_element(train.begin(), train.end(), [&](const Document& a, const Document& b) { return h(a) < h(b); });
    validation.push_back(*it);
    train.erase(it);
  } else if (train.empty()) {
    auto it = std::max_element(validation.begin(), validation.end(),
                               [&](const Document& a, const Document& b) { return h(a) < h(b); });
    train.push_back(*it);
    validation.erase(it);
  }
}

std::string corpus_fingerprint(const std::vector<Document>& docs) {
  std::string out;
  for (const Document& d : docs) {
    const std::string text = read_document(d);
    out += (out.empty() ? "" : ";") + d.name + ":" + std::to_string(d.size) + ":" + hex(fnv1a(text.data(), text.size()));
  }
  return out;
}

TokenFile::TokenFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw FormatError("[train] cannot open the token file " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) < kHeader) {
    ::close(fd);
    throw FormatError("[train] " + path + ": not a token file (shorter than its header)");
  }
  mapped_ = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, mapped_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw FormatError("[train] cannot map the token file " + path + ": " + std::strerror(errno));
  data_ = static_cast<const unsigned char*>(p);
  std::uint16_t width = 0;
  std::memcpy(&width, data_ + 6, 2);
  std::memcpy(&count_, data_ + 8, 8);
  std::memcpy(&bytes_, data_ + 16, 8);
  width_ = width;
  if (std::memcmp(data_, kMagic, 6) != 0 || (width_ != 1 && width_ != 2 && width_ != 4) ||
      count_ > (mapped_ - kHeader) / static_cast<std::uint64_t>(width_) ||
      kHeader + count_ * static_cast<std::uint64_t>(width_) != mapped_) {
    ::munmap(const_cast<unsigned char*>(data_), mapped_);
    data_ = nullptr;
    throw FormatError("[train] " + path + ": not a token file of this xgrad (header or size)");
  }
}

TokenFile::TokenFile(std::vector<std::uint32_t> ids, std::uint64_t bytes)
    : held_(std::move(ids)), count_(held_.size()), bytes_(bytes) {}

TokenFile::~TokenFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), mapped_);
}

std::uint32_t TokenFile::operator[](std::uint64_t i) const {
  if (!data_) return held_[i];
  const unsigned char* p = data_ + kHeader + i * static_cast<std::uint64_t>(width_);
  if (width_ == 1) return p[0];
  if (width_ == 2) return static_cast<std::uint32_t>(p[0] | (p[1] << 8));
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

std::vector<std::uint32_t> TokenFile::all() const {
  if (!data_) return held_;
  std::vector<std::uint32_t> out(count_);
  for (std::uint64_t i = 0; i < count_; ++i) out[i] = (*this)[i];
  return out;
}

std::string doc_separator_name(DocSeparator s) {
  return s == DocSeparator::bos ? "bos" : s == DocSeparator::eos ? "eos" : "none";
}

DocSeparator doc_separator_from_name(const std::string& name, const std::string& where) {
  if (name == "none") return DocSeparator::none;
  if (name == "bos") return DocSeparator::bos;
  if (name == "eos") return DocSeparator::eos;
  throw FormatError(where + ": document separator '" + name + "' is not bos, eos or none");
}

std::int64_t doc_separator_id(DocSeparator s, const Tokenizer& tok, const std::string& tokenizer, const std::string& op) {
  if (s == DocSeparator::none) return -1;
  const std::int64_t id = s == DocSeparator::bos ? tok.bos_id() : tok.eos_id();
  if (id < 0)
    throw UsageError(op_message(op, "--doc-separator " + doc_separator_name(s) + ": the tokenizer " + tokenizer +
                                        (tokenizer == "bytes" ? std::string() : " (" + tok.description() + ")") +
                                        " has no " + (s == DocSeparator::bos ? "BOS" : "EOS") +
                                        " token; use --doc-separator none (documents joined with nothing between) "
                                        "or a tokenizer with one"));
  if (static_cast<std::uint64_t>(id) >= tok.vocab_size())
    throw FormatError(op_message(op, "the tokenizer " + tokenizer + ": its " + doc_separator_name(s) + " id " +
                                         std::to_string(id) + " is outside its vocabulary of " +
                                         std::to_string(tok.vocab_size())));
  return id;
}

DocSeparator saved_doc_separator(const io::safetensors::Metadata& meta, const Tokenizer& tok, const std::string& path,
                                 std::int64_t& id) {
  id = -1;
  const auto it = meta.find("doc_separator");
  if (it == meta.end()) return DocSeparator::none;
  const std::string where = path + ": metadata 'doc_separator'";
  const DocSeparator s = doc_separator_from_name(it->second, where);
  if (s == DocSeparator::none) return s;
  id = s == DocSeparator::bos ? tok.bos_id() : tok.eos_id();
  if (id < 0 || static_cast<std::uint64_t>(id) >= tok.vocab_size())
    throw FormatError(where + " is " + it->second + ", but the checkpoint's tokenizer (" + tok.description() +
                      ") has no such token");
  return s;
}

void add_document_ids(std::vector<std::uint32_t>& stream, const std::vector<std::int64_t>& ids, DocSeparator s,
                      std::int64_t id) {
  if (s == DocSeparator::bos) stream.push_back(static_cast<std::uint32_t>(id));
  for (std::int64_t t : ids) stream.push_back(static_cast<std::uint32_t>(t));
  if (s == DocSeparator::eos) stream.push_back(static_cast<std::uint32_t>(id));
}

std::uint64_t tokenize_documents(const std::vector<Document>& docs, const Tokenizer& tok, const std::string& out,
                                 DocSeparator sep, std::int64_t sep_id) {
  const std::unique_ptr<io::AtomicFile> f = tokenize_documents_pending(docs, tok, out, sep, sep_id);
  const TokenFile written(f->temporary_path());
  const std::uint64_t count = written.size();
  f->commit();
  return count;
}

std::unique_ptr<io::AtomicFile> tokenize_documents_pending(const std::vector<Document>& docs, const Tokenizer& tok,
                                                           const std::string& out, DocSeparator sep,
                                                           std::int64_t sep_id) {
  if (sep != DocSeparator::none && (sep_id < 0 || static_cast<std::uint64_t>(sep_id) >= tok.vocab_size()))
    throw ValueError(op_message("train", "document separator " + doc_separator_name(sep) + " with the id " +
                                             std::to_string(sep_id) + ", outside the vocabulary of " +
                                             std::to_string(tok.vocab_size())));
  const std::uint16_t width = tok.vocab_size() <= 256 ? 1 : tok.vocab_size() <= 65536 ? 2 : 4;
  // An exception below removes the temporary file (the AtomicFile's destructor).
  auto file = std::make_unique<io::AtomicFile>(out, "[train] " + out + ": ");
  io::AtomicFile& f = *file;
  std::uint64_t count = 0, bytes = 0;
  f.write(kMagic, 6);
  f.write(&width, 2);
  f.write(&count, 8);  // the counts, patched below
  f.write(&bytes, 8);
  std::vector<unsigned char> packed;
  const auto put = [&](const std::vector<std::int64_t>& ids) {
    packed.resize(ids.size() * width);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto v = static_cast<std::uint32_t>(ids[i]);
      for (std::uint16_t b = 0; b < width; ++b) packed[i * width + b] = static_cast<unsigned char>(v >> (8 * b));
    }
    f.write(packed.data(), packed.size());
    count += ids.size();
  };
  // add_document_ids' rule, written piece by piece: the separator before (bos) or after (eos)
  // each document's ids.
  for (const Document& d : docs) {
    if (sep == DocSeparator::bos) put({sep_id});
    for_each_piece(d.path, d.offset, d.size, 1 << 20, [&](const std::string& piece) {
      put(tok.encode(piece));
      bytes += piece.size();
    });
    if (sep == DocSeparator::eos) put({sep_id});
  }
  if (std::fseek(f.stream(), 8, SEEK_SET) != 0) f.fail();
  f.write(&count, 8);
  f.write(&bytes, 8);
  f.flush();
  return file;
}

io::safetensors::Metadata tokenizer_metadata(const Tokenizer& tok) {
  return {{"tokenizer", tok.kind()}, {"tokenizer_sha256", tok.digest()}, {"tokenizer_model", base64_encode(tok.serialized())}};
}

std::unique_ptr<Tokenizer> tokenizer_of_metadata(const io::safetensors::Metadata& meta, const std::string& path) {
  auto get = [&](const char* k) {
    const auto it = meta.find(k);
    if (it == meta.end()) throw FormatError("[checkpoint] " + path + ": metadata lacks '" + k + "' (no tokenizer)");
    return it->second;
  };
  const std::string where = "[checkpoint] " + path + ": metadata 'tokenizer_model'";
  std::unique_ptr<Tokenizer> tok = tokenizer_from_serialized(get("tokenizer"), base64_decode(get("tokenizer_model"), where), where);
  if (tok->digest() != get("tokenizer_sha256"))
    throw FormatError("[checkpoint] " + path + ": the embedded tokenizer's sha256 is " + tok->digest() +
                      ", metadata 'tokenizer_sha256' says " + get("tokenizer_sha256"));
  return tok;
}

ValidationWindows validation_windows(std::uint64_t tokens, std::size_t context, std::size_t max_windows) {
  ValidationWindows w;
  w.context = context;
  if (tokens < 2 || context == 0 || max_windows == 0) return w;
  const std::uint64_t all = (tokens - 1 + context - 1) / context;  // windows that cover every target
  const std::uint64_t n = std::min<std::uint64_t>(all, max_windows);
  for (std::uint64_t k = 0; k < n; ++k) w.starts.push_back((k * all / n) * context);
  return w;
}

std::string printable(const std::string& bytes) {
  std::string out;
  auto escape = [&](unsigned char c) {
    static const char* hex = "0123456789ABCDEF";
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
  };
  const std::size_t n = bytes.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) escape(c);
      else out += static_cast<char>(c);
      ++i;
      continue;
    }
    // The length of a well-formed UTF-8 sequence starting here (RFC 3629: no overlong forms,
    // no surrogates, nothing above U+10FFFF), or 0.
    std::size_t len = 0;
    auto cont = [&](std::size_t k) { return i + k < n && (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80; };
    const unsigned char c1 = i + 1 < n ? static_cast<unsigned char>(bytes[i + 1]) : 0;
    if (c >= 0xC2 && c <= 0xDF && cont(1)) len = 2;
    else if (c == 0xE0 && cont(1) && c1 >= 0xA0 && cont(2)) len = 3;
    else if (((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) && cont(1) && cont(2)) len = 3;
    else if (c == 0xED && cont(1) && c1 < 0xA0 && cont(2)) len = 3;
    else if (c == 0xF0 && cont(1) && c1 >= 0x90 && cont(2) && cont(3)) len = 4;
    else if (c >= 0xF1 && c <= 0xF3 && cont(1) && cont(2) && cont(3)) len = 4;
    else if (c == 0xF4 && cont(1) && c1 < 0x90 && cont(2) && cont(3)) len = 4;
    if (len == 0) {
      escape(c);
      ++i;
    } else {
      out.append(bytes, i, len);
      i += len;
    }
  }
  return out;
}

std::string base64_encode(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::uint32_t b0 = static_cast<unsigned char>(bytes[i]);
    const std::uint32_t b1 = i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) : 0;
    const std::uint32_t b2 = i + 2 < bytes.size() ? static_cast<unsigned char>(bytes[i + 2]) : 0;
    const std::uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

std::string base64_decode(const std::string& text, const std::string& where) {
  auto value = [&](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (text.size() % 4 != 0) throw FormatError(where + ": not base64 (length " + std::to_string(text.size()) + ")");
  std::string out;
  for (std::size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=' && text[i + 3] == '=') : 0;
    int v[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = k >= 4 - pad ? 0 : value(text[i + static_cast<std::size_t>(k)]);
      if (v[k] < 0) throw FormatError(where + ": not base64 (character at " + std::to_string(i + static_cast<std::size_t>(k)) + ")");
    }
    const std::uint32_t w = (static_cast<std::uint32_t>(v[0]) << 18) | (static_cast<std::uint32_t>(v[1]) << 12) |
                            (static_cast<std::uint32_t>(v[2]) << 6) | static_cast<std::uint32_t>(v[3]);
    out += static_cast<char>((w >> 16) & 255);
    if (pad < 2) out += static_cast<char>((w >> 8) & 255);
    if (pad < 1) out += static_cast<char>(w & 255);
  }
  return out;
}

}  // namespace xg::text
