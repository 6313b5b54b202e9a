// The suite's own comparison of bits (support/helpers: differing_bits, same_bits, and through
// them XGT_CHECK_SAME): a test that asserts "the same bits" must tell apart what equal values
// hide, a signed zero and a NaN's payload, and must count each differing element once.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "helpers.hpp"

using namespace xg;

namespace {
template <class T> T nan_with_payload(std::uint64_t payload) {
  T v = std::numeric_limits<T>::quiet_NaN();
  if constexpr (sizeof(T) == 4) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits |= static_cast<std::uint32_t>(payload & 0x3FFFFF);
    std::memcpy(&v, &bits, 4);
  } else {
    std::uint64_t bits;
    std::memcpy(&bits, &v, 8);
    bits |= payload & 0x7FFFFFFFFFFFFull;
    std::memcpy(&v, &bits, 8);
  }
  return v;
}

template <class T> void check_bits(DType dt) {
  const T nan1 = nan_with_payload<T>(1), nan2 = nan_with_payload<T>(2);
  const Array a = Array::from_vector({5}, {1.5, 0.0, 2.0, 0.0, 3.0}, dt);
  Array b = a.clone();
  CHECK(xgt::differing_bits(a, b) == 0);
  CHECK(xgt::same_bits(a, b));
  b.data<T>()[1] = -T(0);  // equal values, other bits
  CHECK(xg::max_abs_diff(a, b) == 0.0);
  CHECK(xgt::differing_bits(a, b) == 1);
  CHECK_FALSE(xgt::same_bits(a, b));
  b.data<T>()[3] = -T(0);
  b.data<T>()[4] = std::nextafter(T(3), T(4));  // one ulp
  CHECK(xgt::differing_bits(a, b) == 3);
  Array n1 = Array::from_vector({2}, {0.0, 0.0}, dt), n2 = n1.clone();
  n1.data<T>()[0] = nan1;
  n2.data<T>()[0] = nan1;
  CHECK(xgt::same_bits(n1, n2));  // the same NaN is the same bits (NaN != NaN as a value)
  n2.data<T>()[0] = nan2;
  CHECK(xgt::differing_bits(n1, n2) == 1);
  CHECK_FALSE(xgt::same_bits(a, Array::from_vector({4}, {1.5, 0.0, 2.0, 0.0}, dt)));  // another shape
}
}  // namespace

TEST_CASE("test helpers: differing_bits tells a signed zero and a NaN payload from equal values",
          "[suite][helpers]") {
  check_bits<float>(DType::float32);
  check_bits<double>(DType::float64);
  const Array f = Array::from_vector({1}, {1.0}, DType::float32), d = Array::from_vector({1}, {1.0}, DType::float64);
  CHECK_FALSE(xgt::same_bits(f, d));  // another dtype
}
