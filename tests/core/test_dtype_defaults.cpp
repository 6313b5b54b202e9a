// The one default dtype (core/shape.hpp): creation helpers and layers follow it, and it can be
// set. The suite runs with float64 (tests/support/catch_main.cpp); each test restores it.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {
// Restores the default dtype when a test changes it (the suite runs with float64).
struct DefaultDTypeGuard {
  DType saved = default_dtype();
  ~DefaultDTypeGuard() { set_default_dtype(saved); }
};
}  // namespace

TEST_CASE("default dtype: one default for creation helpers and layers and it can be set", "[core][dtype]") {
  DefaultDTypeGuard guard;
  Generator g(2);
  for (const DType d : {DType::float32, DType::float64}) {
    set_default_dtype(d);
    CHECK(default_dtype() == d);
    CHECK(Array::of({1.0}).dtype() == d);
    CHECK(Array::of({{1.0, 2.0}, {3.0, 4.0}}).dtype() == d);
    CHECK(random_normal({2}, g).dtype() == d);
    CHECK(random_uniform({2}, g).dtype() == d);
    CHECK(zeros({2}).dtype() == d);
    CHECK(ones({2}).dtype() == d);
    CHECK(full({2}, 3.0).dtype() == d);
    CHECK(arange(0, 3).dtype() == d);
    CHECK(randn({2}, g).dtype() == d);
    CHECK(Linear(2, 2, g).W.dtype() == d);
    CHECK(Embedding(3, 2, g).weight.dtype() == d);
    CHECK(LayerNorm(2).gamma.dtype() == d);
    CHECK(AttentionConfig().dtype == d);
    CHECK(CrossAttentionConfig().dtype == d);
    CHECK(TransformerConfig().dtype == d);
  }
}
