// The sort task (decoder-only): its data and its training.
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
#include <xgrad/nn/generate.hpp>

#include "common.hpp"
#include "heldout.hpp"

namespace xg::train {

using heldout::distinct;
using heldout::not_excluded;

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
// Training on it: held-out exact match of the whole sorted sequence, greedy.

namespace tasks {
namespace {

class SortTraining : public GPTTask {
 public:
  explicit SortTraining(const TrainOptions& o) : data_(o.n_digits) {
    describe_task(info_, o, "sort", ModelKind::gpt, data_.vocab(), data_.context());
    info_.task_params = {{"n_digits", std::to_string(o.n_digits)}, {"n_values", "10"}};
    heldout_ = data_.heldout(o.heldout, o.seed + 1000);
    data_.exclude(heldout_);
  }

  Tensor loss(std::size_t batch, Generator& data, Generator& dropout, const dist::Shard& shard,
              double* weight) override {
    return lm_loss(data_.batch(batch, data), dropout, shard, batch, weight);
  }
  std::size_t tokens_per_batch(std::size_t batch) const override { return batch * 2 * data_.n(); }
  std::string metric_name() const override { return "heldout_exact_match"; }

  // Held-out problems answered greedily, shared out among the ranks.
  double evaluate(dist::Communicator& comm, std::ostream* samples) override {
    module().eval();
    const double metric = heldout_exact_match(comm, heldout_.size(), [&](std::size_t first, std::size_t last,
                                                                          std::size_t& right) {
      std::vector<std::vector<std::int64_t>> prompts;
      for (std::size_t i = first; i < last; ++i) prompts.push_back(data_.prompt(heldout_[i]));
      const nn::Generation g = nn::generate(*gpt_, prompts, data_.n());
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        right += exact_match(info_.vocab, prompts[i], g.tokens[i], data_.answer(heldout_[first + i]), i, samples);
      }
    });
    module().train();
    return metric;
  }

 private:
  SortTask data_;
  std::vector<std::vector<std::int64_t>> heldout_;
};

}  // namespace

std::unique_ptr<Task> make_sort(const TrainOptions& o) { return std::make_unique<SortTraining>(o); }

}  // namespace tasks

}  // namespace xg::train
