/// \file
/// The gradient-check suite (docs/gradcheck.md): a registry of named checks and a runner that
/// prints one table row per check, writes a JSON report and turns the verdict into an exit
/// status. `xgrad gradcheck` runs the built-in set (checks/); your own program registers
/// checks for its layers the same way and gets the same table.
///
/// Two kinds of check. Gradient checks compare the tape with central differences:
/// CheckContext::gradcheck (functions of fresh leaves, core/gradcheck.hpp) or
/// CheckContext::gradcheck_leaves (leaves that already exist, such as module parameters).
/// Property checks compute an invariant themselves and report an error measure against a
/// tolerance (CheckResult::property). Every check runs in float64 or, with `--dtype` float32,
/// in single precision with the tolerances of Tolerances::for_dtype. With `--order 2` gradient
/// checks check second derivatives (gradgradcheck and jvpcheck; gradgradcheck_leaves and
/// jvpcheck_leaves for leaves in place) and checks without a second-order form (property
/// checks) are skipped.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/gradcheck.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/core/tensor.hpp>


namespace xg {

/// Finite-difference step and pass criterion for one precision (derivation in
/// docs/gradcheck.md). The central difference has truncation error ~h^2 f'''/6 and rounding
/// error ~c u |f| / h (u = unit roundoff, c = how many roundings the forward accumulates);
/// the sum is smallest near h = cbrt(u), where it is ~u^(2/3). The step is relative:
/// h = eps * max(1, |x|).
/// \verbatim
///   float64: eps 1e-6  (cbrt(1.1e-16) = 4.8e-6), expected error ~1e-10, atol 1e-5, rtol 1e-3
///   float32: eps 5e-3  (cbrt(6.0e-8)  = 3.9e-3), expected error ~1e-4,  atol 1e-2, rtol 1e-2
/// \endverbatim
struct Tolerances {
  double eps = 1e-6;   ///< Relative finite-difference step: h = eps * max(1, |x|).
  double atol = 1e-5;  ///< Absolute tolerance: pass when |analytic - numeric| <= atol + rtol |numeric|.
  double rtol = 1e-3;  ///< Relative tolerance (see atol).
  /// The step and tolerances of `dtype` (the table above): float64 or float32.
  static Tolerances for_dtype(DType dtype);
  /// The step and tolerances of a run at derivative `order` (1 or 2) in `dtype`. Order 2
  /// differentiates first-order gradients numerically, whose own rounding is larger than the
  /// function's: float64 keeps the order-1 values, float32 loosens atol and rtol to 5e-2
  /// (docs/gradcheck.md).
  static Tolerances for_order(DType dtype, int order);
};

/// Unit roundoff: 2^-53 for float64, 2^-24 for float32.
double unit_roundoff(DType dtype);

/// The result of one check, as printed in one table row.
struct CheckResult {
  bool passed = false;        ///< The verdict: the row's status "passed" or "FAILED".
  double max_abs_error = 0;   ///< The largest absolute error (NaN when the check threw).
  double max_rel_error = -1;  ///< The largest relative error; < 0: not applicable (printed "-", null in JSON).
  std::string worst;          ///< Worst element, e.g. "x[1, 2]" or "K_bar[0, 1, 3, 0]".
  std::string message;        ///< Details, printed under the table when the check fails.
  std::string mode;           ///< "full", "projection" (gradient checks) or "property"; "error" when it threw.
  std::size_t comparisons = 0;  ///< How many values were compared (Jacobian entries, projections, properties).
  std::string config;         ///< When not empty, replaces the registered configuration text.
  bool skipped = false;       ///< The check has no form at the run's order: status "skipped", message says why.

  /// A gradient check's verdict from a gradcheck report: its errors, mode and comparison
  /// count, the worst element as "input[index]", and a message with the analytic and numeric
  /// values there.
  static CheckResult from_report(const GradcheckReport& r);
  /// A property check: passes when error <= tol (an exact property uses tol = 0; a NaN error
  /// fails). `worst` names where the error is largest; `what` says what was measured;
  /// `rel_error` is the relative error when there is one (< 0: none).
  static CheckResult property(double error, double tol, const std::string& worst, const std::string& what,
                              double rel_error = -1);
  /// Several sub-results (configurations of one check) folded into one: it passes when all
  /// pass; the errors are the largest; worst and message come from the worst failing part
  /// (or the one with the largest error when all pass). ValueError when `parts` is empty.
  /// Skipped parts are left out; when every part is skipped, the result is the first one.
  static CheckResult combine(const std::vector<CheckResult>& parts);
  /// A check (or part) that has no form at the run's order: skipped (not passed), mode
  /// "skipped", `reason` as its message.
  static CheckResult skip(const std::string& reason);
};

/// What a running check gets: the precision, the seed, the sweep size, and a generator seeded
/// from (seed, check name), so a check sees the same inputs whichever other checks run.
class CheckContext {
 public:
  /// The context of the check named `check_name` in a run in `dtype` with `seed`; `full`
  /// asks for the larger sweep (`--full`); `order` is the derivative order checked (1 or 2,
  /// `--order`; ValueError otherwise). run_suite makes one per check.
  CheckContext(DType dtype, std::uint64_t seed, bool full, const std::string& check_name, int order = 1);

  /// The run's precision: inputs and tolerances are in it.
  DType dtype() const { return dtype_; }
  /// The run's seed (`--seed`), the same for every check.
  std::uint64_t seed() const { return seed_; }
  /// Whether the run asked for the larger sweep (`--full`).
  bool full() const { return full_; }
  /// The derivative order the run checks (`--order`): 1 or 2.
  int order() const { return order_; }
  /// How many second-order comparisons (gradgradcheck, jvpcheck) this check has run: at order
  /// 2, a check that ran none is reported as skipped.
  std::size_t second_order_runs() const { return second_order_runs_; }
  /// This check's generator, seeded from (seed, check name); draws for inputs of its own.
  Generator& gen() { return gen_; }
  /// The step and tolerances of the run's dtype and order (Tolerances::for_order).
  const Tolerances& tolerances() const { return tol_; }

  /// Random inputs in the run's dtype: standard normal times `stddev`.
  Array normal(const Shape& shape, double stddev = 1.0);
  /// Random inputs in the run's dtype: uniform in [lo, hi).
  Array uniform(const Shape& shape, double lo = -1.0, double hi = 1.0);
  /// Uniform with |x| in [margin, hi], random signs: keeps inputs off kinks at 0.
  Array away_from_zero(const Shape& shape, double margin = 0.1, double hi = 1.0);
  /// a converted to the run's dtype (constants that a checked function captures).
  Array cast(const Array& a) const;

  /// Sizes and counts: `small` by default, `large` with `--full`.
  std::size_t pick(std::size_t small, std::size_t large) const { return full_ ? large : small; }
  /// A property tolerance stated for each precision: `float64_tol` or `float32_tol`.
  double tol(double float64_tol, double float32_tol) const {
    return dtype_ == DType::float64 ? float64_tol : float32_tol;
  }

  /// Options for xg::gradcheck in this run: step and tolerances of the dtype, a seed derived
  /// from the run's, float32 allowed when the run is float32.
  GradcheckOptions options() const;

  /// f on leaves made from `inputs` (converted to the run's dtype) against central
  /// differences: full Jacobian when small, random projections otherwise. `names` label the
  /// inputs in the worst element ("x[1, 2]"); options() are used. At order 2 it checks f's
  /// second derivatives instead: xg::gradgradcheck and xg::jvpcheck, one verdict (mode e.g.
  /// "full+jvp"; the worst element and message name which of the two it comes from).
  CheckResult gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                        const std::vector<std::string>& names = {});
  /// The same with explicit gradcheck options `opts` (e.g. a forced mode or looser tolerances;
  /// at order 2 in float32, no tighter than the order's tolerances).
  CheckResult gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs, const std::vector<std::string>& names,
                        const GradcheckOptions& opts);
  /// Second derivatives of f on leaves made from `inputs` (converted to the run's dtype):
  /// xg::gradgradcheck with options(), the gradient of the recorded VJP (create_graph)
  /// against central differences of plain first-order gradients (docs/higher-order.md).
  CheckResult gradgradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                            const std::vector<std::string>& names = {});
  /// f() reads existing leaves (module parameters, input tensors), given by name in
  /// `leaves`; each leaf's gradient is checked against central differences of f, with
  /// options() (xg::gradcheck_leaves). The leaves are not converted to the run's dtype, and f
  /// must be deterministic. At order 2 it checks f's second derivatives with respect to the
  /// leaves instead: xg::gradgradcheck_leaves and xg::jvpcheck_leaves, one verdict as for
  /// gradcheck() (mode e.g. "projection+jvp"), the leaves' values restored.
  CheckResult gradcheck_leaves(const std::function<Tensor()>& f,
                               const std::vector<std::pair<std::string, Tensor>>& leaves);
  /// The same with explicit gradcheck options `opts`.
  CheckResult gradcheck_leaves(const std::function<Tensor()>& f,
                               const std::vector<std::pair<std::string, Tensor>>& leaves,
                               const GradcheckOptions& opts);

 private:
  // opts with tolerances no tighter than the order's (order 2).
  GradcheckOptions second_order_options(const GradcheckOptions& opts) const;
  // gradgradcheck's and jvpcheck's reports as one verdict (mode "<gradgrad mode>+jvp").
  static CheckResult second_order_result(const GradcheckReport& gradgrad, const GradcheckReport& jvp);

  DType dtype_;
  std::uint64_t seed_;
  bool full_;
  int order_;
  std::size_t second_order_runs_ = 0;
  Generator gen_;
  Tolerances tol_;
};

/// A check's body: computes, judges and returns its table row. An exception it throws fails
/// the check with the exception's message.
using CheckFn = std::function<CheckResult(CheckContext&)>;

/// A registered check.
struct Check {
  std::string name;    ///< Unique, '/'-separated group path: "ops/softmax", "my_layer/rmsnorm".
  std::string kind;    ///< "gradient", "reference", "invariant", or anything you choose.
  std::string config;  ///< One-line configuration: shapes, masks, options.
  CheckFn run;         ///< The body, run with a fresh CheckContext and tape.
};

/// A registry of checks, in registration order, for run_suite and run_gradcheck_command.
class GradcheckSuite {
 public:
  /// Any check: fn computes, judges and returns the row. Names must be unique, not empty,
  /// and fn must be set (ValueError). Returns the suite, for chaining.
  GradcheckSuite& add(const std::string& name, const std::string& kind, const std::string& config, CheckFn fn);

  /// Builds a gradient check's inputs for a run (any dtype; they are converted to the run's).
  using InputsFn = std::function<std::vector<Array>(CheckContext&)>;
  /// A gradient check in one call (kind "gradient"): make_inputs(ctx) builds the inputs, f
  /// maps leaves made from them to one output tensor, `input_names` label them. ValueError if
  /// either function is empty or the name is taken.
  GradcheckSuite& add_gradient_check(const std::string& name, const std::string& config, InputsFn make_inputs,
                                     GradcheckFn f, std::vector<std::string> input_names = {});

  /// Every registered check, in registration order.
  const std::vector<Check>& checks() const { return checks_; }
  /// The number of registered checks.
  std::size_t size() const { return checks_.size(); }
  /// Checks whose name matches the filter: comma-separated patterns, each a glob when it
  /// holds * ? or [ (matched against the whole name), else a substring. Empty = all.
  std::vector<const Check*> select(const std::string& filter) const;

 private:
  std::vector<Check> checks_;
};

/// How to run a suite: the command-line flags of `xgrad gradcheck` (add_gradcheck_options).
struct RunOptions {
  DType dtype = DType::float64;  ///< Precision of every check (`--dtype`).
  std::uint64_t seed = 20240501;  ///< Seed of every check's inputs, cotangents and directions (`--seed`).
  bool full = false;      ///< Larger sweeps (`--full`).
  int order = 1;          ///< Derivative order checked (`--order`): 1 (gradcheck) or 2 (gradgradcheck and jvpcheck).
  std::string filter;     ///< Which checks run; see GradcheckSuite::select (`--filter`).
  std::string json_path;  ///< Also write the JSON report here when not empty (`--json`); "-": to stdout, in place of the table.
  bool list = false;      ///< List the selected checks instead of running them (`--list`).
};

/// One row of a run. Name, kind and configuration are copied, so a report outlives its suite.
struct CheckRecord {
  /// The check's registered name and kind. @{
  std::string name, kind;
  /// @}
  std::string config;  ///< The result's configuration text if it set one, else the registered one.
  CheckResult result;  ///< The check's verdict and errors.
  double seconds = 0;  ///< Wall time of the check.
};

/// Everything a run produced, row by row.
struct SuiteReport {
  RunOptions options;                ///< The options of the run.
  std::vector<CheckRecord> records;  ///< One per selected check, in registration order.
  /// How many checks passed, failed and were skipped (no form at the run's order). @{
  std::size_t passed = 0, failed = 0, skipped = 0;
  /// @}
  double seconds = 0;                ///< Wall time of the whole run.
  /// Whether at least one check passed and none failed (skipped checks neither pass nor fail).
  bool all_passed() const { return failed == 0 && passed > 0; }
};

/// Runs the selected checks in registration order, printing the table to `out` as rows
/// complete, then the details of each failure, then the last line "N passed, M failed" (with
/// ", K skipped" when a check was skipped). A check that throws fails with the exception's
/// message. At order 2 a check that ran no second-order comparison is skipped
/// (CheckContext::second_order_runs), with the reason in its message.
SuiteReport run_suite(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out);
/// The report as JSON text (same fields as the table, plus options and tolerances).
std::string report_json(const SuiteReport& report);
/// Prints the selected checks (name, kind, configuration) and their count to `out`.
void list_checks(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out);

/// Everything a command does: list or run, write `--json`, and return the exit status:
/// 0 when no selected check failed and at least one passed, 1 otherwise. An order other than
/// 1 or 2 throws UsageError. A filter that selects nothing or a
/// `--json` path that cannot be opened throws UsageError before any check runs.
int run_gradcheck_command(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out);

/// main() for a program of your own checks: parses the flags of `xgrad gradcheck` (`--json`,
/// `--list`, `--filter`, `--seed`, `--dtype`, `--full`, `--order`), runs the suite and returns the exit
/// status (2 for a bad flag, reported as one line "<program>: <message>" on stderr). To add
/// flags of your own, use the overload in <xgrad/checks/suite_cli.hpp> (CLI11).
int gradcheck_main(const GradcheckSuite& suite, int argc, char** argv);

/// A process-wide suite that XG_GRADCHECK registers into; gradcheck_main(argc, argv) runs it.
GradcheckSuite& default_gradcheck_suite();
/// main() for the checks registered with XG_GRADCHECK: gradcheck_main on
/// default_gradcheck_suite().
int gradcheck_main(int argc, char** argv);

namespace detail {
bool register_default_check(const char* name, const char* config, CheckResult (*fn)(CheckContext&));
bool register_default_check_of_kind(const char* name, const char* kind, const char* config,
                                    CheckResult (*fn)(CheckContext&));
}

}  // namespace xg

/// Pastes two tokens together (XG_GRADCHECK_CAT expands its arguments first).
#define XG_GRADCHECK_CAT2(a, b) a##b
/// Pastes two tokens together after expanding them: XG_GRADCHECK's names per source line.
#define XG_GRADCHECK_CAT(a, b) XG_GRADCHECK_CAT2(a, b)
/// Registers a check in default_gradcheck_suite() at program start, with kind "custom"; the
/// body gets `xg::CheckContext& ctx` and returns an xg::CheckResult:
///
/// \code
///   XG_GRADCHECK("my_layer/rmsnorm", "x (4, 8), gain (8)") {
///     return ctx.gradcheck([](const std::vector<xg::Tensor>& in) { return rms_norm(in[0], in[1]); },
///                          {ctx.normal({4, 8}), ctx.uniform({8}, 0.5, 1.5)}, {"x", "gain"});
///   }
/// \endcode
///
/// Use it in a program's own source files: a linker drops unreferenced object files of a
/// static library, and their registrations with them.
#define XG_GRADCHECK(name, config)                                                                          \
  static ::xg::CheckResult XG_GRADCHECK_CAT(xg_gradcheck_fn_, __LINE__)(::xg::CheckContext & ctx);         \
  [[maybe_unused]] static const bool XG_GRADCHECK_CAT(xg_gradcheck_registered_, __LINE__) =                \
      ::xg::detail::register_default_check(name, config, &XG_GRADCHECK_CAT(xg_gradcheck_fn_, __LINE__)); \
  static ::xg::CheckResult XG_GRADCHECK_CAT(xg_gradcheck_fn_, __LINE__)([[maybe_unused]] ::xg::CheckContext & ctx)

/// XG_GRADCHECK for second derivatives: registers a check of kind "second-order" in
/// default_gradcheck_suite(); the body gets `xg::CheckContext& ctx` and returns an
/// xg::CheckResult, usually ctx.gradgradcheck(...):
///
/// \code
///   XG_GRADGRADCHECK("my_layer/rmsnorm/second_order", "x (4, 8), gain (8)") {
///     return ctx.gradgradcheck([](const std::vector<xg::Tensor>& in) { return rms_norm(in[0], in[1]); },
///                              {ctx.normal({4, 8}), ctx.uniform({8}, 0.5, 1.5)}, {"x", "gain"});
///   }
/// \endcode
#define XG_GRADGRADCHECK(name, config)                                                                          \
  static ::xg::CheckResult XG_GRADCHECK_CAT(xg_gradgradcheck_fn_, __LINE__)(::xg::CheckContext & ctx);         \
  [[maybe_unused]] static const bool XG_GRADCHECK_CAT(xg_gradgradcheck_registered_, __LINE__) =                \
      ::xg::detail::register_default_check_of_kind(name, "second-order", config,                                \
                                                   &XG_GRADCHECK_CAT(xg_gradgradcheck_fn_, __LINE__));           \
  static ::xg::CheckResult XG_GRADCHECK_CAT(xg_gradgradcheck_fn_, __LINE__)([[maybe_unused]] ::xg::CheckContext & ctx)
