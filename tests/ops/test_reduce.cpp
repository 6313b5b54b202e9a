// Reductions: values, keepdims, tie rule, and gradchecks over axis sets.
#include <cmath>
#include <cstdint>
#include <iomanip>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {
const std::vector<Axes> kAxisSets = {{}, {0}, {-1}, {0, 2}, {1}, {-3, -1}};
}

TEST_CASE("sum/mean: values and shapes with and without keepdims", "[ops][reduce]") {
  const Tensor x(Array::of({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}));
  CHECK(ops::sum(x).item() == 21);
  CHECK(ops::sum(x, {0}).value().to_vector() == std::vector<double>{5, 7, 9});
  CHECK(ops::sum(x, {1}, true).shape() == Shape{2, 1});
  CHECK(ops::mean(x, {-1}).value().to_vector() == std::vector<double>{2, 5});
  CHECK(ops::sum(x, {0, 1}, true).shape() == Shape{1, 1});
  CHECK(ops::max(x, {0}).value().to_vector() == std::vector<double>{4, 5, 6});
  CHECK(ops::var(x, {1}).value().to_vector() == std::vector<double>{1, 1});           // unbiased
  CHECK(ops::var(x, {1}, 0).value().at({0}) == Approx(2.0 / 3.0));                  // population
}

TEST_CASE("max: tie rule splits the gradient equally among maximal elements", "[ops][reduce]") {
  Tensor x(Array::of({{1.0, 3.0, 3.0}, {2.0, 2.0, 2.0}}), true);
  Tensor m = ops::max(x, {1});
  CHECK(m.value().to_vector() == std::vector<double>{3, 2});
  m.backward(Array::of({1.0, 6.0}));
  CHECK(x.grad().to_vector() == std::vector<double>{0, 0.5, 0.5, 2, 2, 2});
}

TEST_CASE("sum: a whole large array adds every element at 1 2 and 3 threads", "[ops][reduce]") {
  // Small integers: every partial sum is exact in float32 whatever the order of the additions, so
  // the result must be the exact sum (each element counted once, the odd tails included).
  for (const std::size_t n : {std::size_t(15), std::size_t(17), (std::size_t(1) << 20) + 7})
    for (const int threads : {1, 2, 3}) {
      const ThreadCount scope(threads);
      for (const DType dt : {DType::float32, DType::float64}) {
        INFO(n << " elements, " << threads << " threads, " << dtype_name(dt));
        Array a = Array::empty({n}, dt);
        std::int64_t exact = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const std::int64_t v = static_cast<std::int64_t>((i * 7919) % 7) - 3 + (i + 1 == n ? 5 : 0);
          a.set_flat(i, static_cast<double>(v));
          exact += v;
        }
        const double got = ops::sum(Tensor(a)).item();
        CHECK(got == static_cast<double>(exact));
        CHECK(ops::sum(Tensor(a)).item() == got);  // run to run
      }
    }
  // Values that round: within float32 rounding of the float64 sum (16 lanes a chunk).
  Generator g(5);
  const Array x = rnd({(std::size_t(1) << 20) + 3}, g).astype(DType::float32);
  double ref = 0, abs_sum = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    ref += x.flat(i);
    abs_sum += std::fabs(x.flat(i));
  }
  const double got = ops::sum(Tensor(x)).item();
  INFO("float32 sum " << std::setprecision(17) << got << ", float64 sum " << ref);
  CHECK(std::fabs(got - ref) <= 1e-4 * abs_sum);
}
