/// \file
/// gradcheck: the tape's gradients against central finite differences in float64.
///
/// Full mode compares the whole Jacobian: one backward pass per output element (seed e_i)
/// against one pair of perturbed forward passes per input element. Projection mode, for
/// large inputs, compares v^T J u per input for random u, v. The output cotangent is always
/// random with a fixed seed, never all-ones: softmax's VJP of a ones vector is zero (5.24),
/// so a check built on sum() would pass a VJP that returns zeros.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg {

/// Settings of gradcheck() and gradcheck_leaves(). The defaults suit float64.
struct GradcheckOptions {
  double eps = 1e-6;   ///< Step h = eps * max(1, |x|): relative to the input's magnitude.
  double atol = 1e-5;  ///< Pass when |analytic - numeric| <= atol + rtol * |numeric|.
  double rtol = 1e-3;  ///< Relative part of the pass rule (see atol).
  /// Which comparison runs: automatic (full when small enough, see full_max_entries), full
  /// (the whole Jacobian) or projection (v^T J u for random directions). `mode` is the
  /// choice. @{
  enum class Mode { automatic, full, projection } mode = Mode::automatic;
  /// @}
  /// \var Mode::automatic
  /// Full when inputs x outputs <= full_max_entries, else projection.
  /// \var Mode::full
  /// The whole Jacobian: one backward pass per output element, two forward passes per input
  /// element.
  /// \var Mode::projection
  /// v^T J u per input for `projections` random pairs (u, v).
  std::size_t full_max_entries = 65536;  ///< automatic: full when inputs x outputs <= this.
  int projections = 3;                   ///< Projection mode: number of random (u, v) pairs.
  std::uint64_t seed = 20240501;         ///< Seed of the random cotangents and directions.
  /// float32 inputs are refused unless set; then pass looser atol/rtol (and usually eps).
  bool allow_float32 = false;
};

/// What a gradient check found: the verdict, error statistics and the worst comparison.
struct GradcheckReport {
  bool passed = true;         ///< Whether every comparison was within its tolerance.
  std::string mode;           ///< "full" or "projection".
  std::size_t comparisons = 0;  ///< Number of (analytic, numeric) pairs compared.
  double max_abs_error = 0;   ///< Largest |analytic - numeric| over all comparisons.
  double max_rel_error = 0;   ///< Largest relative error over comparisons with |numeric| > atol.
  /// The worst comparison (largest error relative to its tolerance): which input.
  std::size_t input = 0;
  std::string input_name;                 ///< Its name ("input 0" if none given).
  std::vector<std::size_t> index;         ///< Element of that input (empty in projection mode).
  std::vector<std::size_t> output_index;  ///< Element of the output (empty in projection mode).
  /// The worst comparison's analytic (tape) and numeric (central difference) values, its
  /// absolute error and its relative error |a - n| / |n|. @{
  double analytic = 0, numeric = 0, abs_error = 0, rel_error = 0;
  /// @}
  /// The tolerances the check used. @{
  double atol = 0, rtol = 0;
  /// @}

  /// One paragraph: verdict and the worst element.
  std::string summary() const;
};

/// The comparison rule, shared by gradcheck and the suite's module checks: an (analytic,
/// numeric) pair passes when |a - n| <= atol + rtol |n| (a non-finite value fails); the worst
/// pair is the one furthest outside its tolerance, and the report keeps it.
class GradcheckComparer {
 public:
  /// A comparer with tolerances `atol` and `rtol`, and an empty report.
  GradcheckComparer(double atol, double rtol);
  /// Compares the tape's value `analytic` with the finite difference `numeric` for input
  /// number `input` at its element `index` and the output element `output_index` (both may
  /// be empty, as in projection mode); updates the report.
  void compare(double analytic, double numeric, std::size_t input, std::vector<std::size_t> index = {},
               std::vector<std::size_t> output_index = {});
  /// The report so far (mode and input_name are the caller's to fill).
  GradcheckReport& report() { return report_; }

 private:
  GradcheckReport report_;
  double worst_score_ = 0;
};

/// The function gradcheck() differentiates: leaf tensors in, one output tensor out.
using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Checks the gradient of `f` against central differences: f maps leaf tensors built from
/// `inputs` (same order) to one output tensor. `opts` sets step, tolerances and mode;
/// `names` names the inputs in the report (default "input 0", ...). float64 inputs unless
/// opts.allow_float32 (DTypeError otherwise).
GradcheckReport gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                          const GradcheckOptions& opts = {},
                          const std::vector<std::string>& names = {});

/// Checks the gradient of f() with respect to leaf tensors that f reads, such as a module's
/// named_parameters() (plus any input tensor you made a leaf that requires grad), without
/// rebuilding the module: the analytic side is one backward pass with a random cotangent v
/// (fixed seed, never all-ones); the numeric side replaces each leaf's value with
/// Tensor::set_value and differentiates v . f() centrally. Full mode perturbs every element
/// (chosen when elements x outputs <= opts.full_max_entries, as for gradcheck, and elements <=
/// full_max_entries / 8); projection mode compares v^T J u for random directions u per leaf.
/// Every leaf's value is restored, also when f throws. f must be deterministic (dropout off, or a generator re-seeded inside f).
/// `leaves` are the (name, tensor) pairs checked; `opts` as for gradcheck().
GradcheckReport gradcheck_leaves(const std::function<Tensor()>& f,
                                 const std::vector<std::pair<std::string, Tensor>>& leaves,
                                 const GradcheckOptions& opts = {});

/// Checks second derivatives (PyTorch's gradgradcheck): the gradient of the map
///   G(x_1 .. x_n, v) = (d(v . f)/dx_1, ..., d(v . f)/dx_n),
/// recorded by a backward pass with create_graph (the ops' second-order rules), against
/// central differences of G computed with plain first-order backward passes. v, the output
/// cotangent, is random (opts.seed, never all-ones) and is checked as an input too ("grad_output":
/// dG/dv is the recorded VJP itself, so a second-order rule whose values are wrong fails
/// there). Same options, report and float64 rule as gradcheck(); `names` name the inputs.
/// An op without a second-order rule is a TapeError naming it.
GradcheckReport gradgradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                              const GradcheckOptions& opts = {},
                              const std::vector<std::string>& names = {});

/// gradgradcheck() for leaves that f() reads in place (a module's parameters, input tensors
/// made leaves), as gradcheck_leaves() is to gradcheck(): the gradient of the map
///   G(leaves, v) = (d(v . f)/dleaf_1, ..., d(v . f)/dleaf_n),
/// recorded by a backward pass with create_graph (the ops' second-order rules), against central
/// differences of G computed with plain first-order backward passes while each leaf's value is
/// moved with Tensor::set_value. v, f's output cotangent, is random (opts.seed, never
/// all-ones) and is checked as an input too ("grad_output"). Cost: with N leaf elements and
/// |v| output elements, G has N outputs and N + |v| inputs; full mode (when (N + |v|) N <=
/// opts.full_max_entries and N + |v| <= full_max_entries / 8, or forced) records G once, runs N
/// reverse passes over it and 2 (N + |v|) first-order passes; projection mode runs
/// opts.projections rounds, each one create_graph pass, one reverse pass over it and 2 (n + 1)
/// first-order passes for n leaves (a random direction per leaf and for v; projections < 1 is
/// a ValueError). Every leaf's value is restored bit for bit, also when f throws; f must be
/// deterministic. Leaves must be leaves,
/// float64 unless opts.allow_float32 (as gradcheck_leaves). An op without a second-order rule
/// is a TapeError naming it.
GradcheckReport gradgradcheck_leaves(const std::function<Tensor()>& f,
                                     const std::vector<std::pair<std::string, Tensor>>& leaves,
                                     const GradcheckOptions& opts = {});

/// jvpcheck() for leaves that f() reads in place: for opts.projections random tangents u (one
/// per leaf, opts.seed), J u with respect to the leaves (forward mode by linearising the
/// reverse mode, as jvp() does, so it runs on the ops' second-order rules) against the central
/// difference (f(x + h u) - f(x - h u)) / 2h with every leaf moved in place together (h = eps *
/// max(1, max |leaf|)), and the transpose identity <v, J u> = <J^T v, u> with J^T v from a
/// plain first-order pass. Each round: one create_graph pass, two reverse passes, two
/// evaluations of f. Mode "jvp"; the worst comparison is named "J u" or "<v, J u>". Leaves
/// restored and options as gradgradcheck_leaves() (projections < 1 is a ValueError).
GradcheckReport jvpcheck_leaves(const std::function<Tensor()>& f,
                                const std::vector<std::pair<std::string, Tensor>>& leaves,
                                const GradcheckOptions& opts = {});

/// Checks forward mode (jvp(), core/higher_order.hpp) two ways, for `opts.projections` random
/// tangents u (opts.seed): J u from jvp() against the central difference
/// (f(x + h u) - f(x - h u)) / 2h element by element (h = eps * max(1, max |x|)), and the
/// transpose identity <v, J u> = <J^T v, u> with a random cotangent v and J^T v from a plain
/// first-order backward pass. Mode "jvp"; the worst comparison is named "J u" (with the output
/// element) or "<v, J u>". jvp() runs on the ops' second-order rules, so a rule with wrong
/// values fails here too. Options, report and float64 rule as gradcheck().
GradcheckReport jvpcheck(const GradcheckFn& f, const std::vector<Array>& inputs, const GradcheckOptions& opts = {},
                         const std::vector<std::string>& names = {});

}  // namespace xg
