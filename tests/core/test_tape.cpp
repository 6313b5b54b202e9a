// The engine: tensors, the tape, backward, grad mode, lifetime, custom ops, anomaly mode.
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>
#include <unistd.h>

#include <xgrad/core/detail/sanitizer.hpp>
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("tensor: creation helpers give the requested shapes/dtypes and values", "[core]") {
  CHECK(zeros({2, 3}).shape() == Shape{2, 3});
  CHECK(zeros({2, 3}).dtype() == default_dtype());  // float64 in this suite (tests/support/catch_main.cpp); tests/core/test_dtype_defaults.cpp checks both
  CHECK(ones({4}, DType::float64).value().to_vector() == std::vector<double>{1, 1, 1, 1});
  CHECK(full({2}, 2.5).value().to_vector() == std::vector<double>{2.5, 2.5});
  CHECK(arange(0, 5).value().to_vector() == std::vector<double>{0, 1, 2, 3, 4});
  CHECK(arange(1, 2, 0.25, DType::float64).value().to_vector() == std::vector<double>{1, 1.25, 1.5, 1.75});
  const Array m = Array::of({{1, 2, 3}, {4, 5, 6}});
  CHECK(m.shape() == Shape{2, 3});
  CHECK(m.at({1, 2}) == 6);
  const Array c = Array::of3({{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}});
  CHECK(c.shape() == Shape{2, 2, 2});
  CHECK(c.at({1, 0, 1}) == 6);
  CHECK_THROWS_AS(Array::of({{1, 2}, {3}}), ShapeError);
  CHECK(Tensor(Array::scalar(3.0, DType::float64)).item() == 3.0);
}

TEST_CASE("tensor: seeded generators are reproducible and seeds differ", "[core]") {
  Generator a(42), b(42), c(43);
  const Array ra = random_normal({100}, a), rb = random_normal({100}, b), rc = random_normal({100}, c);
  CHECK(ra.to_vector() == rb.to_vector());
  CHECK(ra.to_vector() != rc.to_vector());
  // Moments of 100k standard normals: mean within 5 standard errors of 0, variance near 1.
  Generator g(7);
  const auto v = random_normal({100000}, g).to_vector();
  double s = 0, s2 = 0;
  for (double x : v) s += x, s2 += x * x;
  const double mean = s / v.size(), var = s2 / v.size() - mean * mean;
  CHECK(std::fabs(mean) < 5.0 / std::sqrt(100000.0));
  CHECK(std::fabs(var - 1.0) < 0.02);
  const auto u = random_uniform({1000}, g, DType::float64, 2.0, 3.0).to_vector();
  for (double x : u) REQUIRE((x >= 2.0 && x < 3.0));
}

TEST_CASE("tensor: generator state round-trips exactly", "[core]") {
  Generator g(5);
  g.normal();  // leaves a spare normal in the state
  const std::string st = g.state();
  const double a = g.normal(), b = g.uniform();
  Generator h(0);
  h.set_state(st);
  CHECK(h.normal() == a);
  CHECK(h.uniform() == b);
}

TEST_CASE("array: first_nonfinite finds the first inf or NaN at any position in float32 and float64", "[core]") {
  // The search tests chunks of 1024 values branch-free first: positions around the chunk
  // edges, the last value, two bad values (the first counts), and the largest finite values.
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const DType dt : {DType::float32, DType::float64}) {
    const std::size_t n = 3000;
    Array a = Array::full({n}, 1.5, dt);
    CHECK(a.first_nonfinite() == n);
    a.set_flat(7, dt == DType::float32 ? 3.4e38 : 1.7e308);  // finite, largest exponent below all ones
    a.set_flat(8, dt == DType::float32 ? -3.4e38 : -1.7e308);
    CHECK(a.first_nonfinite() == n);
    CHECK(a.all_finite());
    for (const std::size_t at : {std::size_t(0), std::size_t(1023), std::size_t(1024), std::size_t(2047),
                                 std::size_t(2048), n - 1})
      for (const double bad : {inf, -inf, nan}) {
        INFO(dtype_name(dt) << " at " << at << " value " << bad);
        Array b = a.clone();
        b.set_flat(at, bad);
        CHECK(b.first_nonfinite() == at);
        b.set_flat(n - 1 == at ? 0 : n - 1, nan);  // a second one further on (or before)
        CHECK(b.first_nonfinite() == (n - 1 == at ? 0 : at));
        CHECK_FALSE(b.all_finite());
      }
  }
}

// Arrays from 2^17 values are searched over the pool in contiguous ranges (the attention checks
// its inputs before every pass): the first non-finite value wins whichever range (and thread)
// finds one, at 1, 2 and 3 threads, with bad values in the first, a middle and the last range.
TEST_CASE("array: first_nonfinite of a large array searched over the pool finds the first bad value", "[core]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const std::size_t n = (std::size_t(1) << 19) + 5;  // 8 ranges at 2 threads (4 a thread), an odd tail
  for (const int threads : {1, 2, 3}) {
    const ThreadCount scope(threads);
    for (const DType dt : {DType::float32, DType::float64}) {
      Array a = Array::full({n}, -2.5, dt);
      CHECK(a.first_nonfinite() == n);
      for (const std::size_t at : {std::size_t(0), n / 8 - 1, n / 8, n / 2 + 3, n - 1}) {
        INFO(threads << " threads, " << dtype_name(dt) << ", first bad value at " << at);
        Array b = a.clone();
        b.set_flat(at, nan);
        CHECK(b.first_nonfinite() == at);
        // more further on, in later ranges: the first still counts
        for (const std::size_t later : {at + 1, at + n / 4, n - 1})
          if (later > at && later < n) b.set_flat(later, later % 2 ? inf : -inf);
        CHECK(b.first_nonfinite() == at);
      }
    }
  }
}

TEST_CASE("array: full and zeros of a large array filled over the pool set every element", "[core]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // Below the split (one fill), just above it, and 8 ranges at 2 threads with an odd tail.
  for (const std::size_t n : {(std::size_t(1) << 17) - 1, std::size_t(1) << 17, (std::size_t(1) << 19) + 5})
    for (const int threads : {1, 2, 3}) {
      const ThreadCount scope(threads);
      for (const DType dt : {DType::float32, DType::float64})
        for (const double value : {0.0, -1.25}) {
          INFO(n << " elements, " << threads << " threads, " << dtype_name(dt) << ", value " << value);
          { const Array dirty = Array::full({n}, nan, dt); }  // its block goes back to the cache...
          const Array a = value == 0.0 ? Array::zeros({n}, dt) : Array::full({n}, value, dt);  // ...and comes back
          const std::vector<double> v = a.to_vector();
          std::size_t wrong = 0, first = n;
          for (std::size_t i = 0; i < n; ++i)
            if (!(v[i] == value) || std::signbit(v[i]) != std::signbit(value)) {
              if (!wrong) first = i;
              ++wrong;
            }
          INFO("first wrong element " << first);
          CHECK(wrong == 0);
        }
    }
}

TEST_CASE("tape: backward of a scalar gives the derivative", "[core][tape]") {
  Tensor x(Array::of({1.0, -2.0, 3.0}), true);
  Tensor y = ops::sum(x * x * x);  // dy/dx = 3 x^2
  y.backward();
  CHECK(x.grad().to_vector() == std::vector<double>{3, 12, 27});
}

TEST_CASE("tape: a tensor used several times receives the sum of its gradients", "[core][tape]") {
  Tensor x(Array::of({0.5, 2.0}), true);
  Tensor y = ops::sum(x * x + x + ops::exp(x));  // 2x + 1 + e^x
  y.backward();
  CHECK(x.grad().at({0}) == Approx(2 * 0.5 + 1 + std::exp(0.5)));
  CHECK(x.grad().at({1}) == Approx(2 * 2.0 + 1 + std::exp(2.0)));
}

TEST_CASE("tape: leaf gradients accumulate across steps until zero_grad", "[core][tape]") {
  Tensor w(Array::of({1.0, 2.0}), true);
  for (int step = 0; step < 3; ++step) ops::sum(w * 2.0).backward();
  CHECK(w.grad().to_vector() == std::vector<double>{6, 6});
  w.zero_grad();
  CHECK_FALSE(w.has_grad());
  ops::sum(w * 2.0).backward();
  CHECK(w.grad().to_vector() == std::vector<double>{2, 2});
}

TEST_CASE("tape: backward of a non-scalar takes a seed of the same shape", "[core][tape]") {
  Tensor x(Array::of({{1.0, 2.0}, {3.0, 4.0}}), true);
  Tensor y = x * x;
  y.backward(Array::of({{1.0, 0.0}, {0.5, -1.0}}));
  CHECK(x.grad().to_vector() == std::vector<double>{2, 0, 3, -8});
}

TEST_CASE("tape: retain_graph allows a second backward and sums again", "[core][tape]") {
  Tensor x(Array::of({3.0}), true);
  Tensor y = ops::sum(x * x);
  BackwardOptions keep;
  keep.retain_graph = true;
  backward(y, Array(), keep);
  backward(y);
  CHECK(x.grad().item() == 12.0);
  CHECK_THROWS_AS(backward(y), TapeError);  // the second, consuming pass freed the graph
}

TEST_CASE("tape: no_grad records nothing and its results need no grad", "[core][tape]") {
  Tape tape;
  Tensor x(Array::of({1.0, 2.0}), true);
  {
    NoGradGuard ng;
    Tensor y = ops::exp(x) * 2.0;
    CHECK_FALSE(y.requires_grad());
    CHECK(tape.size() == 0);
  }
  CHECK(grad_enabled());
  Tensor z = ops::exp(x);
  CHECK(z.requires_grad());
  CHECK(tape.size() == 1);
}

TEST_CASE("tape: tensors that need no gradient record nothing", "[core][tape]") {
  Tape tape;
  Tensor a(Array::of({1.0, 2.0})), b(Array::of({3.0, 4.0}));
  Tensor c = ops::sum(ops::tanh(a * b + a));
  CHECK_FALSE(c.requires_grad());
  CHECK(tape.size() == 0);
  Tensor w(Array::of({1.0, 1.0}), true);
  Tensor d = a * w;  // requires_grad propagates from w
  CHECK(d.requires_grad());
  CHECK_FALSE(d.is_leaf());
  CHECK(tape.size() == 1);
}

TEST_CASE("tape: detach cuts the gradient path", "[core][tape]") {
  Tensor x(Array::of({2.0}), true);
  Tensor y = x * x;
  Tensor z = ops::sum(y.detach() * x);  // d/dx = y = x^2 = 4 (no path through y)
  z.backward();
  CHECK(x.grad().item() == 4.0);
  CHECK_FALSE(y.detach().requires_grad());
}

TEST_CASE("tape: grad() returns gradients for leaves and intermediates without touching .grad",
          "[core][tape]") {
  Tensor x(Array::of({1.0, 2.0}), true);
  Tensor h = x * 3.0;
  Tensor y = ops::sum(h * h);  // dy/dh = 2h = 6x, dy/dx = 18x
  const auto g = grad(y, {x, h});
  CHECK(g[0].to_vector() == std::vector<double>{18, 36});
  CHECK(g[1].to_vector() == std::vector<double>{6, 12});
  CHECK_FALSE(x.has_grad());
  Tensor unused(Array::of({5.0}), true);
  Tensor y2 = ops::sum(x * 2.0);
  const auto g2 = grad(y2, {unused});
  CHECK(g2[0].to_vector() == std::vector<double>{0});  // independent input: zeros, as in JAX
}

TEST_CASE("tape: a tensor whose tape is gone or consumed raises a clear error", "[core][tape][errors]") {
  Tensor x(Array::of({1.0}), true);
  Tensor stale;
  {
    Tape tape;
    stale = x * 2.0;
  }
  CHECK_THROWS_WITH(stale * 3.0, Catch::Contains("[mul]") && Catch::Contains("no longer exists"));
  CHECK_THROWS_AS(stale.backward(), TapeError);
  CHECK(stale.detach().item() == 2.0);  // its value stays usable as a constant

  Tape tape;
  Tensor y = x * 2.0;
  Tensor loss = ops::sum(y);
  loss.backward();
  CHECK_THROWS_WITH(loss.backward(), Catch::Contains("[backward]") && Catch::Contains("consumed"));
  CHECK_THROWS_WITH(y + 1.0, Catch::Contains("[add]") && Catch::Contains("consumed"));
  Tensor z = x * 2.0;
  tape.clear();
  CHECK_THROWS_AS(ops::exp(z), TapeError);
}

TEST_CASE("tape: a scoped tape is current and the tape is empty after backward", "[core][tape]") {
  Tensor w(Array::of({0.5, -0.5}), true);
  Tape tape;
  Tensor loss = ops::sum(ops::tanh(w) * 3.0);
  CHECK(tape.size() == 3);
  CHECK(tape.op_at(0) == "tanh");
  CHECK(tape.inputs_at(0) == 1);
  CHECK(tape.op_at(1) == "mul");  // a tensor and a number: one input
  CHECK(tape.inputs_at(1) == 1);
  CHECK_THROWS_WITH(tape.inputs_at(3), Catch::Contains("[tape] position 3 is past the end (3 nodes)"));
  CHECK_THROWS_WITH(tape.op_at(3), Catch::Contains("[tape] position 3 is past the end (3 nodes)"));
  const auto gen = tape.generation();
  loss.backward();
  CHECK(tape.size() == 0);
  CHECK(tape.generation() == gen + 1);
}

namespace {
long resident_kib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, rss = 0;
  f >> pages >> rss;
  return rss * sysconf(_SC_PAGESIZE) / 1024;
}
}  // namespace

TEST_CASE("tape: memory stays flat across 10000 forward/backward steps", "[core][tape]") {
  Generator g(3);
  Tensor W(random_normal({16, 16}, g), true);
  Tensor x(random_normal({8, 16}, g));
  std::weak_ptr<detail::TensorImpl> watch = W.impl();
  auto step = [&] {
    Tape tape;
    Tensor loss = ops::mean(ops::softmax(ops::matmul(x, W), -1) * x);
    loss.backward();
    REQUIRE(tape.size() == 0);
    W.zero_grad();
  };
  for (int i = 0; i < 500; ++i) step();  // warm up allocator pools
  const long before = resident_kib();
  for (int i = 0; i < 10000; ++i) step();
  const long after = resident_kib();
  INFO("resident memory before " << before << " KiB, after " << after << " KiB");
#if !XG_UNDER_ASAN
  CHECK(after - before < 2048);
#else
  (void)before;  // AddressSanitizer's quarantine holds freed memory on purpose: RSS says nothing here
  (void)after;
#endif
  CHECK(watch.use_count() == 1);  // nothing but W itself holds the parameter
}

TEST_CASE("tape: a deep chain of 200000 ops runs backward without recursion", "[core][tape]") {
  Tensor x(Array::of({1.0}), true);
  Tensor y = x;
  for (int i = 0; i < 200000; ++i) y = y * 1.0;
  ops::sum(y).backward();
  CHECK(x.grad().item() == 1.0);
}

TEST_CASE("tape: custom op with a user VJP matches the composed gradient", "[core][tape][custom]") {
  // cube(x) = x^3 with a hand-written VJP 3 x^2 g, recorded through custom_op.
  auto cube = [](const Tensor& x) {
    return custom_op(
        "cube", {x},
        [](const std::vector<Array>& in) {
          return ops::mul(Tensor(in[0]), ops::mul(Tensor(in[0]), Tensor(in[0]))).value();
        },
        [](const VjpContext& c) {
          NoGradGuard ng;
          const Tensor x(c.inputs[0]);
          return Cotangents{(Tensor(c.grad_output) * x * x * 3.0).value()};
        });
  };
  Generator g(11);
  const Array x0 = rnd({2, 3}, g);
  const auto r = require_gradcheck([&](const std::vector<Tensor>& in) { return cube(in[0]); }, {x0}, {"x"});
  CHECK(r.mode == "full");
  Tensor a(x0, true), b(x0, true);
  ops::sum(cube(a) * 2.0).backward();
  ops::sum(ops::pow(b, 3) * 2.0).backward();
  require_close(a.grad(), b.grad(), 1e-12);
}

TEST_CASE("tape: a VJP returning the wrong shape is caught and names the op", "[core][tape][errors]") {
  Tensor x(Array::of({1.0, 2.0}), true);
  Tensor y = custom_op(
      "bad_shape", {x}, [](const std::vector<Array>& in) { return in[0].clone(); },
      [](const VjpContext&) { return Cotangents{Array::zeros({3}, DType::float64)}; });
  CHECK_THROWS_WITH(ops::sum(y).backward(),
                    Catch::Contains("[bad_shape vjp]") && Catch::Contains("(3)") && Catch::Contains("(2)"));
  Tensor z = custom_op(
      "bad_arity", {x}, [](const std::vector<Array>& in) { return in[0].clone(); },
      [](const VjpContext&) { return Cotangents{}; });
  CHECK_THROWS_AS(ops::sum(z).backward(), InternalError);
}

TEST_CASE("tape: anomaly mode reports the first non-finite forward value with op and position",
          "[core][tape][anomaly]") {
  Tape tape;
  Tensor x(Array::of({1.0, 0.0}), true);
  Tensor y = x * 2.0;  // 'mul' at tape position 0 (the scalar 2 is a constant, not an op)
  AnomalyModeGuard on;
  CHECK_THROWS_WITH(ops::log(y), Catch::Contains("[log]") && Catch::Contains("tape position 1") &&
                                     Catch::Contains("flat index 1"));
}

TEST_CASE("tape: anomaly mode reports a non-finite cotangent in backward", "[core][tape][anomaly]") {
  Tape tape;
  Tensor x(Array::of({4.0, 0.0}), true);
  Tensor y = ops::sum(ops::sqrt(x));  // d sqrt(x)/dx = inf at 0
  {
    AnomalyModeGuard on;
    CHECK_THROWS_WITH(y.backward(), Catch::Contains("[sqrt]") && Catch::Contains("backward"));
  }
  CHECK_FALSE(anomaly_mode());
}

TEST_CASE("tape: anomaly mode is off by default and does not interfere", "[core][tape][anomaly]") {
  CHECK_FALSE(anomaly_mode());
  Tensor x(Array::of({0.0}), true);
  Tensor y = ops::log(x);  // -inf is a legitimate value of log(0)
  CHECK(std::isinf(y.item()));
}

TEST_CASE("tape: float32 and float64 run the same op code and agree", "[core][dtype]") {
  Generator g(9);
  const Array a64 = rnd({3, 4}, g), b64 = rnd({4, 2}, g);
  auto run = [](const Array& a, const Array& b) {
    Tensor A(a, true), B(b, true);
    Tensor y = ops::sum(ops::softmax(ops::matmul(A, B), -1) * ops::tanh(ops::matmul(A, B)));
    y.backward();
    return std::vector<Array>{y.value(), A.grad(), B.grad()};
  };
  const auto r64 = run(a64, b64);
  const auto r32 = run(a64.astype(DType::float32), b64.astype(DType::float32));
  CHECK(r32[1].dtype() == DType::float32);
  for (std::size_t i = 0; i < 3; ++i) CHECK(max_abs_diff(r32[i].astype(DType::float64), r64[i]) < 1e-5);
}

// A recorded tensor knows its tape by a serial number, not by a reference (core/tape.cpp): a tape
// made after another one is gone (often at the same address) must still refuse the gone tape's
// tensors, and a live tape must refuse another live tape's.
TEST_CASE("tape: a gone tape's tensor is refused by the tapes made after it and a live tape's by another",
          "[core][tape][errors]") {
  Tensor x(Array::of({1.0}), true);
  for (int round = 0; round < 4; ++round) {
    Tensor stale;
    {
      Tape gone;
      stale = x * 2.0;
      CHECK(Tape::current_size() == 1);
    }
    Tape next;
    CHECK_THROWS_WITH(stale * 3.0, Catch::Contains("[mul]") && Catch::Contains("no longer exists"));
    CHECK_THROWS_WITH(stale.backward(), Catch::Contains("[backward]") && Catch::Contains("no longer exists"));
    Tensor fresh = x * 2.0;  // the new tape records as usual
    ops::sum(fresh * 3.0).backward();
    CHECK(x.grad().item() == 6.0);
    x.zero_grad();
  }
  Tape outer;
  const Tensor a = x * 2.0;
  {
    Tape inner;
    CHECK_THROWS_WITH(a * 3.0, Catch::Contains("[mul]") && Catch::Contains("input 0 was recorded on another tape"));
  }
  CHECK((a * 3.0).item() == 6.0);  // back on its own tape
}

TEST_CASE("tape: grad() fills every position of a repeated wrt and refuses another tape's tensor",
          "[core][tape][errors]") {
  Tensor x(Array::of({1.0, 2.0}), true);
  Tensor h = x * 3.0;
  const auto g = grad(ops::sum(h * h), {x, h, x, h});
  CHECK(g[0].to_vector() == std::vector<double>{18, 36});
  CHECK(g[2].to_vector() == std::vector<double>{18, 36});
  CHECK(g[1].to_vector() == std::vector<double>{6, 12});
  CHECK(g[3].to_vector() == std::vector<double>{6, 12});

  Tape first;
  Tensor a(Array::of({1.0, 2.0}), true);
  Tensor on_first = a * 10.0;
  Tape second;
  Tensor b(Array::of({3.0, 4.0}), true);
  Tensor z = b * 5.0;
  CHECK_THROWS_WITH(grad(ops::sum(z * z), {on_first}),
                    Catch::Contains("[grad]") && Catch::Contains("wrt[0] was recorded on another tape"));
}

TEST_CASE("tape: a VJP that runs tensor ops without no_grad neither records nor corrupts the sweep",
          "[core][tape][custom]") {
  Tensor w(Array::of({2.0, 3.0}), true);  // captured by the VJP, requires grad
  Tensor x(Array::of({1.0, -1.0}), true);
  Tape tape;
  Tensor y = custom_op(
      "scale_by_w", {x}, [&](const std::vector<Array>& in) { return (Tensor(in[0]) * w.detach()).value(); },
      [&](const VjpContext& c) {
        // No NoGradGuard here: w requires grad, so this would record on the tape mid-sweep.
        return Cotangents{(Tensor(c.grad_output) * w).value()};
      });
  const std::size_t before = tape.size();
  for (int i = 0; i < 3; ++i) y = y * 1.0;  // more nodes after it, so a record would reallocate
  ops::sum(y).backward();
  CHECK(before == 1);
  CHECK(x.grad().to_vector() == std::vector<double>{2, 3});
  CHECK_FALSE(w.has_grad());  // w was a constant inside the VJP
}

TEST_CASE("tape: a VJP that throws leaves every leaf gradient as it was", "[core][tape][errors]") {
  Tensor a(Array::of({1.0}), true), b(Array::of({2.0}), true);
  ops::sum(a * b).backward();  // a.grad = 2, b.grad = 1
  Tensor failing = custom_op(
      "fails", {b}, [](const std::vector<Array>& in) { return in[0].clone(); },
      [](const VjpContext&) -> Cotangents { throw ValueError("[fails vjp] deliberate"); });
  // Recorded after `failing`, so the sweep reaches a * 5 first and hands a its gradient 5
  // before the failing VJP runs.
  Tensor y = ops::sum(failing + a * 5.0);
  CHECK_THROWS_WITH(y.backward(), Catch::Contains("deliberate"));
  CHECK(a.grad().to_vector() == std::vector<double>{2});
  CHECK(b.grad().to_vector() == std::vector<double>{1});
}
