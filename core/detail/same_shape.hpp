// Internal: shape equality for the per-op path. The shapes there have a handful of extents, and
// vector's == (and std::equal) on them calls memcmp, a visible share of a one-element op
// (bench_op_overhead); this is an inline loop.
#pragma once

#include <cstddef>

#include <xgrad/core/shape.hpp>

namespace xg::detail {

// a == b, extent by extent.
inline bool same_shape(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t d = 0; d < a.size(); ++d)
    if (a[d] != b[d]) return false;
  return true;
}

}  // namespace xg::detail
