// The text task (decoder-only): next-token prediction on the user's own text with a tokenizer
// (SentencePiece or bytes). The corpus is tokenised once into token files in the run folder
// (train.bin, val.bin) read through a memory map; the split is by document; the metric is
// bits per byte on the validation split, which compares models with different tokenizers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/io/atomic_file.hpp>
#include <xgrad/io/input_file.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/text/corpus.hpp>
#include <xgrad/train/evaluation.hpp>

#include "common.hpp"

namespace xg::train::tasks {

namespace fs = std::filesystem;

namespace {



// The token files of a run, written before the run's checks and committed into the run folder
// once they pass. Never committed (a refused run), they are removed, and so are the folders
// created for them (when nothing else appeared there).
struct PendingTokens {
  std::vector<fs::path> created;  // folders created for the files, deepest last
  std::unique_ptr<io::AtomicFile> train, val;
  bool committed = false;

  PendingTokens() = default;
  PendingTokens(const PendingTokens&) = delete;
  PendingTokens& operator=(const PendingTokens&) = delete;
  ~PendingTokens() {
    train.reset();  // removes its temporary file unless committed
    val.reset();
    if (committed) return;
    std::error_code ec;
    for (auto it = created.rbegin(); it != created.rend(); ++it) fs::remove(*it, ec);  // only if empty
  }
  void commit() {
    train->commit();
    val->commit();
    committed = true;
  }
};

class TextTraining : public GPTTask {
 public:
  TextTraining(const TrainOptions& o, std::unique_ptr<text::Tokenizer> tok, std::unique_ptr<text::TokenFile> train,
               std::unique_ptr<text::TokenFile> val, std::string corpus, std::string split)
      : o_(o), tok_(std::move(tok)), train_(std::move(train)), val_(std::move(val)), corpus_(std::move(corpus)),
        split_(std::move(split)) {
    const std::size_t T = o.context;
    if (train_->size() < T + 2 || val_->size() < 2)
      throw UsageError(op_message("train", "--text '" + o.text + "': " + std::to_string(train_->size()) +
                                               " training and " + std::to_string(val_->size()) +
                                               " validation tokens; one training window needs --context + 2 = " +
                                               std::to_string(T + 2) + " (give more text or a shorter --context)"));
    nn::TransformerConfig c = config_from_options(o);
    info_.task = "text";
    info_.kind = ModelKind::gpt;
    info_.vocab = text_vocabulary(*tok_, o);
    c.context = std::max(T, o.model_context);  // the model may take more than the training window
    c.V_vocab = info_.vocab.size();
    info_.config = c.resolved();
    info_.task_params = text::tokenizer_metadata(*tok_);
    // convert and eval hold out the same documents (models saved before this key: 0.1).
    info_.task_params["val_fraction"] = exact(o.val_fraction);
    // and join them as training did (models saved before this key: none; written only when
    // not none, so those runs keep their bytes).
    if (o.doc_separator != "none") info_.task_params["doc_separator"] = o.doc_separator;
    for (std::size_t id = 0; id < info_.vocab.size(); ++id)
      token_bytes_.push_back(id < tok_->vocab_size() ? info_.vocab.tokens[id].size() : 0);  // placeholders: none
    windows_ = text::validation_windows(val_->size(), T, text::kMaxValidationWindows);
    for (std::uint64_t start : windows_.starts)
      for (std::uint64_t t = start + 1; t <= std::min<std::uint64_t>(start + T, val_->size() - 1); ++t) {
        ++val_targets_;
        val_bytes_ += token_bytes_[(*val_)[t]];
      }
  }

  Tensor loss(std::size_t batch, Generator& data, Generator& dropout, const dist::Shard& shard,
              double* weight) override {
    const std::size_t T = o_.context;
    LMBatch b{IndexArray({batch, T}, std::vector<std::int64_t>(batch * T)),
              IndexArray({batch, T}, std::vector<std::int64_t>(batch * T))};
    for (std::size_t s = 0; s < batch; ++s) {
      const std::uint64_t start = data.below(train_->size() - T - 1);
      for (std::size_t t = 0; t < T; ++t) {
        b.tokens.data[s * T + t] = (*train_)[start + t];
        b.targets.data[s * T + t] = (*train_)[start + t + 1];
      }
    }
    return lm_loss(std::move(b), dropout, shard, batch, weight);
  }
  std::size_t tokens_per_batch(std::size_t batch) const override { return batch * o_.context; }
  std::string metric_name() const override { return "val_bits_per_byte"; }
  bool has_validation() const override { return true; }
  bool logs_bits_per_byte() const override { return true; }

  // Cross-entropy per token over the validation windows (text_corpus.hpp), the windows shared
  // out among the ranks and the sums added up.
  double validation_loss(dist::Communicator& comm) override {
    module().eval();
    const std::size_t n = windows_.starts.size();
    const std::size_t R = static_cast<std::size_t>(comm.size()), r = static_cast<std::size_t>(comm.rank());
    const WindowLoss mine = window_loss(*gpt_, *val_, windows_, n * r / R, n * (r + 1) / R, o_.batch, token_bytes_);
    module().train();
    return comm.all_reduce(mine.nats, dist::ReduceOp::sum) / static_cast<double>(val_targets_);
  }

  double metric_of_validation(double val_loss) const override {
    return val_loss * static_cast<double>(val_targets_) / static_cast<double>(val_bytes_) / std::log(2.0);
  }

  double evaluate(dist::Communicator& comm, std::ostream* samples) override {
    const double v = metric_of_validation(validation_loss(comm));
    if (samples) sample(*samples);
    return v;
  }

  // About 120 tokens continuing the first tokens of the validation text (temperature 0.8).
  void sample(std::ostream& samples) override {
    module().eval();
    Generator sample_gen(o_.seed + 3000);
    const std::size_t p = std::min<std::size_t>({16, o_.context / 2, static_cast<std::size_t>(val_->size())});
    std::vector<std::int64_t> prompt;
    for (std::size_t i = 0; i < p; ++i) prompt.push_back((*val_)[i]);
    const std::vector<std::int64_t> written =
        continue_text(*gpt_, prompt, o_.context, 120, sample_gen, tok_->vocab_size());
    // Printable: a model that has not learned UTF-8 yet writes any bytes (\xNN escapes them).
    samples << "  sample (prompt|what the model wrote): \"" << text::printable(tok_->decode(prompt)) << "|" << text::printable(tok_->decode(written)) << "\"\n";
    module().train();
  }

  std::string describe_data() const override {
    std::ostringstream out;
    out << "corpus: " << o_.text << ": " << split_ << "; tokenizer " << tok_->description() << "; documents joined by "
        << (o_.doc_separator == "bos"   ? "BOS (id " + std::to_string(tok_->bos_id()) + ") before each"
            : o_.doc_separator == "eos" ? "EOS (id " + std::to_string(tok_->eos_id()) + ") after each"
                                        : std::string("nothing (--doc-separator none)"))
        << "; training "
        << train_->size() << " tokens (" << train_->bytes() << " bytes), validation " << val_->size() << " tokens ("
        << val_->bytes() << " bytes; evaluated: " << windows_.starts.size() << " windows, " << val_targets_
        << " tokens, " << val_bytes_ << " bytes)\n";
    return out.str();
  }

  void commit_files() override {
    if (pending_) pending_->commit();
    pending_.reset();
  }

  void set_pending(std::unique_ptr<PendingTokens> p) { pending_ = std::move(p); }

  io::safetensors::Metadata state_metadata() const override {
    return {{"corpus", corpus_}, {"tokenizer_sha256", tok_->digest()}};
  }

  void check_resume(const io::safetensors::Metadata& state, const std::string& path) const override {
    const auto tok = state.find("tokenizer_sha256");
    if (tok != state.end() && tok->second != tok_->digest())
      throw FormatError("[train] " + path + ": the tokenizer " + o_.tokenizer + " (sha256 " + tok_->digest() +
                        ") differs from the one the run was saved with (sha256 " + tok->second +
                        "); cannot resume exactly");
    const auto it = state.find("corpus");
    if (it != state.end() && it->second != corpus_)
      throw FormatError("[train] " + path + ": the texts of " + o_.text +
                        " changed since the run was saved; cannot resume exactly");
  }

 private:
  TrainOptions o_;
  std::unique_ptr<text::Tokenizer> tok_;
  std::unique_ptr<text::TokenFile> train_, val_;
  std::string corpus_, split_;
  text::ValidationWindows windows_;
  std::vector<std::size_t> token_bytes_;  // bytes each id decodes to
  std::uint64_t val_targets_ = 0, val_bytes_ = 0;
  std::unique_ptr<PendingTokens> pending_;  // rank 0, until commit_files()
};

// Before any tokenising: the token files' paths in the run folder are free or regular files
// (a folder there would fail the second commit after the first had replaced its file).
void check_token_paths(const TrainOptions& o) {
  for (const char* name : {"train.bin", "val.bin"}) {
    const std::string p = (fs::path(o.out) / name).string();
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(p, ec))) continue;
    const std::string kind = io::non_regular_kind(p);
    if (!kind.empty())
      throw FormatError(op_message("train", p + " is " + kind + ", not the run's token file; remove it"));
  }
}

// The folders create_directories(`dir`) would create, outermost first.
std::vector<fs::path> missing_folders(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" is the folder a/b
  while (!p.empty() && !fs::exists(p, ec)) {
    out.insert(out.begin(), p);
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  return out;
}

// Rank 0's token file, shared with the other ranks (held in memory there).
std::unique_ptr<text::TokenFile> share(dist::Communicator& comm, std::unique_ptr<text::TokenFile> mine) {
  if (comm.size() == 1) return mine;
  std::string blob;
  if (comm.rank() == 0) {
    const std::vector<std::uint32_t> ids = mine->all();
    const std::uint64_t bytes = mine->bytes();
    blob.assign(reinterpret_cast<const char*>(&bytes), 8);
    blob.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
  }
  comm.broadcast(blob, 0);
  if (comm.rank() == 0) return mine;
  std::uint64_t bytes = 0;
  std::memcpy(&bytes, blob.data(), 8);
  std::vector<std::uint32_t> ids((blob.size() - 8) / 4);
  std::memcpy(ids.data(), blob.data() + 8, ids.size() * 4);
  return std::make_unique<text::TokenFile>(std::move(ids), bytes);
}

}  // namespace

text::Vocabulary text_vocabulary(const text::Tokenizer& tok, const TrainOptions& o) {
  const std::size_t n = tok.vocab_size(), V = o.vocab_size == 0 ? n : o.vocab_size;
  if (n > V)
    throw UsageError(op_message("train", "--tokenizer '" + o.tokenizer + "' has " + std::to_string(n) +
                                             " ids, more than the model's vocabulary of " + std::to_string(V) +
                                             (o.init_from.empty() ? " (--vocab-size)" : " (--init-from " + o.init_from + ")")));
  text::Vocabulary v;
  for (std::size_t id = 0; id < n; ++id) v.tokens.push_back(tok.decode({static_cast<std::int64_t>(id)}));
  for (std::size_t id = n; id < V; ++id) v.tokens.push_back(text::placeholder_token(id));
  return v;
}

// Rank 0 reads and tokenises the texts into the run folder; the others get the tokens.
std::unique_ptr<Task> make_text(const TrainOptions& given, dist::Communicator& comm) {
  // run_training resolved --doc-separator auto when the run started; a task made directly
  // (make_task) resolves it here by the same rule.
  TrainOptions o = given;
  if (o.doc_separator == "auto") resolve_doc_separator(o);
  std::unique_ptr<text::Tokenizer> tok;
  std::unique_ptr<text::TokenFile> train, val;
  std::unique_ptr<PendingTokens> pending;
  std::string corpus, split;
  dist::together(comm, [&] {
    tok = text::load_tokenizer(o.tokenizer);
    text_vocabulary(*tok, o);  // the tokenizer fits the model's vocabulary, before any tokenising
    if (comm.rank() != 0) return;
    const std::vector<text::Document> docs = text::list_documents(o.text, o.out);
    std::vector<text::Document> train_docs, val_docs;
    text::split_documents(docs, o.val_fraction, train_docs, val_docs);
    corpus = text::corpus_fingerprint(docs);
    check_token_paths(o);
    // The tokens go to temporary files in the run folder, committed as train.bin and val.bin
    // only once the run's checks have passed (commit_files); until then the folder is as it was.
    pending = std::make_unique<PendingTokens>();
    pending->created = missing_folders(o.out);
    fs::create_directories(o.out);
    const std::string train_path = (fs::path(o.out) / "train.bin").string(), val_path = (fs::path(o.out) / "val.bin").string();
    const auto t0 = std::chrono::steady_clock::now();
    // --doc-separator (resolved when the run started): BOS before or EOS after every document.
    const text::DocSeparator sep = text::doc_separator_from_name(o.doc_separator, "[train] --doc-separator");
    const std::int64_t sep_id = text::doc_separator_id(sep, *tok, o.tokenizer, "train");
    pending->train = text::tokenize_documents_pending(train_docs, *tok, train_path, sep, sep_id);
    pending->val = text::tokenize_documents_pending(val_docs, *tok, val_path, sep, sep_id);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    train = std::make_unique<text::TokenFile>(pending->train->temporary_path());
    val = std::make_unique<text::TokenFile>(pending->val->temporary_path());
    split = std::to_string(docs.size()) + " documents, " + std::to_string(val_docs.size()) + " for validation (--val-fraction " +
            number_text(o.val_fraction) + "), tokenised in " + std::to_string(seconds).substr(0, 5) +
            " s";
  });
  train = share(comm, std::move(train));
  val = share(comm, std::move(val));
  if (comm.size() > 1) {
    comm.broadcast(corpus, 0);
    comm.broadcast(split, 0);
  }
  std::unique_ptr<TextTraining> task;
  dist::together(comm, [&] {
    task = std::make_unique<TextTraining>(o, std::move(tok), std::move(train), std::move(val), corpus, split);
  });
  task->set_pending(std::move(pending));
  return task;
}

}  // namespace xg::train::tasks
