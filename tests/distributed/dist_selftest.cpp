// The MPI communicator and the data-parallel pieces over real ranks: run under
// `mpirun -np N` (tests/distributed/dist_test.py selftest). Every rank runs every test case
// in the same order; only CHECKs (never REQUIREs) so that a failed check cannot make one
// rank skip a collective the others are waiting in. Expected values are written from the
// rank numbers, never computed by the code under test.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>

#include <xgrad/xgrad.hpp>
#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/distributed/data_parallel.hpp>

using namespace xg;

namespace {

dist::Communicator* g_comm = nullptr;

dist::Communicator& comm() { return *g_comm; }

double r() { return static_cast<double>(comm().rank()); }
double n() { return static_cast<double>(comm().size()); }

// A tiny model whose gradients differ per rank: y = sum(w1 * x) + sum(w2 * w2) * c.
struct Tiny : nn::Module {
  Tensor w1, w2, w3;
  Tiny(DType dt) {
    w1 = register_parameter("w1", Array::full({3}, 1.0, dt));
    w2 = register_parameter("w2", Array::full({2, 2}, 0.5, dt));
    w3 = register_parameter("w3", Array::full({1}, 2.0, dt));  // used on rank 0 only
  }
};

}  // namespace

TEST_CASE("communicator: rank/size/description") {
  CHECK(comm().size() >= 2);
  CHECK(comm().rank() >= 0);
  CHECK(comm().rank() < comm().size());
  CHECK(comm().local_size() >= 1);
  CHECK(comm().local_size() <= comm().size());
  CHECK(comm().description().find(std::to_string(comm().size()) + " ranks") != std::string::npos);
}

TEST_CASE("communicator: all-reduce sum/mean/max/min of float64 and float32") {
  std::vector<double> d{r() + 1, -r(), 0.25};
  comm().all_reduce(d.data(), d.size(), dist::ReduceOp::sum);
  CHECK(d[0] == n() * (n() + 1) / 2);
  CHECK(d[1] == -n() * (n() - 1) / 2);
  CHECK(d[2] == 0.25 * n());
  std::vector<float> f{static_cast<float>(r()), 1.5f};
  comm().all_reduce(f.data(), f.size(), dist::ReduceOp::max);
  CHECK(f[0] == static_cast<float>(n() - 1));
  CHECK(f[1] == 1.5f);
  std::vector<float> m{static_cast<float>(r()) - 3.0f};
  comm().all_reduce(m.data(), m.size(), dist::ReduceOp::min);
  CHECK(m[0] == -3.0f);
  double mean = 2 * r();
  comm().all_reduce(&mean, 1, dist::ReduceOp::mean);
  CHECK(mean == Approx(n() - 1).epsilon(1e-15));
  CHECK(comm().all_reduce(1.0, dist::ReduceOp::sum) == n());
  Array a = Array::full({2, 3}, r(), DType::float32);
  comm().all_reduce(a, dist::ReduceOp::sum);
  for (double v : a.to_vector()) CHECK(v == n() * (n() - 1) / 2);
}

TEST_CASE("communicator: started all-reduces finish on wait() in any number") {
  std::vector<double> a(1000, r()), b(7, 1.0);
  auto pa = comm().start_all_reduce(a.data(), a.size(), dist::ReduceOp::sum);
  auto pb = comm().start_all_reduce(b.data(), b.size(), dist::ReduceOp::mean);
  while (!pa->test()) {
  }
  pb->wait();
  pb->wait();  // a second wait is harmless
  CHECK(a[999] == n() * (n() - 1) / 2);
  CHECK(b[3] == 1.0);
}

TEST_CASE("communicator: broadcast of bytes strings and arrays / mismatched arrays are refused") {
  std::string s = comm().rank() == 1 ? std::string(100000, 'x') + "end" : "short";
  comm().broadcast(s, 1);
  CHECK(s.size() == 100003);
  CHECK(s.substr(100000) == "end");
  int v = comm().rank() == 0 ? 42 : -1;
  comm().broadcast(&v, sizeof v, 0);
  CHECK(v == 42);
  Array a = Array::full({4}, r(), DType::float64);
  comm().broadcast(a, static_cast<int>(n()) - 1);
  CHECK(a.to_vector() == std::vector<double>(4, n() - 1));
  Array bad = Array::zeros({comm().rank() == 0 ? std::size_t(2) : std::size_t(3)}, DType::float32);
  CHECK_THROWS_WITH(comm().broadcast(bad, 0), Catch::Contains("[broadcast]") && Catch::Contains("(2)"));
  CHECK_THROWS_AS(comm().broadcast(&v, sizeof v, comm().size()), ValueError);
  comm().barrier();
}

TEST_CASE("together: a failure on one rank reaches every rank / the lowest failing rank reports it") {
  bool caught = false;
  try {
    dist::together(comm(), [] {
      if (comm().rank() == 1) throw UsageError("[test] rank 1 has a bad flag");
    });
  } catch (const dist::CollectiveError& e) {
    caught = true;
    CHECK(e.exit_code() == 2);
    CHECK(e.reporter() == (comm().rank() == 1));
    if (e.reporter()) CHECK_THROWS_AS(e.rethrow(), UsageError);
  }
  CHECK(caught);
  CHECK_NOTHROW(dist::together(comm(), [] {}));
  // Every rank failing: rank 0 reports.
  try {
    dist::together(comm(), [] { throw FormatError("[test] everyone"); });
  } catch (const dist::CollectiveError& e) {
    CHECK(e.exit_code() == 1);
    CHECK(e.reporter() == (comm().rank() == 0));
  }
}

TEST_CASE("kernel choices: every rank takes rank 0's calibrated ratios / a failed choice is every rank's") {
  // No calibration cache: each rank would otherwise measure its own ratio (1 + its rank here).
  const char* old = std::getenv("XGRAD_CACHE_DIR");
  const std::string saved = old ? old : "";
  setenv("XGRAD_CACHE_DIR", "off", 1);
  double seen = 0.0;
  dist::agree_on_kernel_choices(comm(), [&seen] {
    seen = detail::calibrated("selftest_ratio", [] { return 1.0 + r(); }).value;
  });
  CHECK(seen == 1.0);
  CHECK(detail::calibrated("selftest_ratio", [] { return 99.0; }).value == 1.0);  // and later asks agree
  // A ratio rank 0 never asked for is each rank's own.
  CHECK(detail::calibrated("selftest_own", [] { return 1.0 + r(); }).value == 1.0 + r());
  for (const int failing : {0, 1}) {
    bool caught = false;
    try {
      dist::agree_on_kernel_choices(comm(), [failing] {
        if (comm().rank() == failing) throw ValueError("[test] XGRAD_BF16_ATTENTION: unknown value");
      });
    } catch (const dist::CollectiveError& e) {
      caught = true;
      CHECK(e.reporter() == (comm().rank() == failing));
    }
    CHECK(caught);
  }
  if (old)
    setenv("XGRAD_CACHE_DIR", saved.c_str(), 1);
  else
    unsetenv("XGRAD_CACHE_DIR");
}

TEST_CASE("parameters: broadcast from rank 0 / checksums agree / divergence is caught on every rank") {
  Tiny m(DType::float32);
  const auto params = m.named_parameters();
  Tensor w1 = m.w1;
  w1.set_value(Array::full({3}, r(), DType::float32));
  bool caught = false;
  try {
    dist::check_parameters_agree(comm(), params, "in the test");
  } catch (const dist::CollectiveError& e) {
    caught = true;
    CHECK(std::string(e.what()).find("rank(s) 1") != std::string::npos);
    CHECK(e.reporter() == (comm().rank() == 0));
  }
  CHECK(caught);
  dist::broadcast_parameters(comm(), params, 0);
  CHECK(m.w1.value().to_vector() == std::vector<double>(3, 0.0));
  CHECK_NOTHROW(dist::check_parameters_agree(comm(), params, "after the broadcast"));
}

TEST_CASE("gradient reducer: sums over ranks / a gradient on some ranks only / none anywhere stays none") {
  for (DType dt : {DType::float32, DType::float64}) {
    for (bool overlap : {false, true}) {
      for (std::size_t bucket : {std::size_t(4), std::size_t(1) << 20}) {
        Tiny m(dt);
        dist::GradientReducer::Options o;
        o.bucket_bytes = bucket;
        o.overlap = overlap;
        dist::GradientReducer reducer(comm(), m.named_parameters(), o);
        CHECK(reducer.buckets() == (bucket == 4 ? 3u : 1u));
        reducer.begin();
        // Rank k: x = k + 1; loss = sum(w1 * x) + sum(w2 * w2) * (k + 1) [+ w3 on rank 0 only].
        Tape tape;
        const Tensor x(Array::full({3}, r() + 1, dt));
        Tensor loss = ops::sum(m.w1 * x) + ops::sum(m.w2 * m.w2) * Tensor(Array::scalar(r() + 1, dt));
        if (comm().rank() == 0) loss = loss + ops::sum(m.w3);
        BackwardOptions bo;
        bo.on_leaf_grad = reducer.hook();
        CHECK(static_cast<bool>(bo.on_leaf_grad) == overlap);
        backward(loss, Array(), bo);
        reducer.reduce();
        const double total = n() * (n() + 1) / 2;  // sum of (k + 1)
        for (double g : m.w1.grad().to_vector()) CHECK(g == total);
        for (double g : m.w2.grad().to_vector()) CHECK(g == 2 * 0.5 * total);
        CHECK(m.w3.has_grad());  // rank 0's gradient, the others contributing zeros
        if (m.w3.has_grad()) CHECK(m.w3.grad().to_vector() == std::vector<double>{1.0});
        CHECK(reducer.last_seconds() >= 0.0);
        // A step with no gradient anywhere for w3: it keeps none (the optimizer skips it).
        m.zero_grad();
        Tape tape2;
        Tensor loss2 = ops::sum(m.w1 * x);
        bo.on_leaf_grad = reducer.hook();
        backward(loss2, Array(), bo);
        reducer.reduce();
        CHECK_FALSE(m.w3.has_grad());
        CHECK_FALSE(m.w2.has_grad());
        CHECK(m.w1.grad().to_vector() == std::vector<double>(3, total));
      }
    }
  }
}

int main(int argc, char** argv) {
  std::unique_ptr<dist::Communicator> c;
  try {
    c = dist::launch();
  } catch (const std::exception& e) {
    std::cerr << "dist_selftest: " << e.what() << "\n";
    return 1;
  }
  if (c->size() < 2) {
    std::cerr << "dist_selftest: run it with mpirun -np 2 (or more); this is a world of " << c->size() << "\n";
    return 1;
  }
  g_comm = c.get();
  Catch::Session session;
  const int rc = session.run(argc, argv);
  // Every rank's verdict: the job fails if any rank failed.
  const double worst = c->all_reduce(static_cast<double>(rc), dist::ReduceOp::max);
  if (c->rank() == 0) std::cout << "dist_selftest: " << c->size() << " ranks, " << (worst == 0 ? "all passed" : "FAILED") << "\n";
  return worst == 0 ? 0 : 1;
}
