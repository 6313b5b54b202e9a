// xgrad's own thread pool (core/parallel.hpp) as the runner of bench/peak.hpp's measurement,
// so the peak is measured on the same threads the xgrad programs compute on.
#pragma once

#include "bench/peak.hpp"
#include <xgrad/core/parallel.hpp>

namespace bench {

inline RunThreads xgrad_pool() {
  return [](std::size_t n, const std::function<void(std::size_t)>& job) { xg::detail::run_chunks(n, job); };
}

}  // namespace bench
