/// \file
/// Explicit, seeded random generator. Same seed, same numbers, on every run and platform
/// (mt19937_64 is fully specified; uniform and normal are derived here, not by `<random>`'s
/// implementation-defined distributions).
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include <xgrad/core/array.hpp>

namespace xg {

/// A seeded random generator (mt19937_64 with the distributions written out), passed
/// explicitly to everything random: initialisers, dropout, data.
class Generator {
 public:
  /// A generator seeded with `seed`.
  explicit Generator(std::uint64_t seed = 0) : engine_(seed) {}

  /// The next raw 64-bit number of the engine.
  std::uint64_t next_u64() { return engine_(); }
  /// A uniform number in [0, 1) from 53 random bits.
  double uniform();
  /// A standard normal number (Box-Muller; the second number of each pair is kept for the next
  /// call).
  double normal();
  /// A uniform integer in [0, n), unbiased (rejection sampling); ValueError for n == 0.
  std::uint64_t below(std::uint64_t n);

  /// Full state as text, for checkpoints and exact resume.
  std::string state() const;
  /// Restores a state `s` returned by state(); ValueError if it is malformed.
  void set_state(const std::string& s);

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

/// An array of `shape` and `dtype` with elements drawn from a normal distribution with mean
/// `mean` and standard deviation `stddev`, from `gen`.
Array random_normal(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
                    double mean = 0.0, double stddev = 1.0);
/// An array of `shape` and `dtype` with elements drawn uniformly from [low, high), from
/// `gen`; ValueError unless low < high.
Array random_uniform(const Shape& shape, Generator& gen, DType dtype = default_dtype(),
                     double low = 0.0, double high = 1.0);

}  // namespace xg
