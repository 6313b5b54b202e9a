#include <xgrad/core/random.hpp>

#include <cmath>
#include <sstream>

#include <xgrad/core/error.hpp>

namespace xg {

double Generator::uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

double Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double th = 2.0 * M_PI * u2;
  spare_ = r * std::sin(th);
  has_spare_ = true;
  return r * std::cos(th);
}

std::uint64_t Generator::below(std::uint64_t n) {
  if (n == 0) throw ValueError(op_message("generator", "below(0) has no valid result"));
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  std::uint64_t x = engine_();
  while (x >= limit) x = engine_();
  return x % n;
}

std::string Generator::state() const {
  std::ostringstream os;
  os.precision(17);
  os << engine_ << ' ' << has_spare_ << ' ' << spare_;
  return os.str();
}

void Generator::set_state(const std::string& s) {
  std::istringstream is(s);
  is >> engine_ >> has_spare_ >> spare_;
  if (!is) throw ValueError(op_message("generator", "malformed generator state"));
}

Array random_normal(const Shape& shape, Generator& gen, DType dtype, double mean, double stddev) {
  Array a = Array::empty(shape, dtype);
  for (std::size_t i = 0; i < a.size(); ++i) a.set_flat(i, mean + stddev * gen.normal());
  return a;
}

Array random_uniform(const Shape& shape, Generator& gen, DType dtype, double low, double high) {
  if (!(low < high))
    throw ValueError(op_message("random_uniform", "low (" + std::to_string(low) +
                                                      ") must be below high (" +
                                                      std::to_string(high) + ")"));
  Array a = Array::empty(shape, dtype);
  for (std::size_t i = 0; i < a.size(); ++i) a.set_flat(i, low + (high - low) * gen.uniform());
  return a;
}

}  // namespace xg
