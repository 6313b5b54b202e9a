// gradcheck: the tape's gradients against central finite differences in float64.
//
// Full mode compares the whole Jacobian: one backward pass per output element (seed e_i)
// against one pair of perturbed forward passes per input element. Projection mode, for
// large inputs, compares v^T J u per input for random u, v. The output cotangent is always
// random with a fixed seed, never all-ones: softmax's VJP of a ones vector is zero (5.24),
// so a check built on sum() would pass a VJP that returns zeros.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg {

struct GradcheckOptions {
  double eps = 1e-6;   // step h = eps * max(1, |x|): relative to the input's magnitude
  double atol = 1e-5;  // pass when |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-3;
  enum class Mode { automatic, full, projection } mode = Mode::automatic;
  std::size_t full_max_entries = 65536;  // automatic: full when inputs x outputs <= this
  int projections = 3;                   // projection mode: random (u, v) pairs
  std::uint64_t seed = 20240501;
  // float32 inputs are refused unless set; then pass looser atol/rtol (and usually eps).
  bool allow_float32 = false;
};

struct GradcheckReport {
  bool passed = true;
  std::string mode;           // "full" or "projection"
  std::size_t comparisons = 0;
  double max_abs_error = 0;   // over all comparisons
  double max_rel_error = 0;   // over comparisons with |numeric| > atol
  // The worst comparison (largest error relative to its tolerance):
  std::size_t input = 0;                  // which input
  std::string input_name;                 // its name ("input 0" if none given)
  std::vector<std::size_t> index;         // element of that input (empty in projection mode)
  std::vector<std::size_t> output_index;  // element of the output (empty in projection mode)
  double analytic = 0, numeric = 0, abs_error = 0, rel_error = 0;
  double atol = 0, rtol = 0;

  std::string summary() const;  // one paragraph: verdict and the worst element
};

// The comparison rule, shared by gradcheck and the suite's module checks: an (analytic,
// numeric) pair passes when |a - n| <= atol + rtol |n| (a non-finite value fails); the worst
// pair is the one furthest outside its tolerance, and the report keeps it.
class GradcheckComparer {
 public:
  GradcheckComparer(double atol, double rtol);
  void compare(double analytic, double numeric, std::size_t input, std::vector<std::size_t> index = {},
               std::vector<std::size_t> output_index = {});
  GradcheckReport& report() { return report_; }

 private:
  GradcheckReport report_;
  double worst_score_ = 0;
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

// f maps leaf tensors built from `inputs` (same order) to one output tensor.
GradcheckReport gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                          const GradcheckOptions& opts = {},
                          const std::vector<std::string>& names = {});

// Checks the gradient of f() with respect to leaf tensors that f reads, such as a module's
// named_parameters() (plus any input tensor you made a leaf that requires grad), without
// rebuilding the module: the analytic side is one backward pass with a random cotangent v
// (fixed seed, never all-ones); the numeric side replaces each leaf's value with
// Tensor::set_value and differentiates v . f() centrally. Full mode perturbs every element
// (chosen when elements x outputs <= opts.full_max_entries, as for gradcheck, and elements <=
// full_max_entries / 8); projection mode compares v^T J u for random directions u per leaf. Every leaf's value is restored, also
// when f throws. f must be deterministic (dropout off, or a generator re-seeded inside f).
GradcheckReport gradcheck_leaves(const std::function<Tensor()>& f,
                                 const std::vector<std::pair<std::string, Tensor>>& leaves,
                                 const GradcheckOptions& opts = {});

}  // namespace xg
