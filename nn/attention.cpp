// Forward of both layers (SPEC 6-8):
//   P = X W_QKV + b_QKV = [X W_Q, X W_K, X W_V]                 (5.22)
//   Q, K, V = split_heads(P slices); O = attention(Q, K, V)      (5.3, 5.36)
//   C = merge_heads(O) = concat_h O^(h);  Y = C W_O + b_O        (5.20), (5.21)
// Backward is the tape's, by composition; checks/attention_reference.cpp derives the same
// gradients in closed form (5.24)-(5.31) and the tests compare the two.
#include <xgrad/nn/attention.hpp>

#include <algorithm>
#include <cmath>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/nn/detail/adapter_check.hpp>
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/nn/lora.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/join.hpp>
#include <xgrad/ops/matmul.hpp>
#include <xgrad/ops/shape_ops.hpp>

namespace xg::nn {

namespace {

long L(std::size_t v) { return static_cast<long>(v); }

// Xavier-uniform [fan_in, fan_out] from gen; zeros without one (weights set afterwards).
Array xavier(std::size_t fan_in, std::size_t fan_out, Generator* gen, DType dtype) {
  if (!gen) return Array::zeros({fan_in, fan_out}, dtype);
  const double a = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return random_uniform({fan_in, fan_out}, *gen, dtype, -a, a);
}

void check_heads(const std::string& op, std::size_t d, const char* d_name, std::size_t H_q, std::size_t H_kv,
                 std::size_t d_head) {
  if (d == 0 || H_q == 0) throw ValueError(op_message(op, std::string(d_name) + " and H_q must be positive"));
  if (H_kv == 0 || H_q % H_kv != 0)
    throw ValueError(op_message(op, "H_q (" + std::to_string(H_q) + ") must be a multiple of H_kv (" +
                                        std::to_string(H_kv) + ")"));
  if (d_head == 0 && d % H_q != 0)
    throw ValueError(op_message(op, std::string(d_name) + " (" + std::to_string(d) + ") is not divisible by H_q (" +
                                        std::to_string(H_q) + "); set d_head explicitly"));
}

void check_input(const std::string& op, const char* name, const Tensor& X, std::size_t width, DType dtype) {
  if (!X.defined() || X.ndim() != 3 || X.shape()[2] != width)
    throw ShapeError(op_message(op, std::string(name) + " must be [B, length, " + std::to_string(width) +
                                        "], has shape " + (X.defined() ? shape_str(X.shape()) : "undefined")));
  if (X.dtype() != dtype)
    throw DTypeError(op_message(op, std::string(name) + " is " + dtype_name(X.dtype()) + ", the layer is " +
                                        dtype_name(dtype) + "; convert one of them so both are the same dtype"));
}

void check_finite_input(const Array& a, const char* name, const std::string& why) {
  const std::size_t i = a.first_nonfinite();
  if (i == a.size()) return;
  throw ValueError(op_message("attention", std::string(name) + " has " + std::to_string(a.flat(i)) + " at index (" +
                                               index_list(unravel_index(i, a.shape())) + "); " + why));
}

}  // namespace

void check_positions(const std::string& op, const std::vector<Position>& positions, std::size_t T) {
  if (positions.size() != T)
    throw ShapeError(op_message(op, "positions has " + std::to_string(positions.size()) +
                                        " entries, the input has T = " + std::to_string(T) + " positions"));
  for (std::size_t i = 0; i < T; ++i)
    if (positions[i] < 0)
      throw ValueError(op_message(op, "positions[" + std::to_string(i) + "] = " + std::to_string(positions[i]) +
                                          " is negative; positions are absolute, >= 0"));
}

namespace {

SdpaOptions sdpa_options(const AttentionCall& call, SdpaImpl impl, const std::optional<double>& scale, double dropout,
                         bool training) {
  SdpaOptions o;
  o.impl = impl;
  o.scale = scale;
  o.query_valid = call.query_valid;
  o.dropout_p = dropout;
  o.training = training;
  o.generator = call.generator;
  o.return_weights = call.return_weights;
  o.check_finite = call.check_finite;
  return o;
}

}  // namespace

Tensor split_heads(const Tensor& X, std::size_t H) {
  const Shape& s = X.shape();
  return ops::permute(ops::reshape(X, {L(s[0]), L(s[1]), L(H), L(s[2] / H)}), {0, 2, 1, 3});
}

Tensor merge_heads(const Tensor& O) {
  const Shape& s = O.shape();  // [B, H, T, d_h]
  return ops::reshape(ops::permute(O, {0, 2, 1, 3}), {L(s[0]), L(s[2]), L(s[1] * s[3])});
}

// ---------------------------------------------------------------------------------------

MultiHeadAttention::MultiHeadAttention(const AttentionConfig& cfg, Generator& gen) : cfg_(cfg) { init(&gen); }

MultiHeadAttention::MultiHeadAttention(const AttentionConfig& cfg,
                                       const std::vector<std::pair<std::string, Array>>& weights)
    : cfg_(cfg) {
  init(nullptr);
  set_weights(weights);
}

void MultiHeadAttention::init(Generator* gen) {
  if (cfg_.H_kv == 0) cfg_.H_kv = cfg_.H_q;
  check_heads("attention", cfg_.d_model, "d_model", cfg_.H_q, cfg_.H_kv, cfg_.d_head);
  d_h_ = cfg_.d_head ? cfg_.d_head : cfg_.d_model / cfg_.H_q;
  if (cfg_.rope) ops::rope_rotary_dims("attention", *cfg_.rope, d_h_);  // checks the RoPE config
  if (cfg_.alibi) slopes_ = alibi_slopes(cfg_.H_q);
  if (!cfg_.core.empty()) core_ = make_attention(cfg_.core);  // ValueError naming it when not registered
  const std::size_t width = (cfg_.H_q + 2 * cfg_.H_kv) * d_h_;
  W_QKV = register_parameter("W_QKV", xavier(cfg_.d_model, width, gen, cfg_.dtype));
  if (cfg_.bias) b_QKV = register_parameter("b_QKV", Array::zeros({width}, cfg_.dtype));
  W_O = register_parameter("W_O", xavier(cfg_.H_q * d_h_, cfg_.d_model, gen, cfg_.dtype));
  if (cfg_.bias) b_O = register_parameter("b_O", Array::zeros({cfg_.d_model}, cfg_.dtype));
}

const char* MultiHeadAttention::projection_name(Projection p) {
  switch (p) {
    case Projection::q: return "q";
    case Projection::k: return "k";
    case Projection::v: return "v";
    case Projection::o: return "o";
  }
  return "?";
}

std::pair<std::size_t, std::size_t> MultiHeadAttention::projection_widths(Projection p) const {
  switch (p) {
    case Projection::q: return {cfg_.d_model, cfg_.H_q * d_h_};
    case Projection::k:
    case Projection::v: return {cfg_.d_model, cfg_.H_kv * d_h_};
    case Projection::o: return {cfg_.H_q * d_h_, cfg_.d_model};
  }
  throw InternalError(op_message("attention", "unknown projection"));
}

void MultiHeadAttention::set_adapter(Projection p, std::unique_ptr<Adapter> adapter) {
  const std::string name = projection_name(p);
  auto& slot = adapters_.at(static_cast<std::size_t>(p));
  if (slot)
    throw ValueError(op_message("attention", "set_adapter: projection " + name +
                                                 " has an adapter already; merge or remove it first"));
  const auto [d_in, d_out] = projection_widths(p);
  detail::check_adapter("attention", "projection " + name, adapter.get(), d_in, d_out, cfg_.dtype);
  register_module(name, *adapter);
  slot = std::move(adapter);
}

std::unique_ptr<Adapter> MultiHeadAttention::remove_adapter(Projection p) {
  auto& slot = adapters_.at(static_cast<std::size_t>(p));
  if (slot) unregister_module(*slot);
  return std::move(slot);
}

void MultiHeadAttention::merge_adapter(Projection p) {
  const Adapter* a = adapter(p);
  if (!a)
    throw ValueError(op_message("attention", std::string("merge_adapter: projection ") + projection_name(p) +
                                                 " has no adapter"));
  Tensor& W = p == Projection::o ? W_O : W_QKV;
  Array merged;
  {
    NoGradGuard ng;
    Tensor delta(a->weight_delta());
    if (p != Projection::o) {  // zero columns around the projection's block of W_QKV
      const std::size_t q = cfg_.H_q * d_h_, kv = cfg_.H_kv * d_h_;
      const std::size_t before = p == Projection::q ? 0 : p == Projection::k ? q : q + kv;
      const std::size_t after = W_QKV.shape()[1] - before - delta.shape()[1];
      std::vector<Tensor> parts;
      if (before) parts.emplace_back(Array::zeros({cfg_.d_model, before}, cfg_.dtype));
      parts.push_back(delta);
      if (after) parts.emplace_back(Array::zeros({cfg_.d_model, after}, cfg_.dtype));
      delta = parts.size() == 1 ? delta : ops::concat(parts, 1);
    }
    merged = (Tensor(W.value()) + delta).value();
  }
  W.set_value(merged);
  remove_adapter(p);
}

// Low-rank adapters on q, k, v as one: A = [A_q A_k A_v] (scales folded in) and B the
// block-diagonal [B_q; B_k; B_v] placed in their column blocks, so that the projection with
// every adapter is one nn::lora_affine op, X W_QKV + b_QKV + (X A) B, whose tape entry holds no
// intermediate. Undefined when an adapter present is not low-rank.
Tensor MultiHeadAttention::packed_low_rank(const Tensor& X, const Adapter* const a[3],
                                           const std::size_t widths[3]) const {
  std::vector<Tensor> As, rows;
  const std::size_t total = widths[0] + widths[1] + widths[2];
  std::size_t offset = 0;
  for (std::size_t i = 0; i < 3; offset += widths[i], ++i) {
    if (!a[i]) continue;
    Tensor A, B;
    if (!a[i]->low_rank(A, B)) return Tensor();
    const std::size_t r = B.shape()[0];
    std::vector<Tensor> row;
    if (offset > 0) row.emplace_back(Array::zeros({r, offset}, cfg_.dtype));
    row.push_back(B);
    if (offset + widths[i] < total) row.emplace_back(Array::zeros({r, total - offset - widths[i]}, cfg_.dtype));
    As.push_back(A);
    rows.push_back(row.size() == 1 ? row[0] : ops::concat(row, 1));
  }
  const Tensor A = As.size() == 1 ? As[0] : ops::concat(As, 1);
  const Tensor B = rows.size() == 1 ? rows[0] : ops::concat(rows, 0);
  return lora_affine(X, W_QKV, b_QKV, A, B, 1.0);
}

Tensor MultiHeadAttention::packed(const Tensor& X) const {
  const Adapter* a[3] = {adapter(Projection::q), adapter(Projection::k), adapter(Projection::v)};
  if (a[0] || a[1] || a[2]) {
    const std::size_t widths[3] = {cfg_.H_q * d_h_, cfg_.H_kv * d_h_, cfg_.H_kv * d_h_};
    if (const Tensor fused = packed_low_rank(X, a, widths); fused.defined()) return fused;
  }
  const Tensor P = ops::linear(X, W_QKV, b_QKV);  // (5.22)
  if (!a[0] && !a[1] && !a[2]) return P;
  // Adapters without low-rank factors: their terms in their column blocks, zeros where a
  // block has none.
  const std::size_t widths[3] = {cfg_.H_q * d_h_, cfg_.H_kv * d_h_, cfg_.H_kv * d_h_};
  std::vector<Tensor> parts;
  for (std::size_t i = 0; i < 3; ++i) {
    if (a[i]) {
      parts.push_back((*a[i])(X));
    } else {
      Shape s = X.shape();
      s.back() = widths[i];
      parts.emplace_back(Array::zeros(s, cfg_.dtype));
    }
  }
  return P + ops::concat(parts, -1);
}

Tensor MultiHeadAttention::output(const Tensor& C) const {
  const Adapter* a = adapter(Projection::o);
  if (a) return a->project(C, W_O, b_O);  // the whole projection (one op for LoRA)
  return ops::linear(C, W_O, b_O);
}

void MultiHeadAttention::split(const Tensor& P, Tensor& Q, Tensor& K, Tensor& V) const {
  const auto parts = ops::split(P, {cfg_.H_q * d_h_, cfg_.H_kv * d_h_, cfg_.H_kv * d_h_}, -1);
  Q = split_heads(parts[0], cfg_.H_q);
  K = split_heads(parts[1], cfg_.H_kv);
  V = split_heads(parts[2], cfg_.H_kv);
}

Tensor MultiHeadAttention::registered_core(const Tensor& Q, const Tensor& K, const Tensor& V, const Visibility& vis,
                                           const AttentionCall& call) const {
  const std::string who = "the registered attention '" + cfg_.core + "'";
  if (call.return_weights)
    throw ValueError(op_message("attention", who + " gives no weights: attention maps (return_weights) need the "
                                                   "built-in core"));
  const Tensor O = core_(Q, K, V, vis, sdpa_options(call, cfg_.impl, cfg_.scale, cfg_.dropout, training()));
  const Shape want = {Q.shape()[0], cfg_.H_q, Q.shape()[2], V.shape()[3]};
  if (!O.defined() || O.shape() != want)
    throw ShapeError(op_message("attention", who + " returned " + (O.defined() ? shape_str(O.shape()) : "nothing") +
                                                 ", expected O [B, H_q, T, d_v] = " + shape_str(want)));
  if (O.dtype() != Q.dtype())
    throw DTypeError(op_message("attention", who + " returned " + dtype_name(O.dtype()) + ", expected Q's dtype " +
                                                 dtype_name(Q.dtype())));
  return O;
}

AttentionOutput MultiHeadAttention::finish(const Tensor& Q, const Tensor& K, const Tensor& V, const Visibility& vis,
                                           const AttentionCall& call) {
  if (core_) {
    AttentionOutput out;
    out.Y = output(merge_heads(registered_core(Q, K, V, vis, call)));  // (5.20)
    return out;
  }
  const SdpaResult r = scaled_dot_product_attention(Q, K, V, vis, sdpa_options(call, cfg_.impl, cfg_.scale, cfg_.dropout, training()));
  return {output(merge_heads(r.output)), r.weights, r.dropout_mask, r.dropout_seed, r.path};  // (5.20)
}

Visibility MultiHeadAttention::position_bias(const std::vector<Position>& q_pos,
                                             const std::vector<Position>& k_pos) const {
  return cfg_.alibi ? Visibility::alibi(slopes_, q_pos, k_pos) : Visibility::all();
}

AttentionOutput MultiHeadAttention::forward(const Tensor& X, const AttentionCall& call) {
  check_input("attention", "X", X, cfg_.d_model, cfg_.dtype);
  const Tensor P = packed(X);  // (5.22)
  const std::size_t T = X.shape()[1];
  const bool given = !call.positions.empty();
  if (given) check_positions("attention", call.positions, T);
  Visibility vis = call.visibility;
  if (cfg_.window > 0) {
    const Position W = static_cast<Position>(cfg_.window);
    vis = (given ? Visibility::sliding_window(call.positions, call.positions, W)
                 : Visibility::sliding_window(static_cast<Position>(T), static_cast<Position>(T), W)) &
          vis;
  }
  std::vector<Position> pos = call.positions;
  if (!given && (cfg_.rope || cfg_.alibi)) {  // absolute positions 0 .. T-1, as the causal visibility uses
    pos.resize(T);
    for (std::size_t i = 0; i < T; ++i) pos[i] = static_cast<Position>(i);
  }
  if (cfg_.alibi) vis = position_bias(pos, pos) & vis;
  // RoPE rotates the Q and K heads where they lie in P (bit for bit ops::rope on each head).
  const Tensor Pr = cfg_.rope ? ops::rope_heads(P, cfg_.H_q + cfg_.H_kv, d_h_, pos, *cfg_.rope) : P;
  // The fused path reads the heads from P in place and merges them on the way out.
  SdpaResult r;
  const SdpaOptions o = sdpa_options(call, cfg_.impl, cfg_.scale, cfg_.dropout, training());
  if (!core_ && packed_self_attention(Pr, cfg_.H_q, cfg_.H_kv, vis, o, r))
    return {output(r.output), r.weights, r.dropout_mask, r.dropout_seed, r.path};  // (5.20)
  Tensor Q, K, V;
  split(Pr, Q, K, V);
  return finish(Q, K, V, vis, call);
}

Tensor MultiHeadAttention::operator()(const Tensor& X, const Visibility& vis) {
  AttentionCall call;
  call.visibility = vis;
  return forward(X, call).Y;
}

bool MultiHeadAttention::one_query_step(const AttentionCall& call, std::size_t n, const Tensor& P) const {
  const bool scale_ok = !cfg_.scale || (std::isfinite(*cfg_.scale) && *cfg_.scale > 0.0);
  const bool dropout = training() && cfg_.dropout > 0.0;
  return n == 1 && !core_ && !cfg_.alibi && cfg_.impl != SdpaImpl::composed && scale_ok && !dropout && !call.return_weights &&
         call.query_valid.size() == 0 && call.visibility.unconstrained() && !(grad_enabled() && P.requires_grad()) &&
         (P.dtype() == DType::float32 || P.dtype() == DType::float64);
}

KVCache MultiHeadAttention::make_cache(std::size_t batch, std::size_t capacity) const {
  // Room for min(W, capacity) positions: a window longer than the sequence costs no memory.
  if (cfg_.window > 0) return KVCache::windowed(batch, cfg_.H_kv, cfg_.window, d_h_, d_h_, cfg_.dtype, capacity);
  return KVCache(batch, cfg_.H_kv, capacity, d_h_, d_h_, cfg_.dtype);
}

AttentionOutput MultiHeadAttention::forward_cached(const Tensor& X_new, KVCache& cache, const AttentionCall& call) {
  if (cache.window() != 0 && (cfg_.window == 0 || cache.window() < cfg_.window))
    throw ValueError(op_message("attention", "forward_cached: the cache keeps a window of " +
                                                 std::to_string(cache.window()) + " positions, the layer sees " +
                                                 (cfg_.window ? std::to_string(cfg_.window) : std::string("every")) +
                                                 " positions; make the cache with make_cache()"));
  if (!call.positions.empty())
    throw ValueError(op_message("attention", "forward_cached: call.positions must be empty (" +
                                                 std::to_string(call.positions.size()) +
                                                 " given); the cache numbers the new positions from "
                                                 "next_position()"));
  check_input("attention", "X", X_new, cfg_.d_model, cfg_.dtype);
  const Tensor P = packed(X_new);  // (5.22)
  const std::size_t start = cache.next_position(), n = X_new.shape()[1];
  std::vector<std::int64_t> q_pos(n);
  for (std::size_t i = 0; i < n; ++i) q_pos[i] = static_cast<std::int64_t>(start + i);
  if (one_query_step(call, n, P)) return decoding_step(P, cache, call, q_pos);
  Tensor Q, K, V;
  split(P, Q, K, V);
  if (cfg_.rope) {  // the new keys are cached already rotated at their own positions
    Q = ops::rope(Q, q_pos, *cfg_.rope);
    K = ops::rope(K, q_pos, *cfg_.rope);
  }
  cache.append(K.value(), V.value());
  try {  // a failed call leaves the cache as it was
    const std::vector<std::int64_t> k_pos = cache.positions();
    const Visibility base = cfg_.window ? Visibility::sliding_window(q_pos, k_pos, static_cast<Position>(cfg_.window))
                                        : Visibility::causal(q_pos, k_pos);
    Visibility vis = base & call.visibility;
    if (cfg_.alibi) vis = position_bias(q_pos, k_pos) & vis;
    return finish(Q, Tensor(cache.keys()), Tensor(cache.values()), vis, call);
  } catch (...) {
    cache.truncate(start);
    throw;
  }
}

AttentionOutput MultiHeadAttention::decoding_step(const Tensor& P, KVCache& cache, const AttentionCall& call,
                                                  const std::vector<std::int64_t>& q_pos) {
  // One position per sample, so P [B, 1, (H_q + 2 H_kv) d_h] holds in each row the heads of Q, K
  // and V one after the other, each head's features contiguous: the layout of Q [B, H_q, 1, d_h]
  // (K, V [B, H_kv, 1, d_h]) row by row, and O [B, H_q, 1, d_h] is that of merge_heads(O)
  // [B, 1, H_q d_h]. So the heads are copied out of P and O is viewed merged, without the ops of
  // split(), split_heads(), rope() on each and merge_heads(): the same values (RoPE rotates the
  // Q and K heads in P, bit for bit ops::rope on each head).
  const std::size_t start = static_cast<std::size_t>(q_pos[0]);
  const std::size_t B = P.shape()[0], Hq = cfg_.H_q, Hkv = cfg_.H_kv, d = d_h_, width = (Hq + 2 * Hkv) * d;
  const Array Pr = (cfg_.rope ? ops::rope_heads(P, Hq + Hkv, d, q_pos, *cfg_.rope) : P).value();
  Array Q = Array::empty({B, Hq, 1, d}, Pr.dtype()), K = Array::empty({B, Hkv, 1, d}, Pr.dtype()),
        V = Array::empty({B, Hkv, 1, d}, Pr.dtype());
  xg::detail::dispatch(Pr.dtype(), [&](auto t) {
    using T = decltype(t);
    const T* p = Pr.data<T>();
    T* q = Q.data<T>();
    T* k = K.data<T>();
    T* v = V.data<T>();
    for (std::size_t b = 0; b < B; ++b, p += width) {
      std::copy(p, p + Hq * d, q + b * Hq * d);
      std::copy(p + Hq * d, p + (Hq + Hkv) * d, k + b * Hkv * d);
      std::copy(p + (Hq + Hkv) * d, p + width, v + b * Hkv * d);
    }
  });
  cache.append(K, V);
  try {  // a failed call leaves the cache as it was
    // The query sees every cached key from its window's start on. attention_one_query reads
    // them in place (no copy of the cache, no visibility plan), with the fused path's
    // arithmetic: the same output to the bit.
    const std::size_t first = cache.first_position();
    const std::size_t lo_pos = cfg_.window > 0 && start + 1 > cfg_.window ? std::max(first, start + 1 - cfg_.window)
                                                                          : first;
    const double scale = cfg_.scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
    if (call.check_finite) {  // the new Q, K and V; the cached ones were checked as they came
      const std::string why = "attention inputs must be finite (Algorithm 5.1 step 1; check_finite = false skips this)";
      check_finite_input(Q, "Q", why);
      check_finite_input(K, "K", why);
      check_finite_input(V, "V", why);
    }
    const Array O = attention_one_query(Q, cache.key_buffer(), cache.value_buffer(), lo_pos - first, cache.length(),
                                        scale, call.check_finite, cache.key_columns());
    AttentionOutput out;
    out.Y = output(Tensor(O.view({B, 1, Hq * d})));  // (5.20)
    out.path = SdpaImpl::fused;
    return out;
  } catch (...) {
    cache.truncate(start);
    throw;
  }
}

// ---------------------------------------------------------------------------------------

CrossAttention::CrossAttention(const CrossAttentionConfig& cfg, Generator& gen) : cfg_(cfg) { init(&gen); }

CrossAttention::CrossAttention(const CrossAttentionConfig& cfg, const std::vector<std::pair<std::string, Array>>& weights)
    : cfg_(cfg) {
  init(nullptr);
  set_weights(weights);
}

void CrossAttention::init(Generator* gen) {
  if (cfg_.H_kv == 0) cfg_.H_kv = cfg_.H_q;
  if (cfg_.d_out == 0) cfg_.d_out = cfg_.d_q;
  check_heads("cross_attention", cfg_.d_q, "d_q", cfg_.H_q, cfg_.H_kv, cfg_.d_head);
  if (cfg_.d_m == 0) throw ValueError(op_message("cross_attention", "d_m must be positive"));
  d_h_ = cfg_.d_head ? cfg_.d_head : cfg_.d_q / cfg_.H_q;
  W_Q = register_parameter("W_Q", xavier(cfg_.d_q, cfg_.H_q * d_h_, gen, cfg_.dtype));
  if (cfg_.bias) b_Q = register_parameter("b_Q", Array::zeros({cfg_.H_q * d_h_}, cfg_.dtype));
  W_KV = register_parameter("W_KV", xavier(cfg_.d_m, 2 * cfg_.H_kv * d_h_, gen, cfg_.dtype));
  if (cfg_.bias) b_KV = register_parameter("b_KV", Array::zeros({2 * cfg_.H_kv * d_h_}, cfg_.dtype));
  W_O = register_parameter("W_O", xavier(cfg_.H_q * d_h_, cfg_.d_out, gen, cfg_.dtype));
  if (cfg_.bias) b_O = register_parameter("b_O", Array::zeros({cfg_.d_out}, cfg_.dtype));
}

std::pair<Tensor, Tensor> CrossAttention::project_memory(const Tensor& X_m) const {
  check_input("cross_attention", "X_m", X_m, cfg_.d_m, cfg_.dtype);
  const auto kv = ops::chunk(ops::linear(X_m, W_KV, b_KV), 2, -1);  // [X_m W_K, X_m W_V]
  return {split_heads(kv[0], cfg_.H_kv), split_heads(kv[1], cfg_.H_kv)};
}

AttentionOutput CrossAttention::forward_with_memory(const Tensor& X_q, const std::pair<Tensor, Tensor>& KV,
                                                    const AttentionCall& call) {
  check_input("cross_attention", "X_q", X_q, cfg_.d_q, cfg_.dtype);
  if (!call.positions.empty())
    throw ValueError(op_message("cross_attention", "call.positions must be empty (" +
                                                       std::to_string(call.positions.size()) +
                                                       " given): cross-attention uses no positions"));
  const Tensor Q = split_heads(ops::linear(X_q, W_Q, b_Q), cfg_.H_q);
  const SdpaResult r = scaled_dot_product_attention(Q, KV.first, KV.second, call.visibility,
                                                    sdpa_options(call, cfg_.impl, cfg_.scale, cfg_.dropout, training()));
  return {ops::linear(merge_heads(r.output), W_O, b_O), r.weights, r.dropout_mask, r.dropout_seed, r.path};
}

AttentionOutput CrossAttention::forward(const Tensor& X_q, const Tensor& X_m, const AttentionCall& call) {
  return forward_with_memory(X_q, project_memory(X_m), call);
}

}  // namespace xg::nn
