// The allocator's blocks and the bits of results: an elementwise op on the same values gives
// the same bits wherever its arrays were placed. xtensor's SIMD assignment sends the elements
// before the first aligned address through the scalar function and the rest through the
// vector one (tanh, exp differ there in the last place), so small blocks must be aligned as the
// large ones (core/allocator.cpp) for a run and its resumption to agree bit for bit.
#include <cstdint>
#include <set>
#include <vector>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("allocator: small arrays are 64-byte aligned and tanh of the same values has the same bits",
          "[allocator]") {
  Generator g(1);
  const Array x = random_uniform({13}, g, DType::float64, -3, 3);
  const Array first = ops::tanh(Tensor(x)).value();
  std::set<std::uintptr_t> offsets;
  std::vector<Array> keep;  // blocks of every small size held, so that later ones land elsewhere
  for (std::size_t n = 1; n <= 40; ++n) {
    keep.push_back(Array::zeros({n}, DType::float64));
    const Array y = ops::tanh(Tensor(x)).value();
    offsets.insert(reinterpret_cast<std::uintptr_t>(y.data<double>()) % 64);
    XGT_CHECK_SAME(y, first);
  }
  CHECK(offsets == std::set<std::uintptr_t>{0});
}
