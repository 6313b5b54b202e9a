// Held-out problems of the synthetic tasks (sort, reverse): a fixed set drawn once, and
// training draws that avoid it. Internal to train/tasks/.
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <xgrad/core/error.hpp>

namespace xg::train::heldout {

// Draws `count` distinct items. The space must hold at least twice as many (so that training
// keeps at least half of all problems and the loop ends quickly), and the loop is bounded.
template <class Draw>
std::vector<std::vector<std::int64_t>> distinct(const std::string& op, std::size_t count, double space,
                                                const std::string& what, Draw draw) {
  if (2.0 * static_cast<double>(count) > space)
    throw ValueError(op_message(op, what + " give only " + std::to_string(static_cast<long long>(space)) +
                                        " distinct problems; a held-out set of " + std::to_string(count) +
                                        " needs at least " + std::to_string(2 * count) +
                                        " (half of them stay for training)"));
  std::set<std::vector<std::int64_t>> seen;
  std::vector<std::vector<std::int64_t>> out;
  for (std::size_t tries = 0; out.size() < count; ++tries) {
    if (tries > 1000 * count + 1000)
      throw InternalError(op_message(op, "could not draw " + std::to_string(count) + " distinct held-out problems"));
    auto d = draw();
    if (seen.insert(d).second) out.push_back(d);
  }
  return out;
}

// Redraws while `excluded` holds the sample; bounded (the held-out set is at most half of all).
template <class Draw>
std::vector<std::int64_t> not_excluded(const std::string& op, const std::vector<std::vector<std::int64_t>>& excluded,
                                       Draw draw) {
  for (int tries = 0; tries < 100000; ++tries) {
    auto d = draw();
    if (!std::binary_search(excluded.begin(), excluded.end(), d)) return d;
  }
  throw InternalError(op_message(op, "100000 draws in a row were held-out problems"));
}

}  // namespace xg::train::heldout
