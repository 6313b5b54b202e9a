// Gradient accumulation over micro-batches (train/detail/grad_accum.hpp).
#include <xgrad/train/detail/grad_accum.hpp>

#include <string>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>

namespace xg::train::detail {

double accumulate_gradients(Task& task, std::size_t batch, std::size_t micro, Generator& data, Generator& dropout,
                            const dist::Shard& shard) {
  if (micro == 0 || shard.rows() % micro != 0)
    throw UsageError(op_message("train", "--grad-accum " + std::to_string(micro) + " must divide this rank's " +
                                             std::to_string(shard.rows()) + " rows of the step's batch"));
  const std::size_t rows = shard.rows() / micro, global = batch * micro;
  double sum = 0;
  for (std::size_t k = 0; k < micro; ++k) {
    const bool last = k + 1 == micro;
    Generator data_k = data, dropout_k = dropout;  // the same draw for every block
    const dist::Shard block{shard.begin + k * rows, shard.begin + (k + 1) * rows};
    Tape tape;
    double weight = 1.0;
    const Tensor loss = task.loss(global, last ? data : data_k, last ? dropout : dropout_k, block, &weight);
    // d(weight * loss): the blocks' gradients add up to the gradient of the batch's mean.
    xg::backward(loss, Array::full(loss.shape(), weight, loss.dtype()));
    sum += loss.item() * weight;
  }
  return sum;
}

}  // namespace xg::train::detail
