// The float32 vector math of core/detail/vmath.hpp: exp on libmvec's 16-lane AVX-512 kernel (where
// the build targets AVX-512) gives the same bits as its 8-lane AVX2 kernel, which the rest of the
// code used before, over a sweep of the whole float range, every tail length and the special
// values; and every lane count stays within libmvec's stated 4 ulp of double-precision exp. erf:
// each lane count within its bound of double-precision erf (xgrad's 16-lane kernel 1.1 ulp,
// libmvec's 8-lane one and libm's 2), its special values, and every element of a buffer through
// the same kernel wherever it sits.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
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

TEST_CASE("vmath erf is within its bound of double erf on every lane count", "[vmath]") {
  const std::vector<float> x = sweep();  // every 251st bit pattern and the edges
  INFO("erf() uses " << vmath::erf_lane_count() << " lanes");
  for (const int lanes : {16, 8, 1}) {
    // 16: xgrad's kernel (at most 1.08 ulp over all 2^32 inputs); 8: libmvec's (1.93); 1: libm.
    const double bound = lanes == 16 && vmath::erf_lane_count() == 16 ? 1.1 : 2.0;
    std::vector<float> y(x.size());
    vmath::erf_lanes(x.data(), y.data(), x.size(), lanes);
    double worst = 0;
    float at = 0;
    std::size_t nan_wrong = 0, sign_wrong = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {
        nan_wrong += !std::isnan(y[i]);
        continue;
      }
      sign_wrong += std::signbit(y[i]) != std::signbit(x[i]);
      const double ref = std::erf(double(x[i]));
      const float r = std::fabs(static_cast<float>(ref));
      const double ulp = std::nextafter(r, std::numeric_limits<float>::infinity()) - r;
      const double e = std::fabs(double(y[i]) - ref) / ulp;
      if (e > worst) {
        worst = e;
        at = x[i];
      }
    }
    INFO("lanes " << lanes << ": worst " << worst << " ulp at x = " << std::setprecision(9) << at);
    CHECK(worst <= bound);
    CHECK(nan_wrong == 0);
    CHECK(sign_wrong == 0);
  }
  const float inf = std::numeric_limits<float>::infinity();
  float s[6] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 1e-30f}, o[6];
  vmath::erf(s, o, 6);
  CHECK(o[0] == 1.0f);
  CHECK(o[1] == -1.0f);
  CHECK(std::isnan(o[2]));
  CHECK(bits(o[3]) == bits(0.0f));
  CHECK(bits(o[4]) == bits(-0.0f));
  CHECK(o[5] == Approx(1.1283791670955126e-30).epsilon(1e-7));
  // An element's bits do not depend on where it sits in the buffer (tails included).
  std::vector<float> a(45), whole(45);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = -4.2f + 0.19f * float(i);
  vmath::erf(a.data(), whole.data(), a.size());
  std::size_t moved = 0;
  for (std::size_t n = 1; n <= a.size(); ++n) {
    std::vector<float> part(n);
    vmath::erf(a.data() + (a.size() - n), part.data(), n);  // the last n elements alone
    for (std::size_t i = 0; i < n; ++i) moved += bits(part[i]) != bits(whole[a.size() - n + i]);
  }
  CHECK(moved == 0);
}
