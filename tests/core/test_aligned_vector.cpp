// core/detail/aligned_vector.hpp: the scratch buffers of the fused attention and of the GEMM
// doorway's partial sums start on a cache line whatever their size, above malloc's mmap threshold
// too (where a plain std::vector's block starts 16 bytes past a page), and keep their values as
// they grow.
#include <catch2/catch.hpp>

#include <cstdint>

#include <xgrad/core/detail/aligned_vector.hpp>

using xg::detail::AlignedVector;

namespace {
template <class T> std::uintptr_t offset_in_line(const AlignedVector<T>& v) {
  return reinterpret_cast<std::uintptr_t>(v.data()) % 64;
}
}  // namespace

TEMPLATE_TEST_CASE("AlignedVector data starts on a cache line at every size", "[aligned_vector]", float, double,
                   std::uint16_t) {
  // 1 element, odd sizes, one just past a line, and (for float) blocks of 160 KiB and 4 MiB, which
  // malloc maps on their own
  for (const std::size_t n : {std::size_t(1), std::size_t(3), std::size_t(17), std::size_t(1000),
                              std::size_t(40961), std::size_t(1) << 20}) {
    AlignedVector<TestType> v(n, TestType(1));
    INFO("elements " << n << ", data() at " << static_cast<const void*>(v.data()));
    CHECK(offset_in_line(v) == 0);
  }
}

TEST_CASE("AlignedVector keeps its values and its alignment as it grows", "[aligned_vector]") {
  AlignedVector<float> v;
  std::size_t n = 5;
  for (int round = 0; round < 12; ++round, n = n * 3 + 1) {  // 5, 16, 49, ... 974,308 elements
    const std::size_t old = v.size();
    v.resize(n);
    for (std::size_t i = old; i < n; ++i) v[i] = static_cast<float>(i % 1021);
    INFO("round " << round << ": " << n << " elements, data() at " << static_cast<const void*>(v.data()));
    REQUIRE(offset_in_line(v) == 0);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += v[i] != static_cast<float>(i % 1021);
    CHECK(wrong == 0);
  }
}
