// A program a user writes outside xgrad's tree, built three ways by tests/downstream/run.sh:
// against the installed CMake package, with pkg-config, and with xgrad as a subproject.
//
// It defines its own op (a softsign with a hand-written VJP) and its own model (Linear ->
// softsign -> multi-head self-attention -> Linear), checks the op's and the model's gradients
// against central differences, and trains two AdamW steps. Exit status 0 only when all of it
// holds; every failure prints one line saying which property broke.
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include <xgrad/version.hpp>
#include <xgrad/xgrad.hpp>

#include "expect.hpp"
#ifdef CONSUMER_WITH_CHECKS
#include <xgrad/checks/attention_reference.hpp>
#include <xgrad/checks/kv_cache_check.hpp>
#include <xgrad/checks/suite.hpp>
// Moved to checks/ in 0.3; the old header and the name xg::nn::reference still work (deprecated).
#include <xgrad/nn/attention_reference.hpp>
#endif

using namespace xg;

using consumer::expect;
using consumer::failures;

namespace {

// softsign(x) = x / (1 + |x|); d/dx = 1 / (1 + |x|)^2.
Tensor softsign(const Tensor& x) {
  return custom_op(
      "softsign", {x},
      [](const std::vector<Array>& in) {
        NoGradGuard ng;
        const Tensor t(in[0]);
        return (t / (ops::abs(t) + 1.0)).value();
      },
      [](const VjpContext& c) {
        NoGradGuard ng;
        const Tensor t(c.inputs[0]), g(c.grad_output);
        const Tensor d = ops::abs(t) + 1.0;
        return Cotangents{(g / (d * d)).value()};
      });
}

class Model : public nn::Module {
 public:
  Model(std::size_t vocab, std::size_t d, Generator& gen, DType dtype)
      : in(d, d, gen, true, dtype, 0.3), attn(attention_config(d, dtype), gen), out(d, vocab, gen, true, dtype, 0.3) {
    register_module("in", in);
    register_module("attn", attn);
    register_module("out", out);
  }
  Tensor operator()(const Tensor& x) {
    const Tensor h = softsign(in(x));
    const std::size_t T = x.shape()[1];
    return out(attn(h, nn::Visibility::causal(T, T)));
  }
  // Incremental decoding: the next positions x_new [B, n, d] through the attention's KV cache.
  nn::KVCache make_cache(std::size_t batch, std::size_t capacity) const { return attn.make_cache(batch, capacity); }
  Tensor forward_cached(const Tensor& x_new, nn::KVCache& cache) {
    return out(attn.forward_cached(softsign(in(x_new)), cache).Y);
  }

 private:
  static nn::AttentionConfig attention_config(std::size_t d, DType dtype) {
    nn::AttentionConfig c;
    c.d_model = d;
    c.H_q = 2;
    c.H_kv = 1;  // MQA: one key/value head shared by both query heads
    c.dtype = dtype;
    return c;
  }
  nn::Linear in;
  nn::MultiHeadAttention attn;
  nn::Linear out;
};

}  // namespace

int main() {
  std::cout << "xgrad " << XGRAD_VERSION_STRING << "\n";
#ifdef EXPECTED_VERSION
  expect(std::string(XGRAD_VERSION_STRING) == EXPECTED_VERSION, "version header says " EXPECTED_VERSION);
#endif

  // One default dtype for every creation helper and layer: float32 at start, then whatever
  // set_default_dtype says.
  {
    Generator g(1);
    const bool all32 = default_dtype() == DType::float32 && Array::of({1.0, 2.0}).dtype() == DType::float32 &&
                       random_normal({2}, g).dtype() == DType::float32 && zeros({2}).dtype() == DType::float32 &&
                       nn::Linear(2, 2, g).W.dtype() == DType::float32;
    expect(all32, "float32 is the default dtype of Array::of, random_normal, zeros and Linear at start");
    set_default_dtype(DType::float64);
    const bool all64 = Array::of({1.0, 2.0}).dtype() == DType::float64 && random_normal({2}, g).dtype() == DType::float64 &&
                       zeros({2}).dtype() == DType::float64 && nn::Linear(2, 2, g).W.dtype() == DType::float64 &&
                       nn::AttentionConfig().dtype == DType::float64;
    expect(all64, "after set_default_dtype(float64) they all make float64");
    set_default_dtype(DType::float32);
  }

  // The custom op against central differences, full Jacobian, float64.
  Generator gen(7);
  const GradcheckReport op = gradcheck([](const std::vector<Tensor>& in) { return softsign(in[0]); },
                                       {random_normal({3, 4}, gen, DType::float64)});
  expect(op.passed, "custom op softsign passes gradcheck (" + op.summary() + ")");

  // The whole model in float64: every parameter and the input.
  {
    Generator g(11);
    Model m(5, 8, g, DType::float64);
    const Tensor x(random_normal({2, 3, 8}, g, DType::float64), true);
    const IndexArray targets({2, 3}, {0, 1, 2, 3, 4, 0});
    auto leaves = m.named_parameters();
    leaves.insert(leaves.begin(), {"x", x});
    const GradcheckReport r = gradcheck_leaves([&] { return ops::cross_entropy(m(x), targets); }, leaves);
    expect(r.passed, "model gradients pass gradcheck_leaves (" + r.summary() + ")");
  }

  // Two training steps in float32: the loss is finite and goes down on a fixed batch.
  {
    Generator g(3);
    Model m(5, 8, g, DType::float32);
    nn::AdamW opt(m.named_parameters(), 1e-2);
    const Tensor x(random_normal({4, 3, 8}, g, DType::float32));
    const IndexArray targets({4, 3}, {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1});
    double first = 0, last = 0;
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      Tensor loss = ops::cross_entropy(m(x), targets);
      if (step == 0) first = loss.item();
      last = loss.item();
      if (step < 2) {
        loss.backward();
        opt.step();
      }
    }
    expect(std::isfinite(first) && std::isfinite(last) && last < first,
           "two AdamW steps lower the loss (" + std::to_string(first) + " -> " + std::to_string(last) + ")");
    expect(opt.step_count() == 2, "the optimizer counted two steps");
  }

#ifdef CONSUMER_WITH_CHECKS
  // The suite runner from xgrad::checks, on the custom op.
  GradcheckSuite suite;
  suite.add_gradient_check("consumer/softsign", "x (2, 5)",
                           [](CheckContext& ctx) { return std::vector<Array>{ctx.normal({2, 5})}; },
                           [](const std::vector<Tensor>& in) { return softsign(in[0]); }, {"x"});
  RunOptions opts;
  const SuiteReport rep = run_suite(suite, opts, std::cout);
  expect(rep.all_passed() && rep.passed == 1, "the suite runner passes the custom op's check");

  // The closed-form reference from xgrad::checks, by its new name and its deprecated one.
  {
    checks::reference::Mat m(1, 2);
    m(0, 1) = 2.0;
    const checks::reference::Mat a = checks::reference::transpose(m);
    const nn::reference::Mat b = nn::reference::transpose(a);
    expect(a.rows == 2 && a(1, 0) == 2.0 && b.rows == 1 && b(0, 1) == 2.0,
           "checks::reference (and its old name nn::reference) transposes");
  }

  // The KV-cache checker on the model: cached decoding in every schedule equals the full
  // forward; a cache dropped between calls is caught, on the token-by-token schedule.
  {
    Generator g(5);
    auto m = std::make_shared<Model>(5, 8, g, DType::float64);
    const Array x = random_normal({2, 6, 8}, g, DType::float64);
    auto decoder = [m](bool keep_cache) {
      return kv_cache_decoder([m](const Array& v) { return (*m)(Tensor(v)); }, [m] { return m->make_cache(2, 6); },
                              [m, keep_cache](nn::KVCache& cache, const Array& v) {
                                if (!keep_cache) cache.clear();
                                return m->forward_cached(Tensor(v), cache);
                              });
    };
    const KVCacheReport good = check_kv_cache(decoder(true), x);
    expect(good.passed, "the KV-cache checker passes the model's cache (" + good.summary() + ")");
    const KVCacheReport bad = check_kv_cache(decoder(false), x);
    expect(!bad.passed && bad.message.find("\"token by token\"") != std::string::npos,
           "the KV-cache checker catches a cache cleared between calls (" + bad.message + ")");
  }
#endif

  std::cout << (failures == 0 ? "consumer: all passed" : "consumer: FAILED") << "\n";
  return failures == 0 ? 0 : 1;
}
