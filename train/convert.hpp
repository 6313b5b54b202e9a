/// \file
/// `xgrad convert`: a checkpoint with fewer key/value heads (MHA -> GQA/MQA, or GQA -> fewer
/// groups), made by mean-pooling each group's key and value heads (nn/kv_head_pooling.hpp), written as
/// a model.safetensors with the new H_kv, then compared with the original on the task's
/// held-out data: logit distance, KL, teacher-forced cross-entropy and exact match (sort,
/// reverse) of both models. `xgrad train --init-from OUT` uptrains the result.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace xg::train {

/// The options of `xgrad convert` (docs/cli.md).
struct ConvertOptions {
  /// The checkpoint to convert (IN) and the one to write (OUT): model.safetensors files. @{
  std::string in, out;
  /// @}
  std::size_t kv_heads = 0;   ///< G, the new H_kv (`--kv-heads`): in [1, H_kv] and dividing H_kv.
  std::uint64_t seed = 1;     ///< The training run's `--seed`: it picks the same held-out data.
  std::size_t heldout = 500;  ///< Held-out problems (sort, reverse), as `xgrad train --heldout`.
  /// charlm: the text whose last 10% is validation; text: the text whose held-out documents
  /// (as `--val-fraction 0.1` holds them out) are compared.
  std::string text = "/usr/share/common-licenses/GPL-3";
};

/// How one model does on the held-out data.
struct HeldoutScore {
  double cross_entropy = 0.0;  ///< Teacher-forced mean over the compared positions (nats).
  /// sort, reverse: the fraction of problems whose whole answer greedy decoding gets right;
  /// NaN for charlm and text (no problems to solve).
  double exact_match = std::numeric_limits<double>::quiet_NaN();
};

/// What convert_checkpoint did and how the converted model compares with the original.
struct ConvertReport {
  /// The model kind ("gpt", "encoder_decoder") and task of the checkpoint. @{
  std::string kind, task;
  /// @}
  /// Query heads, key/value heads before and after, and the head width d_h. @{
  std::size_t H_q = 0, H_kv_from = 0, H_kv_to = 0, d_h = 0;
  /// @}
  /// The attention layers converted: self-attention (decoder and encoder) and cross-attention. @{
  std::size_t self_attention_layers = 0, cross_attention_layers = 0;
  /// @}
  /// Parameter counts of the original and the converted model. @{
  std::uint64_t params_from = 0, params_to = 0;
  /// @}
  /// Held-out sequences and compared positions (the positions that have a target). @{
  std::size_t sequences = 0, positions = 0;
  /// @}
  /// Largest and mean |logit difference| between the models over the compared positions and
  /// the whole vocabulary. @{
  double max_abs_dlogit = 0.0, mean_abs_dlogit = 0.0;
  /// @}
  double kl = 0.0;  ///< Mean KL(original || converted) of the next-token distributions (nats).
  /// The held-out scores of the original and the converted model. @{
  HeldoutScore original, converted;
  /// @}
};

/// Checks the options against the checkpoint IN (UsageError naming the flag: `--kv-heads` that
/// is 0, above H_kv or does not divide it, naming H_q, H_kv and G), converts, writes OUT
/// (atomically; the caller checked that it may), reloads it as any checkpoint is loaded and
/// evaluates both models. The metadata of IN is kept (the task, the vocabulary, any other key)
/// with H_kv replaced, the training step dropped, and the keys "converted_from_H_kv" and
/// "kv_conversion" added. For charlm, a `--text` whose characters are not the checkpoint's
/// vocabulary is a UsageError, raised before anything is written.
ConvertReport convert_checkpoint(const ConvertOptions& opts);

/// Held-out score of the checkpoint at `path` (the same data as convert_checkpoint).
HeldoutScore score_checkpoint(const std::string& path, const ConvertOptions& opts);

}  // namespace xg::train
