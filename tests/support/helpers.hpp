// Shared test helpers: random float64 inputs and a gradcheck assertion that prints the
// checker's report (op, worst index, analytic vs numeric) when it fails.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

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

// A fresh, empty folder under the temporary directory, unique to this process; removed with
// everything in it when the test program exits (set XGRAD_KEEP_TEST_DIRS to keep it).
std::filesystem::path temp_dir(const std::string& name);

// B x T token ids drawn uniformly from [0, V).
IndexArray random_tokens(Generator& g, std::size_t B, std::size_t T, std::size_t V);

// Every parameter of `m` re-drawn uniformly from [lo, hi), so that biases and gains are not
// zero or one.
void randomise_parameters(nn::Module& m, Generator& g, double lo = -0.5, double hi = 0.5);
/// A tiny decoder-only model (float64): vocabulary 11, context 8, d_model 8, 2 heads, `layers`
/// blocks, d_ff 12; for Llama also RoPE positions and multiple_of 4.
nn::TransformerConfig tiny_model(nn::Architecture arch, std::size_t layers = 2);

// Writes `bytes` to the file `p` (replacing it) and requires the write to succeed.
void write_file(const std::filesystem::path& p, const std::string& bytes);

// The bytes of the file `p`; fails the test (naming the file) if it cannot be opened.
std::string read_file(const std::filesystem::path& p);

// Asserts two arrays have equal shapes and max |a - b| <= tol.
void require_close(const Array& a, const Array& b, double tol);

// The largest |a - b| / max(1, |b|) over the elements (shapes required equal).
double max_scaled_diff(const Array& a, const Array& b);

// A number in full precision for failure messages ("1.192e-07", where Catch's fixed notation
// prints "0.0").
std::string sci(double v);

// The largest |x| over the elements (0 for an empty array).
double max_abs(const Array& a);

// How many elements of a and b differ in their bytes (NaN payloads and the sign of zero count);
// a and b must have the same shape and dtype (REQUIREd).
std::size_t differing_bits(const Array& a, const Array& b);
// Whether a and b have the same shape, dtype and bytes.
bool same_bits(const Array& a, const Array& b);

// The rounding bound of a sum of `length` products in `dtype` whose terms are at most `scale` in
// magnitude: `ulps` units of the dtype's epsilon per term (the textbook bound of a recursive or
// blocked sum is length * eps * sum|terms|; two orders of the same sum differ by at most twice
// that). Used where two computations of the same value may add in another order (another BLAS
// kernel, another batch shape): the failure message prints both the difference and this bound.
double rounding_bound(std::size_t length, DType dtype, double scale, double ulps = 4.0);

}  // namespace xgt

// Asserts that a and b have the same shape, dtype and bytes, element by element (so -0 differs
// from +0, and NaN payloads count): only where the code guarantees the bits (the same shapes,
// strides and thread partition, a deterministic rewrite of the same arithmetic); say why beside
// the call. On failure prints how many elements differ and the largest difference in full
// precision.
#define XGT_CHECK_SAME(a, b)                                                                        \
  do {                                                                                              \
    const ::xg::Array xgt_a_ = (a);                                                                 \
    const ::xg::Array xgt_b_ = (b);                                                                 \
    REQUIRE(xgt_a_.shape() == xgt_b_.shape());                                                      \
    REQUIRE(xgt_a_.dtype() == xgt_b_.dtype());                                                      \
    const std::size_t xgt_n_ = ::xgt::differing_bits(xgt_a_, xgt_b_);                               \
    const double xgt_d_ = xgt_n_ ? ::xg::max_abs_diff(xgt_a_, xgt_b_) : 0.0;                        \
    INFO(xgt_n_ << " of " << xgt_a_.size() << " elements differ in their bits; max |difference| = " \
                << ::xgt::sci(xgt_d_) << " (the same bits are required)");                          \
    CHECK(xgt_n_ == 0);                                                                             \
  } while (false)

// Asserts max |a - b| <= bound (shapes equal), printing both in full precision.
#define XGT_CHECK_WITHIN(a, b, bound)                                                            \
  do {                                                                                           \
    const ::xg::Array xgt_a_ = (a);                                                              \
    const ::xg::Array xgt_b_ = (b);                                                              \
    REQUIRE(xgt_a_.shape() == xgt_b_.shape());                                                   \
    const double xgt_d_ = ::xg::max_abs_diff(xgt_a_, xgt_b_);                                    \
    const double xgt_bound_ = (bound);                                                           \
    INFO("max |difference| = " << ::xgt::sci(xgt_d_) << ", bound " << ::xgt::sci(xgt_bound_));   \
    CHECK(xgt_d_ <= xgt_bound_);                                                                 \
  } while (false)

namespace xgt {

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

// Sets (or, with nullopt, unsets) an environment variable for its lifetime, then restores it.
class EnvScope {
 public:
  EnvScope(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value->c_str(), 1);
    else
      unsetenv(name);
  }
  ~EnvScope() {
    if (old_)
      setenv(name_, old_->c_str(), 1);
    else
      unsetenv(name_);
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// The pool's thread count for a scope: the count found at construction comes back when the scope
// ends, also when a failed REQUIRE throws out of it (a later test case of the same program must
// not run on a count some earlier case left behind).
class ThreadCount {
 public:
  ThreadCount() : saved_(num_threads()) {}
  explicit ThreadCount(int n) : ThreadCount() { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

}  // namespace xgt
