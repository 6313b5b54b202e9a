// API misuse fails by a stated rule with a clear error (docs/reliability.md); one tape per
// thread, and a module shared read-only by several threads under no_grad.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "tests/support/helpers.hpp"
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/train/tasks.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

}  // namespace

TEST_CASE("api misuse: fails with a clear error by a stated rule", "[core][errors]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Generator g(3);
  const Tensor x(Array::full({2, 3}, 1.0, DType::float64), true);
  // log of NaN outside anomaly mode stays a value (anomaly mode is the tool for that).
  CHECK(std::isnan(ops::log(Tensor(Array::full({1}, nan, DType::float64))).item()));
  // dropout p = 1 would drop everything.
  CHECK_THROWS_WITH(ops::dropout(x, 1.0, g, true), Catch::Contains("[dropout]") && Catch::Contains("[0, 1)"));
  CHECK_THROWS_AS(ops::dropout_mask({2}, 1.0, g, DType::float64), ValueError);
  // clip_grad_norm: a negative (or zero, or NaN) maximum would flip or zero the gradient.
  ops::sum(x * x).backward();
  const nn::NamedTensors params{{"x", x}};
  for (double m : {-1.0, 0.0, nan})
    CHECK_THROWS_WITH(nn::clip_grad_norm(params, m), Catch::Contains("[clip_grad_norm] max_norm"));
  // AdamW with a NaN (or negative) learning rate: refused at the step, parameters untouched.
  nn::AdamW opt(params, nan);
  CHECK_THROWS_WITH(opt.step(), Catch::Contains("learning rate"));
  opt.lr = -1e-3;
  CHECK_THROWS_AS(opt.step(), ValueError);
  CHECK(x.value().to_vector() == std::vector<double>(6, 1.0));
  // A non-finite backward seed.
  const Tensor y = x * 2.0;
  CHECK_THROWS_WITH(y.backward(Array::full({2, 3}, nan, DType::float64)), Catch::Contains("seed element 0"));
  // SDPA: scale 0 (Q and K ignored) and an additive mask that overflows the scores.
  const Tensor Q(Array::full({1, 1, 2, 4}, 0.5, DType::float64)), K = Q, V = Q;
  nn::SdpaOptions zero;
  zero.scale = 0.0;
  CHECK_THROWS_WITH(nn::attention(Q, K, V, nn::Visibility::causal(2, 2), zero), Catch::Contains("scale must be finite and > 0"));
  const nn::Visibility huge = nn::Visibility::additive(Array::full({2, 2}, 1e308, DType::float64));
  nn::SdpaOptions big;
  big.scale = 1e10;
  const Tensor Qb(Array::full({1, 1, 2, 4}, 1e300, DType::float64));
  CHECK_THROWS_AS(nn::attention(Qb, Qb, Qb, huge, big), ValueError);
  // SDPA with no queries works by definition (an empty output); a model call with T = 0 is an error.
  const Tensor Q0(Array::zeros({1, 1, 0, 4}, DType::float64));
  CHECK(nn::attention(Q0, K, V, nn::Visibility::all(), {}).shape() == Shape{1, 1, 0, 4});
  nn::TransformerConfig c;
  c.V_vocab = 5;
  c.context = 4;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = 1;
  nn::GPT gpt(c, g);
  CHECK_THROWS_WITH(gpt.logits(IndexArray({1, 0}, std::vector<std::int64_t>{})), Catch::Contains("T = 0"));
  // The value of a tensor whose tape is gone stays readable (values belong to tensors);
  // backward through it is a TapeError.
  Tensor z;
  {
    Tape tape;
    z = x * 3.0;
  }
  CHECK(z.value().to_vector() == std::vector<double>(6, 3.0));
  CHECK_THROWS_AS(ops::sum(z).backward(), TapeError);
}

TEST_CASE("threads: one tape per thread and a module shared read-only under no_grad", "[core][threads]") {
  Generator g(5);
  nn::TransformerConfig c;
  c.V_vocab = 7;
  c.context = 6;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = 1;
  nn::GPT shared(c, g);
  shared.eval();
  const IndexArray tokens({2, 5}, std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 5, 4, 3, 2});
  Array want;
  {
    NoGradGuard ng;
    want = shared.logits(tokens).value();
  }
  std::vector<Array> got(4);
  std::vector<std::vector<double>> grads(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      {
        NoGradGuard ng;  // forward of the shared module: nothing recorded, nothing written
        got[t] = shared.logits(tokens).value();
      }
      Tape tape;  // this thread's own graph
      const Tensor w(Array::full({3}, static_cast<double>(t + 1), DType::float64), true);
      ops::sum(w * w).backward();
      grads[t] = w.grad().to_vector();
    });
  for (auto& th : threads) th.join();
  for (std::size_t t = 0; t < got.size(); ++t) {
    XGT_CHECK_SAME(got[t], want);  // the same calls; the split depends on the thread count only
    CHECK(grads[t] == std::vector<double>(3, 2.0 * static_cast<double>(t + 1)));
  }
}
