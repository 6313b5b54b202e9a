// LoRA and frozen weights (nn/lora.hpp, nn/adapter.hpp, Module::freeze): the zero start equals
// the base bit for bit, the forward against y = x W + b + (alpha / r) (x A) B written out element
// by element, gradchecks, frozen parameters getting no gradient and no optimizer state, merging
// within a derived rounding bound, the trainable share of a stories15M-shaped model against a
// hand count, and the bad-input errors.
#include <cmath>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/kv_head_pooling.hpp>

using namespace xg;
using namespace xgt;
using P = nn::MultiHeadAttention::Projection;

namespace {

nn::TransformerConfig tiny_llama(DType dtype = DType::float64, std::size_t layers = 2) {
  nn::TransformerConfig c;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = 13;
  c.context = 16;
  c.d_model = 16;
  c.H_q = 4;
  c.H_kv = 2;  // GQA: k and v map 16 -> 8
  c.layers = layers;
  c.multiple_of = 8;  // d_ff 48
  c.dtype = dtype;
  return c;
}

nn::TransformerConfig tiny_gpt2(DType dtype = DType::float64) {
  nn::TransformerConfig c;
  c.V_vocab = 13;
  c.context = 16;
  c.d_model = 16;
  c.H_q = 4;
  c.layers = 2;
  c.dtype = dtype;
  return c;
}

// Every parameter whose name contains `part` re-drawn from uniform [-a, a].
void randomise(nn::Module& m, Generator& g, const std::string& part = "", double a = 0.3) {
  for (auto& [name, p] : m.named_parameters()) {
    if (name.find(part) == std::string::npos) continue;
    Tensor t = p;
    t.set_value(random_uniform(t.shape(), g, t.dtype(), -a, a));
  }
}

IndexArray tokens(Generator& g, std::size_t B, std::size_t T, std::size_t V) {
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = static_cast<std::int64_t>(g.below(V));
  return IndexArray({B, T}, ids);
}

std::set<std::string> names(const nn::Module& m) {
  std::set<std::string> s;
  for (const auto& [n, t] : m.named_parameters()) s.insert(n);
  return s;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_adapter_param(const std::string& n) { return ends_with(n, ".lora_A") || ends_with(n, ".lora_B"); }

// C = X Y for row-major X [n, k] and Y [k, m], summed in float64 element by element.
std::vector<double> matmul_loops(const Array& X, const Array& Y) {
  const std::size_t n = X.shape()[0], k = X.shape()[1], m = Y.shape()[1];
  std::vector<double> C(n * m, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < m; ++j) {
      double s = 0.0;
      for (std::size_t t = 0; t < k; ++t) s += X.flat(i * k + t) * Y.flat(t * m + j);
      C[i * m + j] = s;
    }
  return C;
}

Array abs_of(const Array& a) {
  std::vector<double> v(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) v[i] = std::fabs(a.flat(i));
  return Array::from_vector(a.shape(), v, DType::float64);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The layer

TEST_CASE("lora: B starts at zero so a LoRALinear equals its base Linear bit for bit", "[lora]") {
  Generator gen(1);
  for (DType dt : {DType::float32, DType::float64}) {
    nn::Linear base(12, 7, gen, true, dt);
    randomise(base, gen);
    nn::LoRALinear l(base, {4, 8.0}, gen);
    const Tensor x(random_uniform({3, 5, 12}, gen, dt, -1, 1));
    // Same matmul on the same shapes, then + exact zeros: the bits are guaranteed.
    XGT_CHECK_SAME(l(x).value(), base(x).value());
    CHECK(max_abs(l.lora.lora_B.value()) == 0.0);
    CHECK(max_abs(l.lora.lora_A.value()) > 0.0);
    // kaiming-uniform as peft: every element within 1/sqrt(d_in)
    CHECK(max_abs(l.lora.lora_A.value()) <= 1.0 / std::sqrt(12.0));
  }
}

TEST_CASE("lora: the forward equals x W + b + (alpha / r) (x A) B written out in float64", "[lora]") {
  Generator gen(2);
  nn::Linear base(9, 6, gen, true, DType::float64);
  randomise(base, gen);
  const nn::LoRAConfig cfg{3, 5.0};
  nn::LoRALinear l(base, cfg, gen);
  randomise(l, gen, "lora_B");
  const double s = 5.0 / 3.0;  // alpha / r
  REQUIRE(l.lora.scale() == s);
  const Array x = random_uniform({4, 9}, gen, DType::float64, -1, 1);
  const Array y = l(Tensor(x)).value();
  const auto xW = matmul_loops(x, base.W.value());
  const auto xA = matmul_loops(x, l.lora.lora_A.value());
  const auto axW = matmul_loops(abs_of(x), abs_of(base.W.value()));
  const auto axA = matmul_loops(abs_of(x), abs_of(l.lora.lora_A.value()));
  std::vector<double> want(4 * 6);
  double scale = 0.0;  // the largest sum of |terms| of an element, for the bound
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 6; ++j) {
      double low = 0.0, abs_low = 0.0;
      for (std::size_t t = 0; t < 3; ++t) {
        low += xA[i * 3 + t] * l.lora.lora_B.value().flat(t * 6 + j);
        abs_low += axA[i * 3 + t] * std::fabs(l.lora.lora_B.value().flat(t * 6 + j));
      }
      want[i * 6 + j] = xW[i * 6 + j] + base.b.value().flat(j) + s * low;
      scale = std::max(scale, axW[i * 6 + j] + std::fabs(base.b.value().flat(j)) + abs_low * s);
    }
  XGT_CHECK_WITHIN(y, Array::from_vector({4, 6}, want, DType::float64),
                   rounding_bound(9 + 3 + 2, DType::float64, scale));
  // The same through the Linear hook: an attached LoRA with the same factors.
  nn::Linear hooked(base.W.value(), base.b.value());
  auto a = std::make_unique<nn::LoRA>(9, 6, cfg, gen, DType::float64);
  Tensor A = a->lora_A, B = a->lora_B;
  A.set_value(l.lora.lora_A.value());
  B.set_value(l.lora.lora_B.value());
  hooked.set_adapter(std::move(a));
  XGT_CHECK_WITHIN(hooked(Tensor(x)).value(), Array::from_vector({4, 6}, want, DType::float64),
                   rounding_bound(9 + 3 + 2, DType::float64, scale));
  CHECK(names(hooked) == std::set<std::string>{"W", "b", "lora_A", "lora_B"});
  CHECK(names(l) == std::set<std::string>{"W", "b", "lora_A", "lora_B"});
}

TEST_CASE("lora: attention adapters equal the projections with W + s A B written out", "[lora]") {
  Generator gen(3);
  nn::AttentionConfig c;
  c.d_model = 16;
  c.H_q = 4;
  c.H_kv = 2;
  c.dtype = DType::float64;
  c.rope = ops::RopeConfig{};
  nn::MultiHeadAttention m(c, gen);
  randomise(m, gen);
  const nn::LoRAConfig cfg{2, 3.0};
  std::map<P, std::pair<Array, Array>> factors;
  for (P p : {P::q, P::k, P::v, P::o}) {
    const std::size_t d_in = 16, d_out = p == P::q || p == P::o ? 16 : 8;  // k, v: H_kv d_h = 8
    auto a = std::make_unique<nn::LoRA>(d_in, d_out, cfg, gen, DType::float64);
    Tensor B = a->lora_B;
    B.set_value(random_uniform(B.shape(), gen, DType::float64, -0.3, 0.3));
    factors[p] = {a->lora_A.value(), a->lora_B.value()};
    m.set_adapter(p, std::move(a));
  }
  CHECK(names(m) == std::set<std::string>{"W_QKV", "b_QKV", "W_O", "b_O", "q.lora_A", "q.lora_B", "k.lora_A",
                                          "k.lora_B", "v.lora_A", "v.lora_B", "o.lora_A", "o.lora_B"});
  // The reference layer: W_QKV's column blocks and W_O plus 1.5 A B, summed in loops here.
  auto plus = [](const Array& W, std::size_t col0, const std::pair<Array, Array>& f) {
    const auto AB = matmul_loops(f.first, f.second);
    const std::size_t rows = W.shape()[0], cols = W.shape()[1], w = f.second.shape()[1];
    std::vector<double> v(W.size());
    for (std::size_t i = 0; i < W.size(); ++i) v[i] = W.flat(i);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < w; ++j) v[i * cols + col0 + j] += 1.5 * AB[i * w + j];
    return Array::from_vector(W.shape(), v, DType::float64);
  };
  Array W_QKV = m.W_QKV.value();
  W_QKV = plus(W_QKV, 0, factors[P::q]);
  W_QKV = plus(W_QKV, 16, factors[P::k]);
  W_QKV = plus(W_QKV, 24, factors[P::v]);
  nn::MultiHeadAttention ref(c, {{"W_QKV", W_QKV}, {"b_QKV", m.b_QKV.value()},
                                 {"W_O", plus(m.W_O.value(), 0, factors[P::o])}, {"b_O", m.b_O.value()}});
  const Tensor X(random_uniform({2, 5, 16}, gen, DType::float64, -1, 1));
  const auto causal = nn::Visibility::causal(5, 5);
  // Two float64 paths through a softmax of O(1) scores: 1e-12 is about 2^13 ulps of slack.
  XGT_CHECK_WITHIN(m(X, causal).value(), ref(X, causal).value(), 1e-12);
  // The cached path (project()) sees the adapters too.
  nn::KVCache cache = m.make_cache(2, 5);
  XGT_CHECK_WITHIN(m.forward_cached(X, cache).Y.value(), ref(X, causal).value(), 1e-12);
}

TEST_CASE("lora: gradcheck of LoRALinear and of LoRA on x A and B in float64", "[lora][gradcheck]") {
  Generator gen(4);
  nn::Linear base(6, 5, gen, true, DType::float64);
  randomise(base, gen);
  nn::LoRALinear l(base, {2, 4.0}, gen);
  randomise(l, gen, "lora_B");
  const Tensor x(random_uniform({2, 3, 6}, gen, DType::float64, -1, 1), true);
  const GradcheckReport r = gradcheck_leaves([&] { return l(x); },
                                             {{"x", x}, {"lora_A", l.lora.lora_A}, {"lora_B", l.lora.lora_B}});
  INFO(r.summary());
  CHECK(r.passed);
  CHECK(!l.W.requires_grad());  // gradcheck_leaves restored what it set
  // The term alone, through the Array gradcheck.
  require_gradcheck(
      [&](const std::vector<Tensor>& in) {
        return ops::matmul(ops::matmul(in[0], in[1]) * l.lora.scale(), in[2]);
      },
      {random_uniform({3, 6}, gen, DType::float64, -1, 1), l.lora.lora_A.value(), l.lora.lora_B.value()},
      {"x", "A", "B"});
}

// The adapted projection as one op (nn::lora_affine), against the composition of recorded
// matmuls it replaced (the layer's first form, kept here as the reference).
Tensor composed_reference(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& A, const Tensor& B, double s) {
  const Tensor y = ops::matmul(x, W) + ops::matmul(ops::matmul(x, A) * s, B);
  return b.defined() ? y + b : y;
}

TEST_CASE("lora: lora_affine passes gradcheck on x W b A B in float64", "[lora][gradcheck]") {
  Generator gen(21);
  for (const bool bias : {true, false}) {
    std::vector<Array> in = {random_uniform({2, 3, 6}, gen, DType::float64, -1, 1),
                             random_uniform({6, 5}, gen, DType::float64, -1, 1),
                             random_uniform({6, 2}, gen, DType::float64, -1, 1),
                             random_uniform({2, 5}, gen, DType::float64, -1, 1)};
    if (bias) in.push_back(random_uniform({5}, gen, DType::float64, -1, 1));
    require_gradcheck(
        [&](const std::vector<Tensor>& v) {
          return nn::lora_affine(v[0], v[1], v.size() > 4 ? v[4] : Tensor(), v[2], v[3], 1.75);
        },
        in, bias ? std::vector<std::string>{"x", "W", "A", "B", "b"} : std::vector<std::string>{"x", "W", "A", "B"});
  }
}

TEST_CASE("lora: lora_affine passes gradgradcheck through its composed second-order rule", "[lora][gradcheck]") {
  Generator gen(24);
  const std::vector<Array> in = {random_uniform({2, 4}, gen, DType::float64, -1, 1),
                                 random_uniform({4, 3}, gen, DType::float64, -1, 1),
                                 random_uniform({4, 2}, gen, DType::float64, -1, 1),
                                 random_uniform({2, 3}, gen, DType::float64, -1, 1),
                                 random_uniform({3}, gen, DType::float64, -1, 1)};
  const GradcheckReport r = gradgradcheck(
      [](const std::vector<Tensor>& v) { return ops::tanh(nn::lora_affine(v[0], v[1], v[4], v[2], v[3], 0.5)); }, in, {},
      {"x", "W", "A", "B", "b"});
  INFO(r.summary());
  CHECK(r.passed);
}

TEST_CASE("lora: lora_affine equals the composed matmuls in value and every gradient", "[lora]") {
  Generator gen(22);
  const double s = 2.5;
  auto leaf = [&](const Shape& sh) { return Tensor(random_uniform(sh, gen, DType::float64, -1, 1), true); };
  const Tensor x = leaf({3, 4, 7}), W = leaf({7, 5}), b = leaf({5}), A = leaf({7, 3}), B = leaf({3, 5});
  const Array G = random_uniform({3, 4, 5}, gen, DType::float64, -1, 1);  // a cotangent that is not all ones
  std::map<std::string, Array> fused, composed;
  for (int path = 0; path < 2; ++path) {
    for (Tensor t : {x, W, b, A, B}) t.zero_grad();  // copies share the leaf
    Tensor y = path == 0 ? nn::lora_affine(x, W, b, A, B, s) : composed_reference(x, W, b, A, B, s);
    auto& out = path == 0 ? fused : composed;
    out["y"] = y.value();
    ops::sum(y * Tensor(G)).backward();
    const char* n[] = {"x", "W", "b", "A", "B"};
    const Tensor* t[] = {&x, &W, &b, &A, &B};
    for (int i = 0; i < 5; ++i) {
      REQUIRE(t[i]->has_grad());
      out[n[i]] = t[i]->grad();
    }
  }
  // Both paths ran (the fused one is a single tape node, below); float64 rounding of sums of
  // at most 7 products of numbers in [-1, 1] times s: far below 1e-12.
  for (const auto& [name, a] : fused) {
    INFO(name);
    XGT_CHECK_WITHIN(a, composed.at(name), 1e-12);
  }
}

TEST_CASE("lora: an adapted projection is one tape node and a frozen W gets no weight gradient", "[lora][freeze]") {
  Generator gen(23);
  nn::Linear base(8, 6, gen, true, DType::float64);
  nn::LoRALinear l(base, {2, 4.0}, gen);
  randomise(l, gen, "lora_B");
  const Tensor x(random_uniform({4, 8}, gen, DType::float64, -1, 1), true);
  {
    Tape tape;
    const Tensor y = l(x);
    // One op: its entry keeps only its inputs and output, not x A or the term s (x A) B.
    CHECK(tape.size() == 1);
    CHECK(tape.op_at(0) == "lora_affine");
    ops::sum(y).backward();
  }
  CHECK(!l.W.has_grad());
  CHECK(!l.b.has_grad());
  CHECK(l.lora.lora_A.has_grad());
  CHECK(l.lora.lora_B.has_grad());
  CHECK(x.has_grad());
  // A model's Linear and attention projections with adapters attached use the op too.
  nn::GPT m(tiny_llama(DType::float64, 1), gen);
  REQUIRE(nn::add_lora(m, "all", {2, 4.0}, gen) == 7);
  Tape t2;
  const Tensor loss = m.loss(tokens(gen, 2, 4, 13), tokens(gen, 2, 4, 13));
  std::size_t fused = 0;
  for (std::size_t i = 0; i < t2.size(); ++i) fused += t2.op_at(i) == "lora_affine" ? 1 : 0;
  CHECK(fused == 5);  // q, k, v packed as one; o; gate; up; down
}

TEST_CASE("lora: gradcheck of a Llama model's loss on every adapter", "[lora][gradcheck]") {
  Generator gen(5);
  nn::GPT m(tiny_llama(DType::float64, 1), gen);
  randomise(m, gen);
  REQUIRE(nn::add_lora(m, "all", {2, 4.0}, gen) == 7);
  randomise(m, gen, "lora_B");
  const IndexArray t = tokens(gen, 2, 4, 13), y = tokens(gen, 2, 4, 13);
  const auto leaves = m.named_trainable_parameters();
  REQUIRE(leaves.size() == 14);
  const GradcheckReport r = gradcheck_leaves([&] { return m.loss(t, y); }, leaves);
  INFO(r.summary());
  CHECK(r.passed);
}

// ---------------------------------------------------------------------------------------
// Frozen weights

TEST_CASE("lora: frozen base weights get no gradient while A and B do", "[lora][freeze]") {
  Generator gen(6);
  nn::GPT m(tiny_llama(), gen);
  randomise(m, gen);
  const std::size_t n = nn::add_lora(m, "attn,down", {4, 8.0}, gen);
  CHECK(n == 2 * 5);
  CHECK(nn::count_adapters(m) == 10);
  randomise(m, gen, "lora_B");
  m.loss(tokens(gen, 2, 6, 13), tokens(gen, 2, 6, 13)).backward();
  std::size_t adapters = 0;
  for (const auto& [name, p] : m.named_parameters()) {
    INFO(name);
    if (is_adapter_param(name)) {
      ++adapters;
      CHECK(p.requires_grad());
      CHECK(p.has_grad());
      CHECK(max_abs(p.grad()) > 0.0);
    } else {
      CHECK(!p.requires_grad());
      CHECK(!p.has_grad());
    }
  }
  CHECK(adapters == 20);
  CHECK(names(m).count("blocks.1.attn.q.lora_A") == 1);
  CHECK(names(m).count("blocks.0.ffn.down.lora_B") == 1);
  CHECK(m.named_trainable_parameters().size() == 20);

  // Without freeze_base every parameter trains.
  nn::GPT full(tiny_llama(), gen);
  nn::LoRAConfig cfg{4, 8.0};
  cfg.freeze_base = false;
  nn::add_lora(full, "q", cfg, gen);
  CHECK(full.named_trainable_parameters().size() == full.named_parameters().size());
}

TEST_CASE("lora: freeze and unfreeze by regular expression / trainable_parameters", "[lora][freeze]") {
  Generator gen(7);
  nn::GPT m(tiny_llama(), gen);
  const std::size_t all = m.named_parameters().size();  // tok, 2 x 7, norm
  REQUIRE(all == 16);
  CHECK(m.freeze("^tok\\.|norm") == 1 + 2 * 2 + 1);
  CHECK(m.trainable_parameters().size() == all - 6);
  std::size_t frozen_scalars = 13 * 16 + 16 * (4 + 1);
  CHECK(m.trainable_parameter_count() == m.parameter_count() - frozen_scalars);
  m.loss(tokens(gen, 2, 5, 13), tokens(gen, 2, 5, 13)).backward();
  for (const auto& [name, p] : m.named_parameters()) {
    INFO(name);
    const bool frozen = name.rfind("tok.", 0) == 0 || name.find("norm") != std::string::npos;
    CHECK(p.has_grad() == !frozen);
  }
  // Freezing drops a gradient the parameter had; unfreezing makes it trainable again.
  CHECK(m.parameter("blocks.0.attn.W_QKV").has_grad());
  CHECK(m.freeze("W_QKV$") == 2);
  CHECK(!m.parameter("blocks.0.attn.W_QKV").has_grad());
  CHECK(m.unfreeze(".") == all);
  CHECK(m.trainable_parameters().size() == all);
  // Freezing everything is the caller's decision: the count says so.
  CHECK(m.freeze(".*") == all);
  CHECK(m.trainable_parameters().empty());
}

TEST_CASE("lora: an optimizer keeps state only for trainable tensors and skips frozen ones", "[lora][freeze]") {
  Generator gen(8);
  nn::GPT m(tiny_llama(DType::float32), gen);
  nn::add_lora(m, "all", {2, 4.0}, gen);
  std::map<std::string, Array> before;
  for (const auto& [n, p] : m.named_parameters()) before[n] = p.value().clone();
  const IndexArray t = tokens(gen, 2, 6, 13), y = tokens(gen, 2, 6, 13);
  for (bool given_all : {false, true}) {
    INFO((given_all ? "optimizer given every parameter" : "optimizer given the trainable ones"));
    nn::AdamW opt(given_all ? m.named_parameters() : m.named_trainable_parameters(), 1e-2);
    opt.zero_grad();
    m.loss(t, y).backward();
    opt.step();
    std::set<std::string> with_state;
    for (const auto& [key, a] : opt.state()) with_state.insert(key.substr(0, key.rfind('.')));
    std::set<std::string> trainable;
    for (const auto& [n, p] : m.named_trainable_parameters()) trainable.insert(n);
    CHECK(with_state == trainable);
    CHECK(trainable.size() == 2 * 7 * 2);
    for (const auto& [n, p] : m.named_parameters()) {
      INFO(n);
      if (is_adapter_param(n)) {
        if (ends_with(n, "lora_B")) CHECK(max_abs_diff(p.value(), before[n]) > 0.0);  // A's grad is 0 while B is 0
      } else {
        XGT_CHECK_SAME(p.value(), before[n]);  // untouched: the optimizer skipped it
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Merging

TEST_CASE("lora: a merged LoRALinear computes the adapted output within the rounding bound", "[lora][merge]") {
  // Adapted: y1 = fl(fl(x W) + fl(fl(fl(x A) s) B)); merged: y2 = fl(x fl(W + fl(fl(A B) s))). Each
  // is within gamma_n (|x| |W| + s |x| |A| |B|) of the exact y elementwise, n = d_in + r + 2
  // (gamma_n = n u / (1 - n u), u the unit roundoff), so |y1 - y2| <= 2 gamma_n (that sum).
  Generator gen(9);
  for (DType dt : {DType::float32, DType::float64}) {
    INFO(dtype_name(dt));
    const std::size_t d_in = 64, d_out = 24, r = 8;
    nn::Linear base(d_in, d_out, gen, false, dt);
    randomise(base, gen, "", 0.5);
    nn::LoRALinear l(base, {r, 16.0}, gen);
    randomise(l, gen, "lora_B", 0.5);
    const Tensor x(random_uniform({10, d_in}, gen, dt, -1, 1));
    const auto merged = l.merged();
    CHECK(names(*merged) == std::set<std::string>{"W"});
    const Array y1 = l(x).value().astype(DType::float64), y2 = (*merged)(x).value().astype(DType::float64);
    const Array ax = abs_of(x.value().astype(DType::float64));
    const auto xW = matmul_loops(ax, abs_of(base.W.value().astype(DType::float64)));
    const auto xA = matmul_loops(ax, abs_of(l.lora.lora_A.value().astype(DType::float64)));
    const auto xAB = matmul_loops(Array::from_vector({10, r}, xA, DType::float64),
                                  abs_of(l.lora.lora_B.value().astype(DType::float64)));
    const double u = dt == DType::float32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53);
    const double n = double(d_in + r + 2), gamma = n * u / (1 - n * u);
    double worst = 0.0;  // the largest |y1 - y2| / bound over the elements
    for (std::size_t i = 0; i < y1.size(); ++i) {
      const double bound = 2 * gamma * (xW[i] + l.lora.scale() * xAB[i]);
      worst = std::max(worst, std::fabs(y1.flat(i) - y2.flat(i)) / bound);
    }
    INFO("largest |adapted - merged| / bound = " << sci(worst));
    CHECK(worst <= 1.0);
    CHECK(max_abs_diff(merged->W.value(), base.W.value()) > 0.0);  // the merge changed W
  }
}

TEST_CASE("lora: merge_lora gives the base model's parameters and the adapted model's outputs", "[lora][merge]") {
  Generator gen(10);
  for (const bool llama : {true, false}) {
    INFO((llama ? "llama" : "gpt"));
    nn::GPT m(llama ? tiny_llama() : tiny_gpt2(), gen);
    randomise(m, gen);
    const std::set<std::string> base_names = names(m);
    const IndexArray t = tokens(gen, 2, 7, 13);
    const Array base_logits = m.logits(t).value();
    const std::size_t n = nn::add_lora(m, "all", {4, 8.0}, gen);
    CHECK(n == 2 * (llama ? 7 : 6));
    // B = 0: the adapted model is the base model, bit for bit (the same ops on the same shapes
    // plus exact zeros).
    XGT_CHECK_SAME(m.logits(t).value(), base_logits);
    randomise(m, gen, "lora_B", 0.2);
    const Array adapted = m.logits(t).value();
    CHECK(max_abs_diff(adapted, base_logits) > 1e-3);
    CHECK(nn::merge_lora(m) == n);
    CHECK(nn::count_adapters(m) == 0);
    CHECK(names(m) == base_names);
    // Each merged projection differs from its adapted form by at most 2 gamma_n of its terms'
    // magnitude (n <= d_ff + r + 2 = 70: ~1.6e-14 relative); through two blocks of O(1) gain and
    // the classifier that stays below 1e-12 on logits of magnitude ~1.
    INFO("max |logits| = " << sci(max_abs(adapted)));
    XGT_CHECK_WITHIN(m.logits(t).value(), adapted, 1e-12);
    CHECK(error_of<ValueError>([&] { nn::merge_lora(m); }).find("no adapters") != std::string::npos);
  }
}

TEST_CASE("lora: KV-cache decoding of an adapted model equals its full forward", "[lora]") {
  Generator gen(11);
  nn::GPT m(tiny_llama(), gen);
  randomise(m, gen);
  nn::add_lora(m, "all", {2, 4.0}, gen);
  randomise(m, gen, "lora_B");
  const IndexArray t = tokens(gen, 1, 6, 13);
  const Array full = m.logits(t).value();
  auto caches = m.make_caches(1, 6);
  NoGradGuard ng;  // decoding: the one-query step
  for (std::size_t i = 0; i < 6; ++i) {
    const Array step = m.logits_cached(IndexArray({1, 1}, {t.data[i]}), caches).value();
    for (std::size_t v = 0; v < 13; ++v) {
      INFO("position " << i << ", token " << v);
      CHECK(std::fabs(step.flat(v) - full.flat(i * 13 + v)) <= 1e-12);
    }
  }
}

// ---------------------------------------------------------------------------------------
// The trainable share

TEST_CASE("lora: rank 8 on a stories15M-shaped Llama model trains the hand-counted parameters", "[lora]") {
  // d 288, 6 layers, 6 heads, d_ff 768 (multiple_of 32), tied. Per layer: q, k, v, o each
  // r (288 + 288); gate and up r (288 + 768); down r (768 + 288).
  auto config = [](std::size_t V) {
    nn::TransformerConfig c;
    c.arch = nn::Architecture::llama;
    c.pos = nn::PositionScheme::rope;
    c.V_vocab = V;
    c.context = 256;
    c.d_model = 288;
    c.H_q = 6;
    c.layers = 6;
    c.multiple_of = 32;
    c.dtype = DType::float32;
    return c;
  };
  const std::size_t r = 8, attn = 4 * r * (288 + 288), mlp = 3 * r * (288 + 768);
  const std::size_t base_layer = 4 * 288 * 288 + 3 * 288 * 768 + 2 * 288;
  struct Case {
    std::size_t V;
    std::string targets;
    std::size_t per_layer;
  };
  for (const Case& k : {Case{1024, "all", attn + mlp}, Case{1024, "attn", attn}, Case{1024, "q,v", 2 * r * 576},
                        Case{32000, "all", attn + mlp}}) {
    Generator gen(12);
    nn::GPT m(config(k.V), gen);
    const std::size_t base = k.V * 288 + 6 * base_layer + 288;
    REQUIRE(m.parameter_count() == base);
    nn::add_lora(m, k.targets, {r, 16.0}, gen);
    const std::size_t trainable = m.trainable_parameter_count(), total = m.parameter_count();
    CHECK(trainable == 6 * k.per_layer);
    CHECK(total == base + trainable);
    const double pct = 100.0 * double(trainable) / double(total);
    std::cout << "lora rank 8 on " << k.targets << " of a stories15M-shaped model, vocabulary " << k.V << ": "
              << trainable << " of " << total << " parameters trainable (" << std::fixed << std::setprecision(2) << pct
              << "%)\n"
              << std::defaultfloat;
    // rank 8 on every projection is 4.0% of a 6.5M model (vocabulary 1024) and 1.70% of the
    // real stories15M (vocabulary 32000); on the attention projections alone it is 1.7% of the
    // smaller one.
    if (k.V == 32000 || k.targets != "all") CHECK(pct < 2.0);
    if (k.V == 1024 && k.targets == "all") CHECK(pct > 3.9);
  }
}

// ---------------------------------------------------------------------------------------
// Bad input

TEST_CASE("lora: bad input is an error naming the op and the values", "[lora][errors]") {
  Generator gen(13);
  nn::GPT m(tiny_llama(), gen);
  const auto contains = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
  };
  // rank 0, rank above min(d_in, d_out): k maps 16 -> 8 under GQA
  contains(error_of<ValueError>([&] { nn::add_lora(m, "q", {0, 1.0}, gen); }), "rank must be positive");
  const std::string big = error_of<ValueError>([&] { nn::add_lora(m, "q,k", {9, 1.0}, gen); });
  contains(big, "blocks.0.attn.k");
  contains(big, "rank 9 is larger than the layer: min(d_in 16, d_out 8) = 8");
  CHECK(nn::count_adapters(m) == 0);  // nothing attached by the refused call, q included
  CHECK(m.trainable_parameters().size() == m.parameters().size());
  contains(error_of<ValueError>([&] { nn::add_lora(m, "q", {2, 0.0}, gen); }), "alpha must be positive");
  contains(error_of<ValueError>([&] { nn::add_lora(m, "q", {2, std::nan("")}, gen); }), "alpha must be positive");
  // targets
  contains(error_of<ValueError>([&] { nn::add_lora(m, "q,foo", {2, 4.0}, gen); }), "target 'foo' names no layer");
  contains(error_of<ValueError>([&] { nn::add_lora(m, "fc1", {2, 4.0}, gen); }), "target 'fc1' names no layer of a llama model");
  nn::GPT g(tiny_gpt2(), gen);
  contains(error_of<ValueError>([&] { nn::add_lora(g, "gate", {2, 4.0}, gen); }), "target 'gate' names no layer of a gpt model");
  contains(error_of<ValueError>([&] { nn::add_lora(m, "", {2, 4.0}, gen); }), "targets is empty");
  contains(error_of<ValueError>([&] { nn::add_lora(m, "q,,v", {2, 4.0}, gen); }), "empty entry");
  CHECK(nn::lora_targets("v,attn,q", nn::Architecture::llama) == std::vector<std::string>{"q", "k", "v", "o"});
  CHECK(nn::lora_targets("mlp", nn::Architecture::gpt) == std::vector<std::string>{"fc1", "fc2"});
  CHECK(nn::lora_targets("all", nn::Architecture::llama).size() == 7);
  // twice on one projection
  nn::add_lora(m, "v", {2, 4.0}, gen);
  contains(error_of<ValueError>([&] { nn::add_lora(m, "attn", {2, 4.0}, gen); }), "blocks.0.attn.v has an adapter already");
  CHECK(nn::count_adapters(m) == 2);
  // merge without adapters
  nn::GPT plain(tiny_llama(), gen);
  contains(error_of<ValueError>([&] { nn::merge_lora(plain); }), "[merge_lora] the model has no adapters");
  // freeze patterns
  contains(error_of<ValueError>([&] { plain.freeze("nothing_like_this"); }), "pattern 'nothing_like_this' matches no parameter");
  contains(error_of<ValueError>([&] { plain.freeze("(unclosed"); }), "is not a valid regular expression");
  contains(error_of<ValueError>([&] { plain.unfreeze("zzz"); }), "unfreeze");
  // the hooks
  nn::Linear lin(6, 4, gen, true, DType::float64);
  contains(error_of<ValueError>([&] { lin.set_adapter(nullptr); }), "is null");
  contains(error_of<ShapeError>([&] { lin.set_adapter(std::make_unique<nn::LoRA>(4, 6, nn::LoRAConfig{2, 1.0}, gen, DType::float64)); }),
           "the adapter maps 4 -> 6 features, the layer maps 6 -> 4");
  contains(error_of<DTypeError>([&] { lin.set_adapter(std::make_unique<nn::LoRA>(6, 4, nn::LoRAConfig{2, 1.0}, gen, DType::float32)); }),
           "float32");
  contains(error_of<ValueError>([&] { lin.merge_adapter(); }), "merge_adapter: the layer has no adapter");
  lin.set_adapter(std::make_unique<nn::LoRA>(6, 4, nn::LoRAConfig{2, 1.0}, gen, DType::float64));
  contains(error_of<ValueError>([&] { lin.set_adapter(std::make_unique<nn::LoRA>(6, 4, nn::LoRAConfig{2, 1.0}, gen, DType::float64)); }),
           "has an adapter already");
  CHECK(lin.remove_adapter() != nullptr);
  CHECK(names(lin) == std::set<std::string>{"W", "b"});
  contains(error_of<ShapeError>([&] { nn::LoRA(6, 4, {2, 1.0}, gen, DType::float64)(Tensor(Array::zeros({3, 5}, DType::float64))); }),
           "x must be [..., 6], has shape (3, 5)");
  contains(error_of<ShapeError>([&] { nn::LoRALinear(Array::zeros({6}, DType::float64), Array(), {2, 1.0}, gen); }),
           "lora_linear");
  // What reads W_QKV and W_O alone refuses a layer whose adapter is not merged (its term would be lost).
  nn::AttentionConfig ac;
  ac.d_model = 8;
  ac.H_q = 2;
  ac.dtype = DType::float64;
  nn::MultiHeadAttention mha(ac, gen);
  mha.set_adapter(P::v, std::make_unique<nn::LoRA>(8, 8, nn::LoRAConfig{2, 1.0}, gen, DType::float64));
  contains(error_of<ValueError>([&] { nn::torch_layout::export_attention(mha); }), "projection v has an adapter");
  contains(error_of<ValueError>([&] { nn::torch_layout::export_mha(mha); }), "projection v has an adapter");
  contains(error_of<ValueError>([&] { nn::pooled_kv_weights(mha, 1); }), "projection v has an adapter");
  mha.merge_adapter(P::v);
  CHECK(nn::torch_layout::export_attention(mha).v_weight.defined());
  CHECK(names(mha) == std::set<std::string>{"W_QKV", "b_QKV", "W_O", "b_O"});
}
