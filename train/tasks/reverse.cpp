// The reverse task (encoder-decoder): its data and its training.
#include <xgrad/train/tasks.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/nn/generate.hpp>

#include "common.hpp"
#include "heldout.hpp"

namespace xg::train {

using heldout::distinct;
using heldout::not_excluded;

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
// Training on it: an encoder-decoder; held-out exact match of the reversed string, greedy.

namespace tasks {
namespace {

class ReverseTraining : public Task {
 public:
  explicit ReverseTraining(const TrainOptions& o) : data_(o.min_len, o.max_len) {
    describe_task(info_, o, "reverse", ModelKind::encoder_decoder, data_.vocab(), data_.context());
    info_.task_params = {{"min_len", std::to_string(o.min_len)}, {"max_len", std::to_string(o.max_len)}};
    heldout_ = data_.heldout(o.heldout, o.seed + 1000);
    data_.exclude(heldout_);
  }

  void build_model(Generator& init) override { model_ = std::make_unique<nn::EncoderDecoder>(info_.config, init); }
  nn::Module& module() override { return *model_; }

  Tensor loss(std::size_t batch, Generator& data, Generator& dropout, const dist::Shard& shard,
              double* weight) override {
    ops::DropoutRowOffset rows(shard.begin);  // dropout masks by global row
    *weight = 1.0;
    Seq2SeqBatch b = data_.batch(batch, data);
    if (shard.rows() != batch) {
      const double global = static_cast<double>(targets_in(b.tgt_out));
      b = Seq2SeqBatch{rows_of(b.src, shard),
                       std::vector<std::size_t>(b.src_lengths.begin() + static_cast<long>(shard.begin),
                                                b.src_lengths.begin() + static_cast<long>(shard.end)),
                       rows_of(b.tgt_in, shard), rows_of(b.tgt_out, shard)};
      *weight = static_cast<double>(targets_in(b.tgt_out)) / global;
    }
    return model_->loss(b.src, b.src_lengths, b.tgt_in, b.tgt_out, kIgnore, &dropout);
  }
  std::size_t tokens_per_batch(std::size_t batch) const override { return batch * (data_.max_len() * 2 + 1); }
  std::string metric_name() const override { return "heldout_exact_match"; }

  // Held-out sources decoded greedily up to EOS, shared out among the ranks.
  double evaluate(dist::Communicator& comm, std::ostream* samples) override {
    module().eval();
    const double metric = heldout_exact_match(comm, heldout_.size(), [&](std::size_t first, std::size_t last,
                                                                          std::size_t& right) {
      const std::vector<std::vector<std::int64_t>> mine(heldout_.begin() + static_cast<long>(first),
                                                        heldout_.begin() + static_cast<long>(last));
      const Seq2SeqBatch b = data_.make_batch(mine);
      nn::SampleOptions so;
      so.stop_token = data_.eos();
      const nn::Generation g = nn::generate(*model_, b.src, b.src_lengths, data_.bos(), data_.max_len() + 1, so);
      for (std::size_t i = 0; i < mine.size(); ++i) {
        std::vector<std::int64_t> want(mine[i].rbegin(), mine[i].rend());
        want.push_back(data_.eos());
        right += exact_match(info_.vocab, mine[i], g.tokens[i], want, i, samples);
      }
    });
    module().train();
    return metric;
  }

 private:
  ReverseTask data_;
  std::vector<std::vector<std::int64_t>> heldout_;
  std::unique_ptr<nn::EncoderDecoder> model_;
};

}  // namespace

std::unique_ptr<Task> make_reverse(const TrainOptions& o) { return std::make_unique<ReverseTraining>(o); }

}  // namespace tasks

}  // namespace xg::train
