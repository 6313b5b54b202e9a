// index_select, gather and embedding (ops/index.hpp): values and scatter-add VJPs.
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("index_select/gather/embedding: values", "[ops][index]") {
  const Tensor w(Array::of({{0.0, 0.5}, {1.0, 1.5}, {2.0, 2.5}}));
  const Tensor e = ops::embedding(w, IndexArray({2, 2}, {2, 0, 2, 1}));
  CHECK(e.shape() == Shape{2, 2, 2});
  CHECK(e.value().to_vector() == std::vector<double>{2, 2.5, 0, 0.5, 2, 2.5, 1, 1.5});
  const Tensor gth = ops::gather(w, 1, IndexArray({3, 1}, {1, 0, 1}));
  CHECK(gth.value().to_vector() == std::vector<double>{0.5, 1.0, 2.5});
}
