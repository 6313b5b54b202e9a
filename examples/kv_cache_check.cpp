// A decoder of your own with a KV cache of your own, checked by the KV-cache checker
// (checks/kv_cache_check.hpp, docs/gradcheck.md): prefill, chunked and token-by-token
// decoding through the cache must give the full forward's outputs at every position.
//
//   build/bin/kv_cache_check                   the correct cache: every schedule agrees, exit 0
//   build/bin/kv_cache_check --bug positions   positions restart at 0 in every cached call
//   build/bin/kv_cache_check --bug drop-key    the cache forgets the newest key of each call
//   build/bin/kv_cache_check --bug stale-value after the first call, the cache never writes
//                                              the values (its slots stay zero)
//
// A broken cache still gives the right outputs for a prefill (one call sees the whole
// sequence), so the check fails on the first schedule that splits it, "token by token", and
// says where: exit status 1 and a line
//   KV cache: schedule "token by token" [1, 1, 1, 1, 1, 1, 1, 1]: position 1 (chunk 1, ...
// (position 2 for stale-value: position 1 still reads its own value from the current call).
// The rest of gradcheck_main's flags work as for `xgrad gradcheck` (--dtype float32, --json).
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include <xgrad/checks/kv_cache_check.hpp>
#include <xgrad/checks/suite_cli.hpp>
#include <xgrad/xgrad.hpp>

using namespace xg;

namespace {

std::string bug = "none";

// One layer: token and learned position embeddings, single-head causal self-attention with a
// residual, and an output projection to the vocabulary.
//   x = tok(t) + pos(p),  y = x + W_O attention(W_Q x, W_K x, W_V x),  logits = head(y)
class TinyDecoder : public nn::Module {
 public:
  TinyDecoder(std::size_t vocab, std::size_t context, std::size_t d, Generator& gen, DType dtype)
      : tok(vocab, d, gen, dtype, 0.5),
        pos(context, d, gen, dtype, 0.5),
        q(d, d, gen, false, dtype, 0.5),
        k(d, d, gen, false, dtype, 0.5),
        v(d, d, gen, false, dtype, 0.5),
        o(d, d, gen, false, dtype, 0.5),
        head(d, vocab, gen, true, dtype, 0.5) {
    register_module("tok", tok);
    register_module("pos", pos);
    register_module("q", q);
    register_module("k", k);
    register_module("v", v);
    register_module("o", o);
    register_module("head", head);
  }

  // What the decoder keeps between calls: the keys and values of every position seen so far,
  // [B, 1, S, d] (undefined before the first call), their absolute positions, and the
  // absolute position of the next token.
  struct Cache {
    Tensor K, V;
    std::vector<nn::Position> positions;
    std::size_t next_position = 0;
  };

  // The full forward: tokens [B, T] -> logits [B, T, vocab].
  Tensor forward(const IndexArray& tokens) const {
    const std::size_t T = tokens.shape[1];
    const Tensor x = embed(tokens, 0);
    const Tensor Y = nn::attention(heads(q(x)), heads(k(x)), heads(v(x)),
                                   nn::Visibility::causal(nn::Position(T), nn::Position(T)));
    return head(x + o(ops::squeeze(Y, 1)));
  }

  // The cached forward: the next n tokens [B, n] -> their logits [B, n, vocab], appending
  // their keys and values to the cache.
  Tensor forward_cached(Cache& c, const IndexArray& tokens_new) const {
    const std::size_t n = tokens_new.shape[1];
    const std::size_t start = bug == "positions" ? 0 : c.next_position;  // the bug: restart at 0
    const Tensor x = embed(tokens_new, start);
    const Tensor K_new = heads(k(x)), V_new = heads(v(x));
    std::vector<nn::Position> q_pos;
    for (std::size_t i = 0; i < n; ++i) q_pos.push_back(nn::Position(c.next_position + i));
    const Tensor K = c.K.defined() ? ops::concat({c.K, K_new}, 2) : K_new;
    const Tensor V = c.V.defined() ? ops::concat({c.V, V_new}, 2) : V_new;
    std::vector<nn::Position> k_pos = c.positions;
    k_pos.insert(k_pos.end(), q_pos.begin(), q_pos.end());
    const Tensor Y = nn::attention(heads(q(x)), K, V, nn::Visibility::causal(q_pos, k_pos));
    // Keep what the next call needs.
    if (bug == "drop-key" && n > 0) {  // the bug: the newest key is not kept (nor its value and position)
      const long S = long(K.shape()[2]);
      c.K = S > 1 ? ops::slice(K, 2, 0, S - 1) : Tensor();
      c.V = S > 1 ? ops::slice(V, 2, 0, S - 1) : Tensor();
      c.positions = k_pos;
      c.positions.pop_back();
    } else if (bug == "stale-value" && c.V.defined()) {  // the bug: this call's value slots never written
      c.K = K;
      c.V = ops::concat({c.V, Tensor(Array::zeros(V_new.shape(), V_new.dtype()))}, 2);
      c.positions = k_pos;
    } else {
      c.K = K;
      c.V = V;
      c.positions = k_pos;
    }
    c.next_position += n;
    return head(x + o(ops::squeeze(Y, 1)));
  }

  nn::Embedding tok, pos;
  nn::Linear q, k, v, o, head;

 private:
  // Token plus position embeddings of positions start .. start + n - 1: [B, n, d].
  Tensor embed(const IndexArray& tokens, std::size_t start) const {
    const std::size_t n = tokens.shape[1];
    std::vector<std::int64_t> p(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = std::int64_t(start + i);
    return tok(tokens) + pos(IndexArray({1, n}, p));
  }
  // [B, T, d] -> one head [B, 1, T, d].
  static Tensor heads(const Tensor& x) { return ops::unsqueeze(x, 1); }
};

}  // namespace

// The check: the decoder, a fresh cache per schedule, and the cached forward; 2 sequences of
// 8 tokens. The checker runs prefill, token by token, chunks 1,2,3, an uneven split and
// prefill-then-decode, and prefix isolation of the full forward.
XG_KVCACHE_CHECK("tiny_decoder/kv-cache", "1 layer, d 8, vocab 13, tokens (2, 8); 5 schedules") {
  auto model = std::make_shared<TinyDecoder>(13, 8, 8, ctx.gen(), ctx.dtype());
  std::vector<std::int64_t> ids(16);
  for (auto& t : ids) t = std::int64_t(ctx.gen().below(13));
  return KVCacheCheck{kv_cache_decoder([model](const IndexArray& t) { return model->forward(t); },
                                       [] { return TinyDecoder::Cache{}; },
                                       [model](TinyDecoder::Cache& c, const IndexArray& t) {
                                         return model->forward_cached(c, t);
                                       }),
                      IndexArray({2, 8}, ids),
                      {}};
}

int main(int argc, char** argv) {
  return gradcheck_main(
      default_gradcheck_suite(), argc, argv,
      [](CLI::App& app) {
        app.add_option("--bug", bug, "Break the cache on purpose: none, positions, drop-key, stale-value")
            ->check(CLI::IsMember({"none", "positions", "drop-key", "stale-value"}));
      },
      "kv_cache_check: a decoder's KV cache against its full forward (docs/gradcheck.md)");
}
