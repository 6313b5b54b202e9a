// Shared test helpers: random float64 inputs and a gradcheck assertion that prints the
// checker's report (op, worst index, analytic vs numeric) when it fails.
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>

#include <xgrad/xgrad.hpp>

namespace xgt {

using namespace xg;

// Uniform on [lo, hi), float64.
Array rnd(const Shape& s, Generator& g, double lo = -1.0, double hi = 1.0);
// Uniform with |x| in [margin, 1]: keeps inputs off kinks at 0 (relu, abs).
Array rnd_away_from_zero(const Shape& s, Generator& g, double margin = 0.1);
// A random shape of rank `rank` with sizes in [1, max_size] (size-1 axes included).
Shape rnd_shape(std::size_t rank, Generator& g, std::size_t max_size = 4);

// Runs gradcheck and asserts it passes; returns the report for further checks.
GradcheckReport require_gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                                  const std::vector<std::string>& names = {},
                                  const GradcheckOptions& opts = {});

// A fresh, empty folder under the temporary directory, unique to this process.
std::filesystem::path temp_dir(const std::string& name);

// Writes `bytes` to the file `p` (replacing it) and requires the write to succeed.
void write_file(const std::filesystem::path& p, const std::string& bytes);

// Asserts two arrays have equal shapes and max |a - b| <= tol.
void require_close(const Array& a, const Array& b, double tol);

// The largest |a - b| / max(1, |b|) over the elements (shapes required equal).
double max_scaled_diff(const Array& a, const Array& b);

// The message of the error of type E that f throws; fails the test if f throws another
// error or none.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("threw another error: " << e.what());
  }
  FAIL("threw nothing");
  return "";
}

}  // namespace xgt
