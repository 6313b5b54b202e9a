// Gradient accumulation (train/detail/grad_accum.hpp, `xgrad train --grad-accum K`): K
// micro-batches of B sequences give the loss and every gradient of one batch of K B sequences
// (float64, to 1e-12 relative), with the same data stream and dropout masks after the step.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/train/detail/grad_accum.hpp>
#include <xgrad/train/options.hpp>
#include <xgrad/train/task.hpp>

using namespace xg;

namespace {

struct Pass {
  double loss = 0;
  std::map<std::string, Array> grads;
  double next_data = 0, next_dropout = 0;  // the generators' next draws after the step
};

// A small model of `task` in float64, with dropout (its masks must match too: they are drawn
// by global row).
std::unique_ptr<train::Task> small_task(const std::string& task, dist::Communicator& comm) {
  train::TrainOptions o;
  o.task = task;
  o.n_digits = 5;
  o.d_model = 16;
  o.heads = 2;
  o.layers = 2;
  o.dropout = 0.1;
  o.dtype = "float64";
  o.heldout = 8;
  o.threads = 1;
  return train::make_task(train::with_defaults(o), comm);
}

// One step's loss and gradients of a fresh `task` model (the same seed every time), with the
// global batch of `batch` * `micro` sequences computed `micro` blocks at a time.
Pass run(const std::string& task, std::size_t batch, std::size_t micro) {
  auto comm = dist::make_local();
  std::unique_ptr<train::Task> t = small_task(task, *comm);
  Generator init(7), data(11), dropout(13);
  t->build_model(init);
  t->module().train();
  Pass p;
  const dist::Shard all{0, batch * micro};
  p.loss = train::detail::accumulate_gradients(*t, batch, micro, data, dropout, all);
  for (const auto& [name, param] : t->module().named_parameters()) {
    REQUIRE(param.has_grad());
    p.grads.emplace(name, param.grad());
  }
  p.next_data = data.uniform();
  p.next_dropout = dropout.uniform();
  return p;
}

double rel_diff(const Array& a, const Array& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(a.flat(i) - b.flat(i)));
    den = std::max(den, std::abs(b.flat(i)));
  }
  return den > 0 ? num / den : num;
}

void check_same_step(const std::string& task) {
  const Pass whole = run(task, 32, 1), accum = run(task, 8, 4);
  INFO(task << ": loss " << xgt::sci(whole.loss) << " against " << xgt::sci(accum.loss));
  CHECK(std::abs(accum.loss - whole.loss) <= 1e-12 * std::abs(whole.loss));
  REQUIRE(accum.grads.size() == whole.grads.size());
  for (const auto& [name, g] : whole.grads) {
    const double d = rel_diff(accum.grads.at(name), g);
    INFO(name << ": max |difference| / max |gradient| = " << xgt::sci(d));
    CHECK(d <= 1e-12);
  }
  // The data stream and dropout continue as after one pass over the whole batch.
  CHECK(accum.next_data == whole.next_data);
  CHECK(accum.next_dropout == whole.next_dropout);
}

}  // namespace

TEST_CASE("grad accum: 4 micro-batches of 8 give the loss and gradients of one batch of 32 (sort)", "[grad-accum]") {
  check_same_step("sort");
}

TEST_CASE("grad accum: the same for the encoder-decoder of the reverse task", "[grad-accum]") {
  check_same_step("reverse");
}

TEST_CASE("grad accum: a count that does not divide the rows is refused", "[grad-accum]") {
  auto comm = dist::make_local();
  std::unique_ptr<train::Task> t = small_task("sort", *comm);
  Generator init(1), data(2), dropout(3);
  t->build_model(init);
  CHECK_THROWS_WITH(train::detail::accumulate_gradients(*t, 8, 3, data, dropout, dist::Shard{0, 20}),
                    Catch::Contains("--grad-accum 3 must divide this rank's 20 rows"));
  CHECK_THROWS_AS(train::detail::accumulate_gradients(*t, 8, 0, data, dropout, dist::Shard{0, 8}), UsageError);
}
