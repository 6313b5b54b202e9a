// What the built-in tasks share: the model configuration from the options, sharding a global
// batch over the ranks, and the decoder-only (GPT) model with its sharded loss. Internal to
// train/.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/train/task.hpp>
#include <xgrad/train/tasks.hpp>

namespace xg::train::tasks {

/// The model options of `o` as a configuration (context and vocabulary size are the task's).
nn::TransformerConfig config_from_options(const TrainOptions& o);
/// Sets `info`'s task, kind and vocabulary, and its configuration: config_from_options(o) with
/// the task's context and the vocabulary's size, resolved.
void describe_task(ModelInfo& info, const TrainOptions& o, const std::string& task, ModelKind kind,
                   const text::Vocabulary& vocab, std::size_t context);

/// Rows [shard.begin, shard.end) of a [B, ...] index array.
IndexArray rows_of(const IndexArray& a, const dist::Shard& shard);
/// Targets that take part in the loss.
std::size_t targets_in(const IndexArray& targets);

/// This rank's rows of a decoder-only batch; *weight = their targets / all targets (1 when
/// the shard is the whole batch).
LMBatch shard_of(LMBatch b, const dist::Shard& shard, std::size_t batch, double* weight);

/// `count` tokens sampled (temperature 0.8, from `gen`) after `prompt`; past the context,
/// each piece continues the last context/2 tokens. Ids at or past `vocab_limit` (when not 0)
/// are never sampled.
std::vector<std::int64_t> continue_text(nn::GPT& gpt, const std::vector<std::int64_t>& prompt, std::size_t context,
                                        std::size_t count, Generator& gen, std::size_t vocab_limit = 0);

/// The text task's vocabulary: each id's text under `tok`, then, up to --vocab-size (with
/// --init-from: the model's vocabulary), a placeholder token (text::placeholder_token) for each
/// id the tokenizer does not have. UsageError naming both sizes when the tokenizer has more ids.
text::Vocabulary text_vocabulary(const text::Tokenizer& tok, const TrainOptions& o);

/// Exact match on held-out problems, shared out among the ranks: rank r answers problems
/// [n r / R, n (r + 1) / R) with `answer(first, last, right)` (adding its exact matches to
/// `right`); returns the fraction right over all ranks (a collective).
double heldout_exact_match(dist::Communicator& comm, std::size_t n,
                           const std::function<void(std::size_t, std::size_t, std::size_t&)>& answer);

/// Whether `got` is `want` (an exact match); the first four of a shard (`i` < 4) also go to
/// `samples` (when not null) as "  input -> got  (right)" or "(expected want)".
bool exact_match(const text::Vocabulary& vocab, const std::vector<std::int64_t>& input, const std::vector<std::int64_t>& got,
                 const std::vector<std::int64_t>& want, std::size_t i, std::ostream* samples);

/// A task that trains a decoder-only model (nn::GPT).
class GPTTask : public Task {
 public:
  void build_model(Generator& init) override;
  nn::Module& module() override { return *gpt_; }

 protected:
  /// The mean loss of this rank's rows of `b` (dropout masks by global row).
  Tensor lm_loss(LMBatch b, Generator& dropout, const dist::Shard& shard, std::size_t batch, double* weight);
  std::unique_ptr<nn::GPT> gpt_;
};

std::unique_ptr<Task> make_sort(const TrainOptions& o);
std::unique_ptr<Task> make_reverse(const TrainOptions& o);
std::unique_ptr<Task> make_charlm(const TrainOptions& o, dist::Communicator& comm);
std::unique_ptr<Task> make_text(const TrainOptions& o, dist::Communicator& comm);

}  // namespace xg::train::tasks
