// What the built-in tasks share: the model configuration from the options, sharding a global
// batch over the ranks, and the decoder-only (GPT) model with its sharded loss. Internal to
// train/.
#pragma once

#include <memory>

#include <xgrad/dist/data_parallel.hpp>
#include <xgrad/nn/transformer.hpp>
#include <xgrad/train/task.hpp>
#include <xgrad/train/tasks.hpp>

namespace xg::train::tasks {

/// The model options of `o` as a configuration (context and vocabulary size are the task's).
nn::TransformerConfig config_from_options(const TrainOptions& o);

/// Rows [shard.begin, shard.end) of a [B, ...] index array.
IndexArray rows_of(const IndexArray& a, const dist::Shard& shard);
/// Targets that take part in the loss.
std::size_t targets_in(const IndexArray& targets);

/// This rank's rows of a decoder-only batch; *weight = their targets / all targets (1 when
/// the shard is the whole batch).
LMBatch shard_of(LMBatch b, const dist::Shard& shard, std::size_t batch, double* weight);

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
