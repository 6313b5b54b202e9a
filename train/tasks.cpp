#include <xgrad/train/tasks.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <xgrad/core/error.hpp>

namespace xg::train {

std::int64_t Vocabulary::id(const std::string& t) const {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == t) return static_cast<std::int64_t>(i);
  throw ValueError(op_message("vocabulary", "unknown token '" + t + "'"));
}

std::string Vocabulary::decode(const std::vector<std::int64_t>& ids) const {
  std::string s;
  for (std::int64_t i : ids) {
    if (i < 0 || static_cast<std::size_t>(i) >= tokens.size())
      throw ValueError(op_message("vocabulary", "id " + std::to_string(i) + " outside the vocabulary of " +
                                                    std::to_string(tokens.size())));
    s += tokens[static_cast<std::size_t>(i)];
  }
  return s;
}

// A token that is valid UTF-8 is a JSON string; any other token (a byte of a multi-byte
// character, for charlm on any text) is an array of its byte values: lossless either way.
std::string Vocabulary::to_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (const std::string& t : tokens) {
    try {
      (void)nlohmann::json(t).dump();
      a.push_back(t);
    } catch (const nlohmann::json::exception&) {
      nlohmann::json bytes = nlohmann::json::array();
      for (unsigned char c : t) bytes.push_back(static_cast<int>(c));
      a.push_back(bytes);
    }
  }
  return a.dump();
}

Vocabulary Vocabulary::from_json(const std::string& text) {
  const std::string what = "not a JSON array of tokens (strings or arrays of byte values 0..255)";
  Vocabulary v;
  nlohmann::json a;
  try {
    a = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(op_message("vocabulary", what + ": " + e.what()));
  }
  if (!a.is_array()) throw FormatError(op_message("vocabulary", what));
  for (const auto& t : a) {
    if (t.is_string()) {
      v.tokens.push_back(t.get<std::string>());
      continue;
    }
    if (!t.is_array() || t.empty()) throw FormatError(op_message("vocabulary", what + ": entry " + t.dump()));
    std::string bytes;
    for (const auto& b : t) {
      if (!b.is_number_unsigned() || b.get<std::uint64_t>() > 255)
        throw FormatError(op_message("vocabulary", what + ": entry " + t.dump()));
      bytes.push_back(static_cast<char>(b.get<std::uint64_t>()));
    }
    v.tokens.push_back(bytes);
  }
  return v;
}

// ---------------------------------------------------------------------------------------

namespace {

// Draws `count` distinct items. The space must hold at least twice as many (so that training
// keeps at least half of all problems and the loop ends quickly), and the loop is bounded.
template <class Draw>
std::vector<std::vector<std::int64_t>> distinct(const std::string& op, std::size_t count, double space,
                                                const std::string& what, Draw draw) {
  if (2.0 * static_cast<double>(count) > space)
    throw ValueError(op_message(op, what + " give only " + std::to_string(static_cast<long long>(space)) +
                                        " distinct problems; a held-out set of " + std::to_string(count) +
                                        " needs at least " + std::to_string(2 * count) +
                                        " (half of them stay for training)"));
  std::set<std::vector<std::int64_t>> seen;
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t tries = 0; out.size() < count; ++tries) {
    if (tries > 1000 * count + 1000)
      throw InternalError(op_message(op, "could not draw " + std::to_string(count) + " distinct held-out problems"));
    auto d = draw();
    if (seen.insert(d).second) out.push_back(d);
  }
  return out;
}

// Redraws while `excluded` holds the sample; bounded (the held-out set is at most half of all).
template <class Draw>
std::vector<std::int64_t> not_excluded(const std::string& op, const std::vector<std::vector<std::int64_t>>& excluded,
                                       Draw draw) {
  for (int tries = 0; tries < 100000; ++tries) {
    auto d = draw();
    if (!std::binary_search(excluded.begin(), excluded.end(), d)) return d;
  }
  throw InternalError(op_message(op, "100000 draws in a row were held-out problems"));
}

}  // namespace

SortTask::SortTask(std::size_t n_digits, std::size_t n_values) : n_(n_digits), values_(n_values) {
  if (n_ == 0 || values_ < 2 || values_ > 10)
    throw ValueError(op_message("sort_task", "needs n_digits >= 1 and 2 <= n_values <= 10"));
  for (std::size_t v = 0; v < values_; ++v) vocab_.tokens.push_back(std::to_string(v));
  vocab_.tokens.push_back("|");
}

std::vector<std::int64_t> SortTask::sample_digits(Generator& gen) const {
  std::vector<std::int64_t> d(n_);
  for (auto& x : d) x = static_cast<std::int64_t>(gen.below(values_));
  return d;
}

std::vector<std::int64_t> SortTask::answer(const std::vector<std::int64_t>& digits) const {
  std::vector<std::int64_t> s = digits;
  std::sort(s.begin(), s.end());
  return s;
}

std::vector<std::int64_t> SortTask::prompt(const std::vector<std::int64_t>& digits) const {
  std::vector<std::int64_t> p = digits;
  p.push_back(sep());
  return p;
}

void SortTask::exclude(const std::vector<std::vector<std::int64_t>>& h) {
  excluded_ = h;
  std::sort(excluded_.begin(), excluded_.end());
}

LMBatch SortTask::batch(std::size_t B, Generator& gen) const {
  const std::size_t T = 2 * n_;  // the full sequence has 2n + 1 tokens; inputs drop the last
  LMBatch b{IndexArray({B, T}, std::vector<std::int64_t>(B * T)), IndexArray({B, T}, std::vector<std::int64_t>(B * T))};
  for (std::size_t s = 0; s < B; ++s) {
    const std::vector<std::int64_t> d = not_excluded("sort_task", excluded_, [&] { return sample_digits(gen); });
    std::vector<std::int64_t> seq = prompt(d);
    for (std::int64_t x : answer(d)) seq.push_back(x);
    for (std::size_t t = 0; t < T; ++t) {
      b.tokens.data[s * T + t] = seq[t];
      b.targets.data[s * T + t] = t + 1 > n_ ? seq[t + 1] : kIgnore;  // loss on the sorted half only
    }
  }
  return b;
}


std::vector<std::vector<std::int64_t>> SortTask::heldout(std::size_t count, std::uint64_t seed) const {
  Generator gen(seed);
  return distinct("sort_task", count, std::pow(static_cast<double>(values_), static_cast<double>(n_)),
                  std::to_string(n_) + " digits of " + std::to_string(values_) + " values",
                  [&] { return sample_digits(gen); });
}

// ---------------------------------------------------------------------------------------

ReverseTask::ReverseTask(std::size_t min_len, std::size_t max_len) : min_len_(min_len), max_len_(max_len) {
  if (min_len_ == 0 || max_len_ < min_len_)
    throw ValueError(op_message("reverse_task", "needs 1 <= min_len <= max_len"));
  for (int v = 0; v < 10; ++v) vocab_.tokens.push_back(std::to_string(v));
  vocab_.tokens.insert(vocab_.tokens.end(), {"_", "<", ">"});  // PAD, BOS, EOS
}

std::vector<std::int64_t> ReverseTask::sample(Generator& gen) const {
  const std::size_t len = min_len_ + gen.below(max_len_ - min_len_ + 1);
  std::vector<std::int64_t> s(len);
  for (auto& x : s) x = static_cast<std::int64_t>(gen.below(10));
  return s;
}

void ReverseTask::exclude(const std::vector<std::vector<std::int64_t>>& h) {
  excluded_ = h;
  std::sort(excluded_.begin(), excluded_.end());
}

Seq2SeqBatch ReverseTask::make_batch(const std::vector<std::vector<std::int64_t>>& sources) const {
  const std::size_t B = sources.size(), S = max_len_, T = max_len_ + 1;
  Seq2SeqBatch b{IndexArray({B, S}, std::vector<std::int64_t>(B * S, pad())), {},
                 IndexArray({B, T}, std::vector<std::int64_t>(B * T, pad())),
                 IndexArray({B, T}, std::vector<std::int64_t>(B * T, kIgnore))};
  for (std::size_t s = 0; s < B; ++s) {
    const auto& src = sources[s];
    b.src_lengths.push_back(src.size());
    for (std::size_t j = 0; j < src.size(); ++j) b.src.data[s * S + j] = src[j];
    std::vector<std::int64_t> rev(src.rbegin(), src.rend());
    b.tgt_in.data[s * T] = bos();
    for (std::size_t j = 0; j < rev.size(); ++j) {
      b.tgt_in.data[s * T + j + 1] = rev[j];
      b.tgt_out.data[s * T + j] = rev[j];
    }
    b.tgt_out.data[s * T + rev.size()] = eos();
  }
  return b;
}

Seq2SeqBatch ReverseTask::batch(std::size_t B, Generator& gen) const {
  std::vector<std::vector<std::int64_t>> sources;
  while (sources.size() < B) sources.push_back(not_excluded("reverse_task", excluded_, [&] { return sample(gen); }));
  return make_batch(sources);
}

std::vector<std::vector<std::int64_t>> ReverseTask::heldout(std::size_t count, std::uint64_t seed) const {
  Generator gen(seed);
  // Lengths are drawn uniformly: the shortest length alone must not run out, so count the
  // space as (number of lengths) x (problems of the shortest length).
  const double space = static_cast<double>(max_len_ - min_len_ + 1) * std::pow(10.0, static_cast<double>(min_len_));
  return distinct("reverse_task", count, space,
                  "lengths " + std::to_string(min_len_) + ".." + std::to_string(max_len_) + " of 10 values",
                  [&] { return sample(gen); });
}

// ---------------------------------------------------------------------------------------

std::string CharLMTask::read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  if (!in || std::filesystem::is_directory(path, ec))
    throw ValueError(op_message("charlm", "cannot read the text file " + path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

CharLMTask::CharLMTask(const std::string& path, std::size_t context) : CharLMTask(path, context, read_corpus(path)) {}

CharLMTask::CharLMTask(const std::string& path, std::size_t context, const std::string& text)
    : CharLMTask(path, context, std::vector<TextFile>{{std::filesystem::path(path).filename().string(), text}}) {}

CharLMTask::CharLMTask(const std::string& path, std::size_t context, const std::vector<TextFile>& corpus)
    : context_(context) {
  std::size_t total = 0;
  for (const TextFile& f : corpus) total += f.text.size();
  if (total < 20 * (context + 1))
    throw ValueError(op_message("charlm", path + " has " + std::to_string(total) + " bytes; need at least " +
                                              std::to_string(20 * (context + 1)) + " for context " +
                                              std::to_string(context)));
  std::set<unsigned char> chars;
  for (const TextFile& f : corpus) chars.insert(f.text.begin(), f.text.end());
  for (unsigned char c : chars) vocab_.tokens.push_back(std::string(1, static_cast<char>(c)));
  // The tail of every text: validation then reads the same kinds of text as training.
  for (const TextFile& f : corpus) {
    const auto ids = encode(f.text);
    const std::size_t split = ids.size() * 9 / 10;
    train_.insert(train_.end(), ids.begin(), ids.begin() + static_cast<long>(split));
    val_.insert(val_.end(), ids.begin() + static_cast<long>(split), ids.end());
  }
  if (val_.size() < context + 2)
    throw ValueError(op_message("charlm", path + ": the validation split (the last 10% of each text) has " +
                                              std::to_string(val_.size()) + " bytes; need at least " +
                                              std::to_string(context + 2) + " for context " + std::to_string(context)));
}

std::vector<TextFile> CharLMTask::read_corpus(const std::string& path) {
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
  std::vector<TextFile> corpus;
  for (const auto& f : files) corpus.push_back({f.first, read_text(f.second.string())});
  return corpus;
}

std::string CharLMTask::fingerprint(const std::vector<TextFile>& corpus) {
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

std::vector<std::int64_t> CharLMTask::encode(const std::string& text) const {
  std::vector<std::int64_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(vocab_.id(std::string(1, c)));
  return ids;
}

LMBatch CharLMTask::batch(std::size_t B, Generator& gen, bool validation) const {
  const auto& src = validation ? val_ : train_;
  const std::size_t T = context_;
  LMBatch b{IndexArray({B, T}, std::vector<std::int64_t>(B * T)), IndexArray({B, T}, std::vector<std::int64_t>(B * T))};
  for (std::size_t s = 0; s < B; ++s) {
    const std::size_t start = gen.below(src.size() - T - 1);
    for (std::size_t t = 0; t < T; ++t) {
      b.tokens.data[s * T + t] = src[start + t];
      b.targets.data[s * T + t] = src[start + t + 1];
    }
  }
  return b;
}

}  // namespace xg::train
