// The gradient-check suite: registry, runner, table, JSON report and command-line flags
// (docs/gradcheck.md). gradcheck_leaves and its second-order forms (gradgradcheck_leaves,
// jvpcheck_leaves) are core/gradcheck.cpp.
#include <xgrad/checks/suite.hpp>

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>

namespace xg {

namespace {

std::string sci(double x, int digits = 2) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*e", digits, x);
  return buf;
}

std::string num(double x) {
  std::ostringstream os;
  os.precision(6);
  os << x;
  return os.str();
}

// FNV-1a of the check name mixed with the run's seed (splitmix64 finaliser): a check's
// inputs depend on its name and the seed only, never on which other checks run.
std::uint64_t derive_seed(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  std::uint64_t z = h ^ (seed + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}


}  // namespace

// ---------------------------------------------------------------------------------------
// Tolerances and results

Tolerances Tolerances::for_dtype(DType dtype) {
  Tolerances t;
  if (dtype == DType::float32) {
    t.eps = 5e-3;
    t.atol = 1e-2;
    t.rtol = 1e-2;
  }
  return t;
}

Tolerances Tolerances::for_order(DType dtype, int order) {
  Tolerances t = for_dtype(dtype);
  if (order == 2 && dtype == DType::float32) {
    t.atol = 5e-2;
    t.rtol = 5e-2;
  }
  return t;
}

double unit_roundoff(DType dtype) { return dtype == DType::float32 ? std::ldexp(1.0, -24) : std::ldexp(1.0, -53); }

CheckResult CheckResult::from_report(const GradcheckReport& r) {
  CheckResult c;
  c.passed = r.passed;
  c.max_abs_error = r.max_abs_error;
  c.max_rel_error = r.max_rel_error;
  c.mode = r.mode;
  c.comparisons = r.comparisons;
  c.worst = r.input_name;
  if (!r.index.empty()) c.worst += "[" + index_list(r.index) + "]";
  if (r.mode == "projection") c.worst += " (proj)";
  std::ostringstream os;
  os << "worst element: " << r.input_name;
  if (!r.index.empty()) os << " index (" << index_list(r.index) << ")";
  if (!r.output_index.empty()) os << ", output (" << index_list(r.output_index) << ")";
  if (r.mode == "projection") os << " (random projection v^T J u)";
  os << ": analytic " << num(r.analytic) << ", numeric " << num(r.numeric) << ", abs error " << sci(r.abs_error)
     << (r.passed ? " within " : " exceeds ") << sci(r.atol) << " + " << sci(r.rtol) << " |numeric|; " << r.mode
     << " mode, " << r.comparisons << " comparisons";
  c.message = os.str();
  return c;
}

CheckResult CheckResult::property(double error, double tol, const std::string& worst, const std::string& what,
                                  double rel_error) {
  CheckResult c;
  c.mode = "property";
  c.comparisons = 1;
  c.max_abs_error = error;
  c.max_rel_error = rel_error;
  c.passed = !std::isnan(error) && error <= tol;
  c.worst = worst;
  c.message = what + ": error " + sci(error) + (c.passed ? " <= " : " > ") + "tolerance " + sci(tol) +
              (worst.empty() ? "" : ", worst at " + worst);
  return c;
}

CheckResult CheckResult::skip(const std::string& reason) {
  CheckResult c;
  c.skipped = true;
  c.mode = "skipped";
  c.worst = "-";
  c.message = reason;
  return c;
}

CheckResult CheckResult::combine(const std::vector<CheckResult>& all_parts) {
  if (all_parts.empty()) throw ValueError(op_message("gradcheck", "CheckResult::combine needs at least one part"));
  std::vector<CheckResult> parts;
  for (const CheckResult& p : all_parts)
    if (!p.skipped) parts.push_back(p);
  if (parts.empty()) return all_parts.front();
  CheckResult c;
  c.passed = true;
  c.mode = parts.front().mode;
  const CheckResult* worst = nullptr;
  for (const CheckResult& p : parts) {
    c.passed = c.passed && p.passed;
    c.comparisons += p.comparisons;
    if (std::isnan(p.max_abs_error) || p.max_abs_error > c.max_abs_error) c.max_abs_error = p.max_abs_error;
    if (p.max_rel_error >= 0) c.max_rel_error = std::max(c.max_rel_error, p.max_rel_error);
    if (p.mode != c.mode) c.mode = "mixed";
  }
  for (const CheckResult& p : parts)  // the first failing part, else the largest error
    if (!p.passed) {
      worst = &p;
      break;
    }
  if (!worst)
    for (const CheckResult& p : parts)
      if (!worst || p.max_abs_error > worst->max_abs_error) worst = &p;
  c.worst = worst->worst;
  c.message = worst->message;
  return c;
}

// ---------------------------------------------------------------------------------------
// Context

CheckContext::CheckContext(DType dtype, std::uint64_t seed, bool full, const std::string& check_name, int order)
    : dtype_(dtype),
      seed_(seed),
      full_(full),
      order_(order),
      gen_(derive_seed(seed, check_name)),
      tol_(Tolerances::for_order(dtype, order)) {
  if (order != 1 && order != 2)
    throw ValueError(op_message("gradcheck", "order must be 1 or 2, got " + std::to_string(order)));
}

Array CheckContext::normal(const Shape& shape, double stddev) {
  return random_normal(shape, gen_, DType::float64, 0.0, stddev).astype(dtype_);
}

Array CheckContext::uniform(const Shape& shape, double lo, double hi) {
  return random_uniform(shape, gen_, DType::float64, lo, hi).astype(dtype_);
}

Array CheckContext::away_from_zero(const Shape& shape, double margin, double hi) {
  Array a = Array::empty(shape, DType::float64);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double m = margin + (hi - margin) * gen_.uniform();
    a.set_flat(i, gen_.uniform() < 0.5 ? -m : m);
  }
  return a.astype(dtype_);
}

Array CheckContext::cast(const Array& a) const { return a.dtype() == dtype_ ? a : a.astype(dtype_); }

GradcheckOptions CheckContext::options() const {
  GradcheckOptions o;
  o.eps = tol_.eps;
  o.atol = tol_.atol;
  o.rtol = tol_.rtol;
  o.allow_float32 = dtype_ == DType::float32;
  o.seed = derive_seed(seed_, "cotangent");
  return o;
}

CheckResult CheckContext::gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                                    const std::vector<std::string>& names) {
  return gradcheck(f, inputs, names, options());
}

CheckResult CheckContext::gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                                    const std::vector<std::string>& names, const GradcheckOptions& opts) {
  std::vector<Array> xs;
  xs.reserve(inputs.size());
  for (const Array& x : inputs) xs.push_back(cast(x));
  if (order_ == 1) return CheckResult::from_report(xg::gradcheck(f, xs, opts, names));
  const GradcheckOptions o = second_order_options(opts);
  ++second_order_runs_;
  return second_order_result(xg::gradgradcheck(f, xs, o, names), xg::jvpcheck(f, xs, o, names));
}

GradcheckOptions CheckContext::second_order_options(const GradcheckOptions& opts) const {
  GradcheckOptions o = opts;  // a check's own tolerances, no tighter than the order's
  o.eps = std::max(o.eps, tol_.eps);
  o.atol = std::max(o.atol, tol_.atol);
  o.rtol = std::max(o.rtol, tol_.rtol);
  return o;
}

CheckResult CheckContext::second_order_result(const GradcheckReport& gradgrad, const GradcheckReport& jvp) {
  CheckResult gg = CheckResult::from_report(gradgrad);
  CheckResult jv = CheckResult::from_report(jvp);
  const std::string mode = gg.mode + "+jvp";
  gg.message = "gradgradcheck: " + gg.message;
  jv.worst = "jvp: " + jv.worst;
  jv.message = "jvpcheck: " + jv.message;
  CheckResult c = CheckResult::combine({gg, jv});
  c.mode = mode;
  return c;
}

CheckResult CheckContext::gradgradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                                        const std::vector<std::string>& names) {
  std::vector<Array> xs;
  xs.reserve(inputs.size());
  for (const Array& x : inputs) xs.push_back(cast(x));
  ++second_order_runs_;
  return CheckResult::from_report(xg::gradgradcheck(f, xs, options(), names));
}

CheckResult CheckContext::gradcheck_leaves(const std::function<Tensor()>& f,
                                           const std::vector<std::pair<std::string, Tensor>>& leaves) {
  return gradcheck_leaves(f, leaves, options());
}

CheckResult CheckContext::gradcheck_leaves(const std::function<Tensor()>& f,
                                           const std::vector<std::pair<std::string, Tensor>>& leaves,
                                           const GradcheckOptions& opts) {
  if (order_ == 1) return CheckResult::from_report(xg::gradcheck_leaves(f, leaves, opts));
  const GradcheckOptions o = second_order_options(opts);
  ++second_order_runs_;
  return second_order_result(xg::gradgradcheck_leaves(f, leaves, o), xg::jvpcheck_leaves(f, leaves, o));
}

// ---------------------------------------------------------------------------------------
// Registry

GradcheckSuite& GradcheckSuite::add(const std::string& name, const std::string& kind, const std::string& config,
                                    CheckFn fn) {
  if (name.empty()) throw ValueError(op_message("gradcheck", "a check needs a name"));
  if (!fn) throw ValueError(op_message("gradcheck", "check '" + name + "' has no function"));
  for (const Check& c : checks_)
    if (c.name == name) throw ValueError(op_message("gradcheck", "a check named '" + name + "' is already registered"));
  checks_.push_back(Check{name, kind, config, std::move(fn)});
  return *this;
}

GradcheckSuite& GradcheckSuite::add_gradient_check(const std::string& name, const std::string& config,
                                                   InputsFn make_inputs, GradcheckFn f,
                                                   std::vector<std::string> input_names) {
  if (!make_inputs || !f) throw ValueError(op_message("gradcheck", "check '" + name + "' needs inputs and a function"));
  return add(name, "gradient", config,
             [make_inputs = std::move(make_inputs), f = std::move(f),
              names = std::move(input_names)](CheckContext& ctx) { return ctx.gradcheck(f, make_inputs(ctx), names); });
}

std::vector<const Check*> GradcheckSuite::select(const std::string& filter) const {
  std::vector<std::string> patterns;
  std::stringstream ss(filter);
  for (std::string p; std::getline(ss, p, ',');) {
    const auto b = p.find_first_not_of(' '), e = p.find_last_not_of(' ');
    if (b != std::string::npos) patterns.push_back(p.substr(b, e - b + 1));
  }
  std::vector<const Check*> out;
  for (const Check& c : checks_) {
    bool match = patterns.empty();
    for (const std::string& p : patterns) {
      if (p.find_first_of("*?[") != std::string::npos)
        match = match || fnmatch(p.c_str(), c.name.c_str(), 0) == 0;
      else
        match = match || c.name.find(p) != std::string::npos;
    }
    if (match) out.push_back(&c);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Runner and table

namespace {

// Column widths. Configurations longer than kMaxConfig are cut in the table (the failure
// details, --list and the JSON report carry them whole).
constexpr std::size_t kMaxConfig = 64;
struct Columns {
  std::size_t name = 5, config = 13, worst = 26;
  std::size_t status = 6;  // "passed", "FAILED"; 7 at --order 2, where "skipped" occurs
};

std::string cut(const std::string& s, std::size_t w) { return s.size() <= w ? s : s.substr(0, w - 3) + "..."; }

std::string fit(const std::string& s, std::size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }
std::string rfit(const std::string& s, std::size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }

std::string time_str(double seconds) {
  char buf[32];
  if (seconds < 0.01)
    std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1e3);
  else if (seconds < 1.0)
    std::snprintf(buf, sizeof buf, "%.0f ms", seconds * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", seconds);
  return buf;
}

void print_header(std::ostream& out, const Columns& w) {
  out << fit("check", w.name) << "  " << fit("dtype", 7) << "  " << fit("configuration", w.config) << "  "
      << rfit("max abs err", 11) << "  " << rfit("max rel err", 11) << "  " << fit("worst element", w.worst) << "  "
      << fit("status", w.status) << "  " << rfit("time", 8) << "\n";
  out << std::string(w.name + w.config + w.worst + 7 + 11 + 11 + w.status + 8 + 7 * 2, '-') << "\n";
}

void print_row(std::ostream& out, const Columns& w, const CheckRecord& r, DType dtype) {
  const CheckResult& c = r.result;
  out << fit(r.name, w.name) << "  " << fit(dtype_name(dtype), 7) << "  " << fit(cut(r.config, w.config), w.config) << "  "
      << rfit(sci(c.max_abs_error), 11) << "  " << rfit(c.max_rel_error < 0 ? "-" : sci(c.max_rel_error), 11) << "  "
      << fit(c.worst.empty() ? "-" : c.worst, w.worst) << "  " << fit(c.skipped ? "skipped" : c.passed ? "passed" : "FAILED", w.status) << "  "
      << rfit(time_str(r.seconds), 8) << "\n";
}

Columns columns_for(const std::vector<const Check*>& sel) {
  Columns w;
  for (const Check* c : sel) {
    w.name = std::max(w.name, c->name.size());
    w.config = std::max(w.config, std::min(kMaxConfig, c->config.size()));
  }
  return w;
}

}  // namespace

void list_checks(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out) {
  const auto sel = suite.select(opts.filter);
  const Columns w = columns_for(sel);
  out << fit("check", w.name) << "  " << fit("kind", 9) << "  configuration\n";
  for (const Check* c : sel) out << fit(c->name, w.name) << "  " << fit(c->kind, 9) << "  " << c->config << "\n";
  out << sel.size() << " check" << (sel.size() == 1 ? "" : "s") << "\n";
}

SuiteReport run_suite(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out) {
  SuiteReport rep;
  rep.options = opts;
  const auto sel = suite.select(opts.filter);
  Columns w = columns_for(sel);
  if (opts.order == 2) w.status = 7;
  if (opts.order != 1 && opts.order != 2)
    throw UsageError(op_message("gradcheck", "--order must be 1 or 2, got " + std::to_string(opts.order)));
  const Tolerances tol = Tolerances::for_order(opts.dtype, opts.order);
  out << "xgrad gradcheck: " << sel.size() << " check" << (sel.size() == 1 ? "" : "s") << ", "
      << dtype_name(opts.dtype) << ", seed " << opts.seed << (opts.full ? ", full sweep" : "")
      << (opts.order == 2 ? ", order 2" : "") << "\n";
  if (opts.order == 2)
    out << "order 2: gradient checks run gradgradcheck (the recorded VJP's gradient against central differences of "
           "first-order gradients)\nand jvpcheck (forward-mode J u against central differences and <v, J u> = "
           "<J^T v, u>), module checks with their leaves in place\n(gradgradcheck_leaves, jvpcheck_leaves); checks "
           "without a second-order form are skipped\n";
  out << "gradient checks: central differences, step h = " << num(tol.eps)
      << " * max(1, |x|); pass when |analytic - numeric| <= " << num(tol.atol) << " + " << num(tol.rtol)
      << " |numeric|\n";
  if (opts.order == 2 && opts.dtype == DType::float32)
    out << "float32 at order 2: looser tolerances, atol " << num(tol.atol) << " and rtol " << num(tol.rtol)
        << " (order 1: " << num(Tolerances::for_dtype(opts.dtype).atol) << " and "
        << num(Tolerances::for_dtype(opts.dtype).rtol)
        << "): the numeric side differences first-order gradients, which carry their own rounding\n";
  if (opts.dtype == DType::float32) {
    const double u = unit_roundoff(DType::float32);
    out << "float32: unit roundoff u = " << sci(u, 1) << "; a central difference then keeps about two thirds of the "
        << "digits\n(error ~ u^(2/3) = " << sci(std::cbrt(u * u), 1) << " times the function's scale), so the step "
        << "and tolerances are larger than in float64 (docs/gradcheck.md)\n";
  }
  out << "\n";
  print_header(out, w);
  const auto t0 = std::chrono::steady_clock::now();
  for (const Check* c : sel) {
    CheckRecord r;
    r.name = c->name;
    r.kind = c->kind;
    const auto s = std::chrono::steady_clock::now();
    try {
      Tape tape;  // whatever the check records is freed with it
      CheckContext ctx(opts.dtype, opts.seed, opts.full, c->name, opts.order);
      r.result = c->run(ctx);
      if (opts.order == 2 && !r.result.skipped && ctx.second_order_runs() == 0)
        r.result = CheckResult::skip("no second-order form: a " + c->kind +
                                     " check that runs no gradcheck (its verdict does not depend on the order)");
    } catch (const std::exception& e) {
      r.result = CheckResult{};
      r.result.passed = false;
      r.result.max_abs_error = std::numeric_limits<double>::quiet_NaN();
      r.result.worst = "-";
      r.result.mode = "error";
      r.result.message = std::string("the check threw: ") + e.what();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
    r.config = r.result.config.empty() ? c->config : r.result.config;
    (r.result.skipped ? rep.skipped : r.result.passed ? rep.passed : rep.failed)++;
    print_row(out, w, r, opts.dtype);
    out.flush();
    rep.records.push_back(std::move(r));
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rep.failed > 0) {
    out << "\nFailures:\n";
    for (const CheckRecord& r : rep.records)
      if (!r.result.passed && !r.result.skipped) {
        out << "  " << r.name << " (" << dtype_name(opts.dtype) << ", " << r.config << ")\n";
        out << "    " << r.result.message << "\n";
      }
  }
  out << "\n" << rep.records.size() << " checks in " << time_str(rep.seconds) << "\n";
  out << rep.passed << " passed, " << rep.failed << " failed";
  if (rep.skipped > 0) out << ", " << rep.skipped << " skipped";
  out << std::endl;
  return rep;
}

std::string report_json(const SuiteReport& rep) {
  using nlohmann::ordered_json;
  const Tolerances tol = Tolerances::for_order(rep.options.dtype, rep.options.order);
  ordered_json j;
  j["tool"] = "xgrad gradcheck";
  j["dtype"] = dtype_name(rep.options.dtype);
  j["order"] = rep.options.order;
  j["seed"] = rep.options.seed;
  j["full"] = rep.options.full;
  j["filter"] = rep.options.filter;
  j["tolerances"] = {{"eps", tol.eps}, {"atol", tol.atol}, {"rtol", tol.rtol},
                     {"unit_roundoff", unit_roundoff(rep.options.dtype)}};
  ordered_json checks = ordered_json::array();
  for (const CheckRecord& r : rep.records) {
    const CheckResult& c = r.result;
    ordered_json e;
    e["check"] = r.name;
    e["kind"] = r.kind;
    e["dtype"] = dtype_name(rep.options.dtype);
    e["configuration"] = r.config;
    e["max_abs_error"] = c.max_abs_error;  // NaN and inf become null
    if (c.max_rel_error >= 0)
      e["max_rel_error"] = c.max_rel_error;
    else
      e["max_rel_error"] = nullptr;
    e["worst_element"] = c.worst;
    e["status"] = c.skipped ? "skipped" : c.passed ? "passed" : "failed";
    e["passed"] = c.passed;
    e["time_s"] = r.seconds;
    e["mode"] = c.mode;
    e["comparisons"] = c.comparisons;
    e["message"] = c.message;
    checks.push_back(std::move(e));
  }
  j["checks"] = std::move(checks);
  j["summary"] = {{"total", rep.records.size()},
                  {"order", rep.options.order},
                  {"passed", rep.passed},
                  {"failed", rep.failed},
                  {"skipped", rep.skipped},
                  {"time_s", rep.seconds}};
  return j.dump(2);
}

int run_gradcheck_command(const GradcheckSuite& suite, const RunOptions& opts, std::ostream& out) {
  if (opts.order != 1 && opts.order != 2)
    throw UsageError(op_message("gradcheck", "--order must be 1 or 2, got " + std::to_string(opts.order)));
  if (opts.list) {
    list_checks(suite, opts, out);
    return 0;
  }
  if (suite.select(opts.filter).empty())
    throw UsageError(op_message("gradcheck", "no check matches --filter '" + opts.filter + "'; --list shows the " +
                                                 std::to_string(suite.size()) + " names"));
  if (opts.json_path == "-") {  // the report alone on `out`: the table goes nowhere
    std::ostringstream table;
    const SuiteReport rep = run_suite(suite, opts, table);
    out << report_json(rep) << "\n";
    return rep.all_passed() ? 0 : 1;
  }
  std::ofstream json;
  if (!opts.json_path.empty()) {  // opened first: a bad path fails before the run, not after
    json.open(opts.json_path);
    if (!json)
      throw UsageError(op_message("gradcheck", "--json: cannot open '" + opts.json_path + "' to write the JSON report"));
  }
  const SuiteReport rep = run_suite(suite, opts, out);
  if (json.is_open()) {
    json << report_json(rep) << "\n";
    if (!json) throw ValueError(op_message("gradcheck", "writing the JSON report to '" + opts.json_path + "' failed"));
  }
  return rep.all_passed() ? 0 : 1;
}

GradcheckSuite& default_gradcheck_suite() {
  static GradcheckSuite suite;
  return suite;
}

namespace detail {
bool register_default_check(const char* name, const char* config, CheckResult (*fn)(CheckContext&)) {
  default_gradcheck_suite().add(name, "custom", config, fn);
  return true;
}
bool register_default_check_of_kind(const char* name, const char* kind, const char* config,
                                    CheckResult (*fn)(CheckContext&)) {
  default_gradcheck_suite().add(name, kind, config, fn);
  return true;
}
}  // namespace detail

}  // namespace xg
