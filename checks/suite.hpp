// The gradient-check suite (docs/gradcheck.md): a registry of named checks and a runner that
// prints one table row per check, writes a JSON report and turns the verdict into an exit
// status. `xgrad gradcheck` runs the built-in set (checks/); your own program registers
// checks for its layers the same way and gets the same table.
//
// Two kinds of check. Gradient checks compare the tape with central differences:
// CheckContext::gradcheck (functions of fresh leaves, core/gradcheck.hpp) or
// CheckContext::gradcheck_leaves (leaves that already exist, such as module parameters).
// Property checks compute an invariant themselves and report an error measure against a
// tolerance (CheckResult::property). Every check runs in float64 or, with --dtype float32,
// in single precision with the tolerances of Tolerances::for_dtype.
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

namespace CLI {
class App;
}

namespace xg {

// Finite-difference step and pass criterion for one precision (derivation in
// docs/gradcheck.md). The central difference has truncation error ~h^2 f'''/6 and rounding
// error ~c u |f| / h (u = unit roundoff, c = how many roundings the forward accumulates);
// the sum is smallest near h = cbrt(u), where it is ~u^(2/3). The step is relative:
// h = eps * max(1, |x|).
//   float64: eps 1e-6  (cbrt(1.1e-16) = 4.8e-6), expected error ~1e-10, atol 1e-5, rtol 1e-3
//   float32: eps 5e-3  (cbrt(6.0e-8)  = 3.9e-3), expected error ~1e-4,  atol 1e-2, rtol 1e-2
struct Tolerances {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
  static Tolerances for_dtype(DType dtype);
};

// Unit roundoff: 2^-53 for float64, 2^-24 for float32.
double unit_roundoff(DType dtype);

// The result of one check, as printed in one table row.
struct CheckResult {
  bool passed = false;
  double max_abs_error = 0;
  double max_rel_error = -1;  // < 0: not applicable (printed "-", null in JSON)
  std::string worst;          // worst element, e.g. "x[1, 2]" or "K_bar[0, 1, 3, 0]"
  std::string message;        // details, printed under the table when the check fails
  std::string mode;           // "full", "projection" (gradient checks) or "property"
  std::size_t comparisons = 0;
  std::string config;         // when not empty, replaces the registered configuration text

  // A gradient check's verdict from a gradcheck report.
  static CheckResult from_report(const GradcheckReport& r);
  // A property check: passes when error <= tol (an exact property uses tol = 0; a NaN error
  // fails). `worst` names where the error is largest; `what` says what was measured.
  static CheckResult property(double error, double tol, const std::string& worst, const std::string& what,
                              double rel_error = -1);
  // Several sub-results (configurations of one check) folded into one: it passes when all
  // pass; the errors are the largest; worst and message come from the worst failing part
  // (or the one with the largest error when all pass).
  static CheckResult combine(const std::vector<CheckResult>& parts);
};

// What a running check gets: the precision, the seed, the sweep size, and a generator seeded
// from (seed, check name), so a check sees the same inputs whichever other checks run.
class CheckContext {
 public:
  CheckContext(DType dtype, std::uint64_t seed, bool full, const std::string& check_name);

  DType dtype() const { return dtype_; }
  std::uint64_t seed() const { return seed_; }
  bool full() const { return full_; }
  Generator& gen() { return gen_; }
  const Tolerances& tolerances() const { return tol_; }

  // Random inputs in the run's dtype.
  Array normal(const Shape& shape, double stddev = 1.0);
  Array uniform(const Shape& shape, double lo = -1.0, double hi = 1.0);
  // Uniform with |x| in [margin, hi], random signs: keeps inputs off kinks at 0.
  Array away_from_zero(const Shape& shape, double margin = 0.1, double hi = 1.0);
  // a converted to the run's dtype (constants that a checked function captures).
  Array cast(const Array& a) const;

  // Sizes and counts: `small` by default, `large` with --full.
  std::size_t pick(std::size_t small, std::size_t large) const { return full_ ? large : small; }
  // A property tolerance stated for each precision.
  double tol(double float64_tol, double float32_tol) const {
    return dtype_ == DType::float64 ? float64_tol : float32_tol;
  }

  // Options for xg::gradcheck in this run: step and tolerances of the dtype, a seed derived
  // from the run's, float32 allowed when the run is float32.
  GradcheckOptions options() const;

  // f on leaves made from `inputs` (converted to the run's dtype) against central
  // differences: full Jacobian when small, random projections otherwise.
  CheckResult gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                        const std::vector<std::string>& names = {});
  CheckResult gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs, const std::vector<std::string>& names,
                        const GradcheckOptions& opts);
  // f() reads existing leaves (module parameters, input tensors); see gradcheck_leaves below.
  CheckResult gradcheck_leaves(const std::function<Tensor()>& f,
                               const std::vector<std::pair<std::string, Tensor>>& leaves);
  CheckResult gradcheck_leaves(const std::function<Tensor()>& f,
                               const std::vector<std::pair<std::string, Tensor>>& leaves,
                               const GradcheckOptions& opts);

 private:
  DType dtype_;
  std::uint64_t seed_;
  bool full_;
  Generator gen_;
  Tolerances tol_;
};

using CheckFn = std::function<CheckResult(CheckContext&)>;

struct Check {
  std::string name;    // unique, '/'-separated group path: "ops/softmax", "my_layer/rmsnorm"
  std::string kind;    // "gradient", "reference", "invariant", or anything you choose
  std::string config;  // one-line configuration: shapes, masks, options
  CheckFn run;
};

class GradcheckSuite {
 public:
  // Any check: fn computes, judges and returns the row. Names must be unique (ValueError).
  GradcheckSuite& add(const std::string& name, const std::string& kind, const std::string& config, CheckFn fn);

  // A gradient check in one call: make_inputs(ctx) builds the inputs (any dtype; they are
  // converted to the run's), f maps leaves made from them to one output tensor.
  using InputsFn = std::function<std::vector<Array>(CheckContext&)>;
  GradcheckSuite& add_gradient_check(const std::string& name, const std::string& config, InputsFn make_inputs,
                                     GradcheckFn f, std::vector<std::string> input_names = {});

  const std::vector<Check>& checks() const { return checks_; }
  std::size_t size() const { return checks_.size(); }
  // Checks whose name matches the filter: comma-separated patterns, each a glob when it
  // holds * ? or [ (matched against the whole name), else a substring. Empty = all.
  std::vector<const Check*> select(const std::string& filter) const;

 private:
  std::vector<Check> checks_;
};

struct RunOptions {
  DType dtype = DType::float64;
  std::uint64_t seed = 20240501;
  bool full = false;      // larger sweeps
  std::string filter;     // see GradcheckSuite::select
  std::string json_path;  // also write the JSON report here (not empty)
  bool list = false;      // list the selected checks instead of running them
};

// One row of a run. Name, kind and configuration are copied, so a report outlives its suite.
struct CheckRecord {
  std::string name, kind;
  std::string config;  // the result's configuration text if it set one, else the registered one
  CheckResult result;
  double seconds = 0;
};

struct SuiteReport {
  RunOptions options;
  std::vector<CheckRecord> records;
  std::size_t passed = 0, failed = 0;
  double seconds = 0;
  bool all_passed() const { return failed == 0 && !records.empty(); }
};

// Runs the selected checks in registration order, printing the table to `out` as rows
// complete, then the details of each failure, then the last line "N passed, M failed".
// A check that throws fails with the exception's message.
SuiteReport run_suite(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out);
// The report as JSON text (same fields as the table, plus options and tolerances).
std::string report_json(const SuiteReport& report);
// Prints the selected checks (name, kind, configuration).
void list_checks(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out);

// Everything a command does: list or run, write --json, and return the exit status:
// 0 when every selected check passed, 1 when one failed. A filter that selects nothing or a
// --json path that cannot be opened throws UsageError before any check runs.
int run_gradcheck_command(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out);

// The flags --json, --list, --filter, --seed, --dtype, --full on a CLI11 app, writing into
// opts (which must outlive parsing). Shared by `xgrad gradcheck` and gradcheck_main.
void add_gradcheck_options(CLI::App& app, RunOptions& opts);

// main() for a program of your own checks: parses the flags above (plus any that `extra`
// adds), runs the suite and returns the exit status (2 for a bad flag, reported as one line
// "<program>: <message>" on stderr).
int gradcheck_main(const GradcheckSuite& suite, int argc, char** argv,
                   const std::function<void(CLI::App&)>& extra = {},
                   const std::string& description = "Gradient checks");

// A process-wide suite that XG_GRADCHECK registers into; gradcheck_main(argc, argv) runs it.
GradcheckSuite& default_gradcheck_suite();
int gradcheck_main(int argc, char** argv);

namespace detail {
bool register_default_check(const char* name, const char* config, CheckResult (*fn)(CheckContext&));
}

}  // namespace xg

// Registers a check in default_gradcheck_suite() at program start; the body gets
// `xg::CheckContext& ctx` and returns an xg::CheckResult:
//
//   XG_GRADCHECK("my_layer/rmsnorm", "x (4, 8), gain (8)") {
//     return ctx.gradcheck([](const std::vector<xg::Tensor>& in) { return rms_norm(in[0], in[1]); },
//                          {ctx.normal({4, 8}), ctx.uniform({8}, 0.5, 1.5)}, {"x", "gain"});
//   }
//
// Use it in a program's own source files: a linker drops unreferenced object files of a
// static library, and their registrations with them.
#define XG_GRADCHECK_CAT2(a, b) a##b
#define XG_GRADCHECK_CAT(a, b) XG_GRADCHECK_CAT2(a, b)
#define XG_GRADCHECK(name, config)                                                                          \
  static ::xg::CheckResult XG_GRADCHECK_CAT(xg_gradcheck_fn_, __LINE__)(::xg::CheckContext & ctx);         \
  [[maybe_unused]] static const bool XG_GRADCHECK_CAT(xg_gradcheck_registered_, __LINE__) =                \
      ::xg::detail::register_default_check(name, config, &XG_GRADCHECK_CAT(xg_gradcheck_fn_, __LINE__)); \
  static ::xg::CheckResult XG_GRADCHECK_CAT(xg_gradcheck_fn_, __LINE__)([[maybe_unused]] ::xg::CheckContext & ctx)
