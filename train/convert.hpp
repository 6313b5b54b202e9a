// `xgrad convert`: a checkpoint with fewer key/value heads (MHA -> GQA/MQA, or GQA -> fewer
// groups), made by mean-pooling each group's key and value heads (nn/convert.hpp), written as
// a model.safetensors with the new H_kv, then compared with the original on the task's
// held-out data: logit distance, KL, teacher-forced cross-entropy and exact match (sort,
// reverse) of both models. `xgrad train --init-from OUT` uptrains the result.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace xg::train {

struct ConvertOptions {
  std::string in, out;        // model.safetensors files
  std::size_t kv_heads = 0;   // G, the new H_kv
  std::uint64_t seed = 1;     // the training run's --seed: its held-out set
  std::size_t heldout = 500;  // held-out problems (sort, reverse), as `xgrad train`
  std::string text = "/usr/share/common-licenses/GPL-3";  // charlm: the text whose last 10% is validation
};

// How one model does on the held-out data.
struct HeldoutScore {
  double cross_entropy = 0.0;  // teacher-forced mean over the compared positions (nats)
  double exact_match = std::numeric_limits<double>::quiet_NaN();  // sort, reverse: greedy, whole answer
};

struct ConvertReport {
  std::string kind, task;
  std::size_t H_q = 0, H_kv_from = 0, H_kv_to = 0, d_h = 0;
  std::size_t self_attention_layers = 0, cross_attention_layers = 0;
  std::uint64_t params_from = 0, params_to = 0;
  std::size_t sequences = 0, positions = 0;  // held-out sequences and compared positions
  double max_abs_dlogit = 0.0, mean_abs_dlogit = 0.0;
  double kl = 0.0;  // mean KL(original || converted) of the next-token distributions (nats)
  HeldoutScore original, converted;
};

// Checks the options against the checkpoint IN (UsageError naming the flag: --kv-heads that
// is 0, above H_kv or does not divide it, naming H_q, H_kv and G), converts, writes OUT
// (atomically; the caller checked that it may), reloads it as any checkpoint is loaded and
// evaluates both models. The metadata of IN is kept (the task, the vocabulary, any other key)
// with H_kv replaced, the training step dropped, and the keys "converted_from_H_kv" and
// "kv_conversion" added.
ConvertReport convert_checkpoint(const ConvertOptions& opts);

// Held-out score of the checkpoint at `path` (the same data as convert_checkpoint).
HeldoutScore score_checkpoint(const std::string& path, const ConvertOptions& opts);

}  // namespace xg::train
