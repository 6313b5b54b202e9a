// The float32 vector math of core/detail/vmath.hpp: exp on libmvec's 16-lane AVX-512 kernel (where
// the build targets AVX-512) gives the same bits as its 8-lane AVX2 kernel, which the rest of the
// code used before, over a sweep of the whole float range, every tail length and the special
// values; and every lane count stays within libmvec's stated 4 ulp of double-precision exp.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <xgrad/core/detail/vmath.hpp>

using namespace xg;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Inputs: every 251st bit pattern (both signs, all exponents, NaNs included) plus the edges.
std::vector<float> sweep() {
  std::vector<float> x;
  for (std::uint64_t u = 0; u <= 0xffffffffu; u += 251) x.push_back(from_bits(static_cast<std::uint32_t>(u)));
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {0.0f, -0.0f, inf, -inf, 88.72f, 88.73f, -87.33f, -103.97f, -104.0f, 1e-30f, -1e-30f})
    x.push_back(v);
  return x;
}

}  // namespace

TEST_CASE("vmath exp gives the same bits on 16 and 8 lanes", "[vmath]") {
  const int lanes = vmath::exp_lane_count();
  INFO("exp() uses " << lanes << " lanes");
  if (lanes != 16) {
    SUCCEED("the build has no 16-lane kernel: nothing to compare");
    return;
  }
  const std::vector<float> x = sweep();
  std::vector<float> y16(x.size()), y8(x.size()), y(x.size());
  vmath::exp_lanes(x.data(), y16.data(), x.size(), 16);
  vmath::exp_lanes(x.data(), y8.data(), x.size(), 8);
  vmath::exp(x.data(), y.data(), x.size());
  std::size_t differ = 0, first = x.size();
  for (std::size_t i = 0; i < x.size(); ++i)
    if (bits(y16[i]) != bits(y8[i]) && !(std::isnan(y16[i]) && std::isnan(y8[i]))) {
      ++differ;
      if (first == x.size()) first = i;
    }
  INFO("first difference at x = " << (first < x.size() ? x[first] : 0.0f));
  CHECK(differ == 0);
  CHECK(std::memcmp(y.data(), y16.data(), y.size() * sizeof(float)) == 0);  // exp() is the 16-lane kernel
  // Every tail length (n below and past one vector) goes through the same kernel.
  for (std::size_t n = 1; n <= 40; ++n) {
    std::vector<float> a(n), b16(n), b8(n);
    for (std::size_t i = 0; i < n; ++i) a[i] = -10.0f + 0.37f * float(i);
    vmath::exp_lanes(a.data(), b16.data(), n, 16);
    vmath::exp_lanes(a.data(), b8.data(), n, 8);
    INFO("n = " << n);
    CHECK(std::memcmp(b16.data(), b8.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("vmath exp is within 4 ulp of double exp on every lane count", "[vmath]") {
  std::vector<float> x;
  for (float v = -87.0f; v < 88.7f; v += 0.0137f) x.push_back(v);
  for (int lanes : {16, 8, 1}) {
    std::vector<float> y(x.size());
    vmath::exp_lanes(x.data(), y.data(), x.size(), lanes);
    double worst = 0;
    float at = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double ref = std::exp(double(x[i]));
      const float r = static_cast<float>(ref);
      const double ulp = std::nextafter(r, std::numeric_limits<float>::infinity()) - r;
      const double e = std::fabs(double(y[i]) - ref) / (ulp > 0 ? ulp : std::numeric_limits<float>::denorm_min());
      if (e > worst) {
        worst = e;
        at = x[i];
      }
    }
    INFO("lanes " << lanes << ": worst " << worst << " ulp at x = " << at);
    CHECK(worst <= 4.0);
  }
  // Special values.
  const float inf = std::numeric_limits<float>::infinity();
  float s[4] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.0f}, o[4];
  vmath::exp(s, o, 4);
  CHECK(o[0] == inf);
  CHECK(o[1] == 0.0f);
  CHECK(std::isnan(o[2]));
  CHECK(o[3] == 1.0f);
}
