// The charlm task (character-level language model): its data and its training.
#include <xgrad/train/tasks.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/nn/generate.hpp>

#include "common.hpp"
#include <xgrad/io/input_file.hpp>

namespace xg::train {

CharLMTask::CharLMTask(const std::string& path, std::size_t context) : CharLMTask(path, context, text::read_corpus(path)) {}

CharLMTask::CharLMTask(const std::string& path, std::size_t context, const std::string& text)
    : CharLMTask(path, context, std::vector<text::TextFile>{{std::filesystem::path(path).filename().string(), text}}) {}

CharLMTask::CharLMTask(const std::string& path, std::size_t context, const std::vector<text::TextFile>& corpus)
    : context_(context) {
  std::size_t total = 0;
  for (const text::TextFile& f : corpus) total += f.text.size();
  if (total < 20 * (context + 1))
    throw ValueError(op_message("charlm", path + " has " + std::to_string(total) + " bytes; need at least " +
                                              std::to_string(20 * (context + 1)) + " for context " +
                                              std::to_string(context)));
  std::set<unsigned char> chars;
  for (const text::TextFile& f : corpus) chars.insert(f.text.begin(), f.text.end());
  for (unsigned char c : chars) vocab_.tokens.push_back(std::string(1, static_cast<char>(c)));
  // The tail of every text: validation then reads the same kinds of text as training.
  for (const text::TextFile& f : corpus) {
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


// ---------------------------------------------------------------------------------------
// Training on it: validation loss on the last 10% of every text, samples from the model.

namespace tasks {
namespace {

class CharLMTraining : public GPTTask {
 public:
  CharLMTraining(const TrainOptions& o, const std::vector<text::TextFile>& corpus)
      : o_(o), data_(o.text, o.context, corpus), corpus_(text::fingerprint(corpus)) {
    describe_task(info_, o, "charlm", ModelKind::gpt, data_.vocab(), o.context);
  }

  Tensor loss(std::size_t batch, Generator& data, Generator& dropout, const dist::Shard& shard,
              double* weight) override {
    return lm_loss(data_.batch(batch, data), dropout, shard, batch, weight);
  }
  std::size_t tokens_per_batch(std::size_t batch) const override { return batch * o_.context; }
  std::string metric_name() const override { return "val_loss"; }
  bool has_validation() const override { return true; }

  // The mean loss over a fixed validation set (the same 10 batches of --batch windows of the
  // validation split at every call), sharded over the ranks and summed.
  double validation_loss(dist::Communicator& comm) override {
    module().eval();
    NoGradGuard ng;
    const std::size_t R = static_cast<std::size_t>(comm.size());
    Generator eval_gen(o_.seed + 2000);
    double sum = 0;
    const int batches = 10;
    const dist::Shard shard = dist::shard_of(o_.batch, comm.rank(), comm.size());
    for (int i = 0; i < batches; ++i) {
      double weight = 1.0;
      const LMBatch b = shard_of(data_.batch(o_.batch, eval_gen, true), shard, o_.batch, &weight);
      sum += R > 1 ? gpt_->loss(b.tokens, b.targets).item() * weight : gpt_->loss(b.tokens, b.targets).item();
    }
    module().train();
    return comm.all_reduce(sum, dist::ReduceOp::sum) / batches;
  }

  double evaluate(dist::Communicator& comm, std::ostream* samples) override {
    const double v = validation_loss(comm);
    if (samples) sample(*samples);
    return v;
  }

  // 240 characters continuing a prompt taken from the validation split. Past the context,
  // each piece continues the last context/2 characters.
  void sample(std::ostream& samples) override {
    module().eval();
    Generator sample_gen(o_.seed + 3000);
    const LMBatch b = data_.batch(1, sample_gen, true);
    const std::size_t p = std::min<std::size_t>(16, o_.context / 2);  // prompt, then room to write
    const std::vector<std::int64_t> prompt(b.tokens.data.begin(), b.tokens.data.begin() + static_cast<long>(p));
    const std::vector<std::int64_t> written = continue_text(*gpt_, prompt, o_.context, 240, sample_gen);
    samples << "  sample (prompt|what the model wrote): \"" << info_.vocab.decode(prompt) << "|" << info_.vocab.decode(written) << "\"\n";
    module().train();
  }

  // The texts, by name: the full list with sizes and checksums is in the state's metadata.
  std::string describe_data() const override {
    std::string names;
    std::size_t texts = 0;
    for (std::size_t i = 0; i < corpus_.size();) {
      const std::size_t end = std::min(corpus_.find(';', i), corpus_.size());
      names += (texts++ ? ", " : "") + corpus_.substr(i, corpus_.find(':', i) - i);
      i = end + 1;
    }
    std::ostringstream out;
    out << "corpus: " << o_.text << ": " << texts << (texts == 1 ? " text" : " texts") << " (" << names << "), "
        << data_.train_size() + data_.validation_size() << " bytes; training " << data_.train_size()
        << ", validation " << data_.validation_size() << " characters (the last 10% of each text)\n";
    return out.str();
  }

  io::safetensors::Metadata state_metadata() const override { return {{"corpus", corpus_}}; }

  void check_resume(const io::safetensors::Metadata& state, const std::string& path) const override {
    const auto it = state.find("corpus");
    if (it != state.end() && it->second != corpus_)
      throw FormatError("[train] " + path + ": the texts of " + o_.text + " changed since the run was saved (saved corpus " +
                        it->second + "; now " + corpus_ + "); cannot resume exactly");
  }

 private:
  TrainOptions o_;
  CharLMTask data_;
  std::string corpus_;  // text::fingerprint of the texts, saved with the state
};

}  // namespace

// Rank 0 reads the texts; every rank gets the same bytes.
std::unique_ptr<Task> make_charlm(const TrainOptions& o, dist::Communicator& comm) {
  std::vector<text::TextFile> corpus;
  dist::together(comm, [&] {
    if (comm.rank() == 0) corpus = text::read_corpus(o.text);
  });
  if (comm.size() > 1) {
    std::string count = std::to_string(corpus.size());
    comm.broadcast(count, 0);
    corpus.resize(static_cast<std::size_t>(std::stoull(count)));
    for (text::TextFile& f : corpus) {
      comm.broadcast(f.name, 0);
      comm.broadcast(f.text, 0);
    }
  }
  std::unique_ptr<Task> task;
  dist::together(comm, [&] { task = std::make_unique<CharLMTraining>(o, corpus); });
  return task;
}

}  // namespace tasks

}  // namespace xg::train

