/// \file
/// The validation measure of language models through a model: the cross-entropy of fixed
/// windows of a token file (text::validation_windows), summed, and the bytes they stand for
/// (bits per byte). `xgrad train --task text` and `xgrad eval` share it.
#pragma once

#include <cstdint>
#include <vector>

#include <xgrad/nn/transformer.hpp>
#include <xgrad/text/corpus.hpp>

namespace xg::train {

/// The cross-entropy of some validation windows, summed.
struct WindowLoss {
  double nats = 0;             ///< The summed cross-entropy of the targets (natural log).
  std::uint64_t targets = 0;   ///< The targets counted.
  std::uint64_t bytes = 0;     ///< The bytes of text the targets stand for.
};
/// Windows [first, last) of `w` over `tokens`, `batch` windows a forward pass, through `gpt`
/// in evaluation (no tape); `token_bytes[id]` is the number of bytes token `id` decodes to.
WindowLoss window_loss(nn::GPT& gpt, const text::TokenFile& tokens, const text::ValidationWindows& w, std::size_t first,
                       std::size_t last, std::size_t batch, const std::vector<std::size_t>& token_bytes);

}  // namespace xg::train
