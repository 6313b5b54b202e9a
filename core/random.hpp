// Explicit, seeded random generator. Same seed, same numbers, on every run and platform
// (mt19937_64 is fully specified; uniform and normal are derived here, not by <random>'s
// implementation-defined distributions).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include <xgrad/core/array.hpp>

namespace xg {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0) : engine_(seed) {}

  std::uint64_t next_u64() { return engine_(); }
  double uniform();                    // [0, 1), 53 random bits
  double normal();                     // standard normal, Box-Muller
  std::uint64_t below(std::uint64_t n);  // uniform integer in [0, n), unbiased

  // Full state as text, for checkpoints and exact resume.
  std::string state() const;
  void set_state(const std::string& s);

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

Array random_normal(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
                    double mean = 0.0, double stddev = 1.0);
Array random_uniform(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
                     double low = 0.0, double high = 1.0);

}  // namespace xg
