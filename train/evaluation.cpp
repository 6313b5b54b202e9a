#include <xgrad/train/evaluation.hpp>

#include <algorithm>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>

namespace xg::train {

WindowLoss window_loss(nn::GPT& gpt, const text::TokenFile& tokens, const text::ValidationWindows& w, std::size_t first,
                       std::size_t last, std::size_t batch, const std::vector<std::size_t>& token_bytes) {
  NoGradGuard ng;
  WindowLoss out;
  const std::size_t T = w.context;
  for (std::size_t w0 = first; w0 < last; w0 += batch) {
    const std::size_t B = std::min(batch, last - w0);
    IndexArray in({B, T}, std::vector<std::int64_t>(B * T, 0)), tgt({B, T}, std::vector<std::int64_t>(B * T, -100));
    std::uint64_t n = 0;
    for (std::size_t s = 0; s < B; ++s) {
      const std::uint64_t start = w.starts[w0 + s];
      for (std::size_t t = 0; t < T && start + t + 1 < tokens.size(); ++t) {
        in.data[s * T + t] = tokens[start + t];
        tgt.data[s * T + t] = tokens[start + t + 1];
        out.bytes += token_bytes[tokens[start + t + 1]];
        ++n;
      }
    }
    out.nats += gpt.loss(in, tgt, -100).item() * static_cast<double>(n);
    out.targets += n;
  }
  return out;
}

}  // namespace xg::train
