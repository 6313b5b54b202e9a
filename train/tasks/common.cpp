#include "common.hpp"

#include <ostream>

#include <xgrad/core/error.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/ops/dropout.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/model_schema.hpp>

namespace xg::train {

double Task::validation_loss(dist::Communicator&) {
  throw InternalError(op_message("train", "task " + info_.task + " has no validation split"));
}

void Task::sample(std::ostream&) {}

void Task::check_resume(const io::safetensors::Metadata&, const std::string&) const {}

std::unique_ptr<Task> make_task(const TrainOptions& o, dist::Communicator& comm) {
  // Tasks that read files: collectives of their own.
  if (o.task == "charlm") return tasks::make_charlm(o, comm);
  if (o.task == "text") return tasks::make_text(o, comm);
  std::unique_ptr<Task> task;
  dist::together(comm, [&] {
    if (o.task == "sort")
      task = tasks::make_sort(o);
    else if (o.task == "reverse")
      task = tasks::make_reverse(o);
    else
      throw ValueError(op_message("train", "unknown task '" + o.task + "' (sort, reverse, charlm, text)"));
  });
  return task;
}

namespace tasks {

nn::TransformerConfig config_from_options(const TrainOptions& o) {
  // The model options, each through its model row (train/model_schema.hpp).
  nn::TransformerConfig c = model_from_options(o).config;
  c.dropout = o.dropout;  // how the run trains the model, not part of its description
  return c;
}

void describe_task(ModelInfo& info, const TrainOptions& o, const std::string& task, ModelKind kind,
                   const text::Vocabulary& vocab, std::size_t context) {
  nn::TransformerConfig c = config_from_options(o);
  info.task = task;
  info.kind = kind;
  info.vocab = vocab;
  c.context = context;
  c.V_vocab = info.vocab.size();
  info.config = c.resolved();
}

IndexArray rows_of(const IndexArray& a, const dist::Shard& shard) {
  const std::size_t row = a.shape.empty() || a.shape[0] == 0 ? 0 : a.size() / a.shape[0];
  Shape shape = a.shape;
  shape[0] = shard.rows();
  return IndexArray(shape, std::vector<std::int64_t>(a.data.begin() + static_cast<long>(shard.begin * row),
                                                     a.data.begin() + static_cast<long>(shard.end * row)));
}

std::size_t targets_in(const IndexArray& targets) {
  std::size_t n = 0;
  for (std::int64_t t : targets.data) n += t != kIgnore;
  return n;
}

LMBatch shard_of(LMBatch b, const dist::Shard& shard, std::size_t batch, double* weight) {
  *weight = 1.0;
  if (shard.rows() == batch) return b;
  const double global = static_cast<double>(targets_in(b.targets));
  b = LMBatch{rows_of(b.tokens, shard), rows_of(b.targets, shard)};
  *weight = static_cast<double>(targets_in(b.targets)) / global;
  return b;
}

std::vector<std::int64_t> continue_text(nn::GPT& gpt, const std::vector<std::int64_t>& prompt, std::size_t context,
                                        std::size_t count, Generator& gen, std::size_t vocab_limit) {
  nn::SampleOptions so;
  so.temperature = 0.8;
  so.vocab_limit = vocab_limit;
  so.generator = &gen;
  std::vector<std::int64_t> text = prompt, written;
  while (written.size() < count) {
    const std::size_t keep = std::min(text.size(), std::max<std::size_t>(1, context / 2));
    const std::vector<std::int64_t> window(text.end() - static_cast<long>(keep), text.end());
    const std::size_t n = std::min<std::size_t>(count - written.size(), context - keep);
    const nn::Generation g = nn::generate(gpt, {window}, n, so);
    text.insert(text.end(), g.tokens[0].begin(), g.tokens[0].end());
    written.insert(written.end(), g.tokens[0].begin(), g.tokens[0].end());
  }
  return written;
}

double heldout_exact_match(dist::Communicator& comm, std::size_t n,
                           const std::function<void(std::size_t, std::size_t, std::size_t&)>& answer) {
  const std::size_t R = static_cast<std::size_t>(comm.size()), r = static_cast<std::size_t>(comm.rank());
  const std::size_t first = n * r / R, last = n * (r + 1) / R;
  std::size_t right = 0;
  if (last > first) answer(first, last, right);
  return comm.all_reduce(static_cast<double>(right), dist::ReduceOp::sum) / static_cast<double>(n);
}

bool exact_match(const text::Vocabulary& vocab, const std::vector<std::int64_t>& input, const std::vector<std::int64_t>& got,
                 const std::vector<std::int64_t>& want, std::size_t i, std::ostream* samples) {
  const bool ok = got == want;
  if (samples && i < 4)
    *samples << "  " << vocab.decode(input) << " -> " << vocab.decode(got)
             << (ok ? "  (right)" : "  (expected " + vocab.decode(want) + ")") << "\n";
  return ok;
}

void GPTTask::build_model(Generator& init) { gpt_ = std::make_unique<nn::GPT>(info_.config, init); }

Tensor GPTTask::lm_loss(LMBatch b, Generator& dropout, const dist::Shard& shard, std::size_t batch, double* weight) {
  ops::DropoutRowOffset rows(shard.begin);  // dropout masks by global row
  b = shard_of(std::move(b), shard, batch, weight);
  return gpt_->loss(b.tokens, b.targets, kIgnore, &dropout);
}

}  // namespace tasks
}  // namespace xg::train
