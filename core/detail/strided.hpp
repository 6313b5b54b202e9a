// Internal: n-d iteration with per-operand strides (0 on broadcast axes). The innermost
// axis is a plain loop so the compiler can vectorise it.
#pragma once

#include <vector>

#include <xgrad/core/shape.hpp>

namespace xg::detail {

// Calls f(i, off_a, off_b) for every flat output index i of `shape`, with the element
// offsets of the two operands given their strides sa, sb.
template <class F>
void for_each_strided(const Shape& shape, const std::vector<std::ptrdiff_t>& sa,
                      const std::vector<std::ptrdiff_t>& sb, F&& f) {
  const std::size_t nd = shape.size();
  const std::size_t n = numel(shape);
  if (n == 0) return;
  if (nd == 0) {
    f(std::size_t{0}, std::ptrdiff_t{0}, std::ptrdiff_t{0});
    return;
  }
  std::vector<std::size_t> idx(nd, 0);
  std::ptrdiff_t oa = 0, ob = 0;
  const std::size_t last = shape[nd - 1];
  const std::ptrdiff_t la = sa[nd - 1], lb = sb[nd - 1];
  for (std::size_t i = 0; i < n; i += last) {
    for (std::size_t k = 0; k < last; ++k)
      f(i + k, oa + static_cast<std::ptrdiff_t>(k) * la, ob + static_cast<std::ptrdiff_t>(k) * lb);
    for (std::size_t d = nd - 1; d-- > 0;) {
      ++idx[d];
      oa += sa[d];
      ob += sb[d];
      if (idx[d] < shape[d]) break;
      oa -= sa[d] * static_cast<std::ptrdiff_t>(shape[d]);
      ob -= sb[d] * static_cast<std::ptrdiff_t>(shape[d]);
      idx[d] = 0;
    }
  }
}

}  // namespace xg::detail
