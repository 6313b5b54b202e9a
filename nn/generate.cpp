#include <xgrad/nn/generate.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/nn/detail/flash_tile.hpp>
#include <xgrad/ops/join.hpp>

namespace xg::nn {

namespace {

// Logits of the last position, [B, T, V] -> [B, V]: a view of the model's fresh output for a
// decoding step (T = 1), of the slice otherwise (no copy of a 32000-wide row per step).
Array last_position(const Tensor& logits) {
  const Shape& s = logits.shape();
  if (s[1] == 1) return logits.value().view({s[0], s[2]});
  return ops::slice(logits, 1, static_cast<long>(s[1]) - 1, static_cast<long>(s[1])).value().view({s[0], s[2]});
}

// Row b of a [B, V] array into `r` (reusing its memory: one step's row is 32000 doubles for a
// Llama vocabulary, and a fresh vector per step costs more than the copy).
void row(const Array& a, std::size_t b, std::vector<double>& r) {
  const std::size_t V = a.shape()[1];
  if (a.dtype() == DType::float32) {
    const float* p = a.data<float>() + b * V;
    r.assign(p, p + V);
  } else {
    const double* p = a.data<double>() + b * V;
    r.assign(p, p + V);
  }
}

// Greedy pick_token (temperature 0) on row b of float32 logits [B, V], its first V entries,
// without the copy into doubles: the first index of the largest value (float to double is exact
// and keeps the order, so the same index), and the same error for a non-finite logit.
std::int64_t greedy_float(const Array& a, std::size_t b, std::size_t V) {
  const float* p = a.data<float>() + b * a.shape()[1];
  // The vector kernels of the fused attention's tiles where the CPU has them (finite, then max);
  // else branch-free loops (not finite: NaN fails the comparison, infinity exceeds the largest
  // float).
  const tile::Kernels* kz = tile::kernels();
  bool bad = false;
  float m = p[0];
  if (kz) {
    bad = !kz->finite(p, V);
    if (!bad) m = kz->max(p, V);
  } else {
    int nonfinite = 0;
    for (std::size_t i = 0; i < V; ++i) nonfinite |= !(std::fabs(p[i]) <= std::numeric_limits<float>::max());
    bad = nonfinite != 0;
    for (std::size_t i = 0; i < V; ++i) m = p[i] > m ? p[i] : m;
  }
  if (bad) {  // pick_token's message for the first non-finite logit
    std::vector<double> r(p, p + V);
    return pick_token(r, SampleOptions{});
  }
  return static_cast<std::int64_t>(std::find(p, p + V, m) - p);
}

IndexArray as_batch(const std::vector<std::vector<std::int64_t>>& seqs) {
  const std::size_t B = seqs.size(), T = seqs[0].size();
  std::vector<std::int64_t> flat;
  for (const auto& s : seqs) {
    if (s.size() != T) throw ValueError(op_message("generate", "prompts must have equal lengths"));
    flat.insert(flat.end(), s.begin(), s.end());
  }
  return IndexArray({B, T}, flat);
}

// Shared loop: `first` gives logits for the prompt, `next` for one more token per sample
// (given all tokens so far).
template <class First, class Next>
Generation run(std::size_t B, std::size_t max_new, const SampleOptions& opts, First first, Next next) {
  Generation g;
  g.tokens.assign(B, {});
  std::vector<bool> done(B, false);
  Array logits = first();
  std::vector<double> r;
  for (std::size_t step = 0; step < max_new; ++step) {
    if (opts.keep_logits) g.logits.push_back(logits);
    std::vector<std::int64_t> picked(B);
    const std::size_t V = logits.shape()[1];
    const std::size_t V_pick = opts.vocab_limit > 0 && opts.vocab_limit < V ? opts.vocab_limit : V;
    for (std::size_t b = 0; b < B; ++b) {
      if (opts.temperature == 0.0 && logits.dtype() == DType::float32 && V_pick > 0) {
        picked[b] = greedy_float(logits, b, V_pick);
      } else {
        row(logits, b, r);
        r.resize(V_pick);
        picked[b] = pick_token(r, opts);
      }
      if (done[b]) continue;
      g.tokens[b].push_back(picked[b]);
      if (picked[b] == opts.stop_token ||
          std::find(opts.stop_tokens.begin(), opts.stop_tokens.end(), picked[b]) != opts.stop_tokens.end() ||
          (opts.stop_when && opts.stop_when(b, g.tokens[b])))
        done[b] = true;
    }
    if (step + 1 == max_new || std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    logits = next(picked);
  }
  return g;
}

}  // namespace

std::int64_t pick_token(const std::vector<double>& logits, const SampleOptions& opts) {
  if (logits.empty()) throw ValueError(op_message("generate", "no logits to pick a token from"));
  for (std::size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      throw ValueError(op_message("generate", "the logit of token " + std::to_string(i) + " is " +
                                                  std::to_string(logits[i]) + ": the model's output is not finite"));
  if (!std::isfinite(opts.temperature) || opts.temperature < 0.0)
    throw ValueError(op_message("generate", "temperature must be finite and >= 0, got " + std::to_string(opts.temperature)));
  if (opts.temperature == 0.0)
    return static_cast<std::int64_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  if (!opts.generator) throw ValueError(op_message("generate", "sampling with temperature > 0 needs a generator"));
  if (!(opts.top_p > 0.0 && opts.top_p <= 1.0))
    throw ValueError(op_message("generate", "top_p must be in (0, 1], got " + number_text(opts.top_p)));
  std::vector<std::size_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return logits[a] > logits[b]; });
  const std::size_t k = opts.top_k ? std::min(opts.top_k, logits.size()) : logits.size();
  const double c = logits[order[0]] / opts.temperature;
  std::vector<double> p(k);
  double z = 0;
  for (std::size_t i = 0; i < k; ++i) z += p[i] = std::exp(logits[order[i]] / opts.temperature - c);
  if (!std::isfinite(z) || !(z > 0.0))
    throw ValueError(op_message("generate", "temperature " + std::to_string(opts.temperature) +
                                                " makes the sampling weights overflow"));
  std::size_t n = k;
  if (opts.top_p < 1.0) {  // the smallest prefix of the sorted tokens whose mass reaches top_p
    double mass = 0;
    for (n = 0; n < k && mass < opts.top_p * z;) mass += p[n++];
    z = mass;
  }
  double u = opts.generator->uniform() * z;
  for (std::size_t i = 0; i < n; ++i) {
    if (u < p[i]) return static_cast<std::int64_t>(order[i]);
    u -= p[i];
  }
  return static_cast<std::int64_t>(order[n - 1]);
}

Generation generate(GPT& model, const std::vector<std::vector<std::int64_t>>& prompts, std::size_t max_new,
                    const SampleOptions& opts) {
  if (prompts.empty() || prompts[0].empty()) throw ValueError(op_message("generate", "needs non-empty prompts"));
  NoGradGuard ng;
  const TransformerConfig& c = model.config();
  const std::size_t B = prompts.size(), P = prompts[0].size(), C = c.context;
  if (P > C)
    throw ValueError(op_message("generate", "the prompt has " + std::to_string(P) +
                                                " tokens, more than the model's context length " + std::to_string(C)));
  // A window no longer than the context over relative (or no) positions: the windowed cache
  // goes on past the context, each query seeing the W keys the model saw in training.
  const bool endless = opts.use_kv_cache && c.window > 0 && c.window <= C && c.pos != PositionScheme::learned;
  std::vector<std::vector<std::int64_t>> seqs = prompts;  // prompt and new tokens so far
  // The last C tokens of every sample: what the model sees past the context (nanoGPT's crop).
  const auto cropped = [&] {
    std::vector<std::vector<std::int64_t>> w;
    for (const auto& s : seqs) w.emplace_back(s.end() - static_cast<std::ptrdiff_t>(std::min(s.size(), C)), s.end());
    return as_batch(w);
  };
  std::vector<KVCache> caches;
  if (opts.use_kv_cache) caches = model.make_caches(B, endless ? P + max_new : std::min(P + max_new, C));
  return run(
      B, max_new, opts,
      [&] { return last_position(opts.use_kv_cache ? model.logits_cached(as_batch(prompts), caches)
                                                   : model.logits(as_batch(prompts))); },
      [&](const std::vector<std::int64_t>& picked) {
        for (std::size_t b = 0; b < B; ++b) seqs[b].push_back(picked[b]);
        if (opts.use_kv_cache && (endless || seqs[0].size() <= C))
          return last_position(model.logits_cached(IndexArray({B, 1}, picked), caches));
        return last_position(model.logits(cropped()));
      });
}

Generation generate(EncoderDecoder& model, const IndexArray& src, const std::vector<std::size_t>& src_lengths,
                    std::int64_t bos, std::size_t max_new, const SampleOptions& opts) {
  NoGradGuard ng;
  const std::size_t B = src.shape[0];
  const Tensor memory = model.encode(src, src_lengths);
  if (opts.use_kv_cache) {
    auto caches = model.make_caches(B, max_new + 1);
    const auto kv = model.memory_kv(memory);
    return run(
        B, max_new, opts,
        [&] {
          return last_position(model.decode_cached(IndexArray({B, 1}, std::vector<std::int64_t>(B, bos)), caches, kv,
                                                   src_lengths));
        },
        [&](const std::vector<std::int64_t>& picked) {
          return last_position(model.decode_cached(IndexArray({B, 1}, picked), caches, kv, src_lengths));
        });
  }
  std::vector<std::vector<std::int64_t>> seqs(B, std::vector<std::int64_t>{bos});
  return run(
      B, max_new, opts, [&] { return last_position(model.decode(as_batch(seqs), memory, src_lengths)); },
      [&](const std::vector<std::int64_t>& picked) {
        for (std::size_t b = 0; b < B; ++b) seqs[b].push_back(picked[b]);
        return last_position(model.decode(as_batch(seqs), memory, src_lengths));
      });
}

}  // namespace xg::nn
