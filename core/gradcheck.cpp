#include <xgrad/core/gradcheck.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/core/higher_order.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/core/tape.hpp>

namespace xg {

namespace {

std::string index_str(const std::vector<std::size_t>& idx) { return "(" + index_list(idx) + ")"; }

class Checker {
 public:
  Checker(const GradcheckFn& f, const std::vector<Array>& inputs, const GradcheckOptions& o,
          const std::vector<std::string>& names)
      : f_(f), inputs_(inputs), o_(o), names_(names), cmp_(o.atol, o.rtol) {}

  Tensor evaluate(const std::vector<Array>& xs) {
    NoGradGuard ng;
    std::vector<Tensor> ts;
    for (const Array& x : xs) ts.emplace_back(x, false);
    Tensor y = f_(ts);
    if (!y.defined()) throw ValueError(op_message("gradcheck", "f returned an undefined Tensor"));
    return y;
  }

  // Runs f on fresh leaves; returns output and leaves.
  Tensor forward(std::vector<Tensor>& leaves) {
    leaves.clear();
    for (const Array& x : inputs_) leaves.emplace_back(x, true);
    Tensor y = f_(leaves);
    if (!y.defined()) throw ValueError(op_message("gradcheck", "f returned an undefined Tensor"));
    if (!y.requires_grad())
      throw ValueError(op_message("gradcheck", "f's output does not depend on any input through "
                                               "a differentiable op (it does not require grad)"));
    return y;
  }

  double step(double x) const { return o_.eps * std::max(1.0, std::fabs(x)); }

  void full() {
    cmp_.report().mode = "full";
    std::vector<Tensor> leaves;
    Tensor y = forward(leaves);
    const std::size_t n_out = y.size();
    const Shape out_shape = y.shape();
    // Analytic Jacobian rows: J[k][i] = d y_i / d x_k (flattened x_k).
    std::vector<std::vector<std::vector<double>>> J(inputs_.size(), std::vector<std::vector<double>>(n_out));
    for (std::size_t i = 0; i < n_out; ++i) {
      Array seed = Array::zeros(out_shape, y.dtype());
      seed.set_flat(i, 1.0);
      BackwardOptions bo;
      bo.retain_graph = i + 1 < n_out;
      const auto g = grad(y, leaves, seed, bo);
      for (std::size_t k = 0; k < inputs_.size(); ++k) J[k][i] = g[k].to_vector();
    }
    // Numeric Jacobian columns, compared as they are computed.
    for (std::size_t k = 0; k < inputs_.size(); ++k) {
      for (std::size_t j = 0; j < inputs_[k].size(); ++j) {
        std::vector<Array> xs = inputs_;
        const double x0 = inputs_[k].flat(j), h = step(x0);
        xs[k] = inputs_[k].clone();
        xs[k].set_flat(j, x0 + h);
        const auto yp = evaluate(xs).value().to_vector();
        xs[k].set_flat(j, x0 - h);
        const auto ym = evaluate(xs).value().to_vector();
        for (std::size_t i = 0; i < n_out; ++i)
          cmp_.compare(J[k][i][j], (yp[i] - ym[i]) / (2 * h), k, unravel_index(j, inputs_[k].shape()),
                  unravel_index(i, out_shape));
      }
    }
  }

  void projection() {
    cmp_.report().mode = "projection";
    Generator gen(o_.seed);
    for (int r = 0; r < o_.projections; ++r) {
      std::vector<Tensor> leaves;
      Tensor y = forward(leaves);
      const Array v = random_normal(y.shape(), gen, y.dtype());
      const auto g = grad(y, leaves, v);
      const auto vv = v.to_vector();
      for (std::size_t k = 0; k < inputs_.size(); ++k) {
        const Array u = random_normal(inputs_[k].shape(), gen, inputs_[k].dtype());
        const auto uu = u.to_vector(), gk = g[k].to_vector(), xk = inputs_[k].to_vector();
        double analytic = 0, scale = 0;
        for (std::size_t j = 0; j < uu.size(); ++j) {
          analytic += gk[j] * uu[j];
          scale = std::max(scale, std::fabs(xk[j]));
        }
        const double h = step(scale);
        std::vector<Array> xs = inputs_;
        Array xp = inputs_[k].clone(), xm = inputs_[k].clone();
        for (std::size_t j = 0; j < uu.size(); ++j) {
          xp.set_flat(j, xk[j] + h * uu[j]);
          xm.set_flat(j, xk[j] - h * uu[j]);
        }
        xs[k] = xp;
        const auto yp = evaluate(xs).value().to_vector();
        xs[k] = xm;
        const auto ym = evaluate(xs).value().to_vector();
        double numeric = 0;
        for (std::size_t i = 0; i < vv.size(); ++i) numeric += vv[i] * (yp[i] - ym[i]) / (2 * h);
        cmp_.compare(analytic, numeric, k);
      }
    }
  }

  GradcheckReport run() {
    if (inputs_.empty()) throw ValueError(op_message("gradcheck", "needs at least one input"));
    std::size_t total_in = 0;
    for (std::size_t k = 0; k < inputs_.size(); ++k) {
      if (!inputs_[k].defined())
        throw ValueError(op_message("gradcheck", "input " + std::to_string(k) + " is undefined"));
      if (inputs_[k].dtype() == DType::float32 && !o_.allow_float32)
        throw DTypeError(op_message("gradcheck", "input " + std::to_string(k) + " (" + name(k) +
                                                     ") is float32; finite differences need float64. "
                                                     "Set allow_float32 and loosen eps, atol and rtol to opt in"));
      total_in += inputs_[k].size();
    }
    if (!(o_.eps > 0) || !(o_.atol >= 0) || !(o_.rtol >= 0))
      throw ValueError(op_message("gradcheck", "eps must be > 0 and atol, rtol >= 0"));
    std::size_t n_out;
    {
      NoGradGuard ng;
      n_out = evaluate(inputs_).size();
    }
    const bool use_full = o_.mode == GradcheckOptions::Mode::full ||
                          (o_.mode == GradcheckOptions::Mode::automatic && total_in * n_out <= o_.full_max_entries);
    if (use_full)
      full();
    else
      projection();
    GradcheckReport r = cmp_.report();
    r.input_name = name(r.input);
    return r;
  }

  std::string name(std::size_t k) const {
    return k < names_.size() ? names_[k] : "input " + std::to_string(k);
  }

 private:
  const GradcheckFn& f_;
  const std::vector<Array>& inputs_;
  const GradcheckOptions& o_;
  const std::vector<std::string>& names_;
  GradcheckComparer cmp_;
};

}  // namespace

GradcheckComparer::GradcheckComparer(double atol, double rtol) {
  report_.atol = atol;
  report_.rtol = rtol;
}

void GradcheckComparer::compare(double analytic, double numeric, std::size_t input, std::vector<std::size_t> index,
                                std::vector<std::size_t> output_index) {
  ++report_.comparisons;
  const double err = std::fabs(analytic - numeric);
  const double tol = report_.atol + report_.rtol * std::fabs(numeric);
  double score = err / tol;
  if (!std::isfinite(analytic) || !std::isfinite(numeric)) score = std::numeric_limits<double>::infinity();
  report_.max_abs_error = std::isfinite(err) ? std::max(report_.max_abs_error, err) : std::numeric_limits<double>::infinity();
  const double rel =
      std::fabs(numeric) > 0 ? err / std::fabs(numeric) : (err > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  if (std::fabs(numeric) > report_.atol) report_.max_rel_error = std::max(report_.max_rel_error, rel);
  if (!(score <= 1.0)) report_.passed = false;
  if (score > worst_score_ || report_.comparisons == 1) {
    worst_score_ = score;
    report_.input = input;
    report_.index = std::move(index);
    report_.output_index = std::move(output_index);
    report_.analytic = analytic;
    report_.numeric = numeric;
    report_.abs_error = err;
    report_.rel_error = rel;
  }
}

std::string GradcheckReport::summary() const {
  std::ostringstream os;
  os.precision(6);
  os << "gradcheck " << (passed ? "passed" : "FAILED") << " (" << mode << ", " << comparisons
     << " comparisons, atol " << atol << ", rtol " << rtol << "): max abs error " << max_abs_error
     << ", max rel error " << max_rel_error << "; worst element: " << input_name;
  if (!index.empty() || mode == "full") os << " index " << index_str(index);
  if (!output_index.empty() || mode == "full") os << " (output " << index_str(output_index) << ")";
  if (mode == "projection") os << " (random projection)";
  os << ", analytic " << analytic << ", numeric " << numeric << ", abs error " << abs_error
     << ", rel error " << rel_error;
  return os.str();
}

GradcheckReport gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                          const GradcheckOptions& opts, const std::vector<std::string>& names) {
  return Checker(f, inputs, opts, names).run();
}

namespace {

double dot_values(const std::vector<double>& a, const Array& b) {
  const std::vector<double> bv = b.to_vector();
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * bv[i];
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// gradgradcheck

namespace {

// The tensors flattened and joined into one 1-d tensor, recorded (first order: the checker
// differentiates it once). VJP: the matching pieces of the cotangent.
Tensor pack(const std::vector<Tensor>& ts, DType dtype) {
  std::size_t n = 0;
  for (const Tensor& t : ts) n += t.size();
  Array out = Array::empty({n}, dtype);
  std::size_t off = 0;
  for (const Tensor& t : ts)
    for (std::size_t i = 0; i < t.size(); ++i) out.set_flat(off++, t.value().flat(i));
  return record("gradgradcheck_pack", std::move(out), ts, [](const VjpContext& c) {
    Cotangents cot(c.inputs.size());
    std::size_t o = 0;
    for (std::size_t k = 0; k < c.inputs.size(); ++k) {
      Array gk = Array::empty(c.inputs[k].shape(), c.inputs[k].dtype());
      for (std::size_t i = 0; i < gk.size(); ++i) gk.set_flat(i, c.grad_output.flat(o++));
      cot[k] = std::move(gk);
    }
    return cot;
  });
}

}  // namespace

GradcheckReport gradgradcheck(const GradcheckFn& f, const std::vector<Array>& inputs, const GradcheckOptions& opts,
                              const std::vector<std::string>& names) {
  const std::string op = "gradgradcheck";
  if (inputs.empty()) throw ValueError(op_message(op, "needs at least one input"));
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (!inputs[k].defined()) throw ValueError(op_message(op, "input " + std::to_string(k) + " is undefined"));
  Shape y_shape;
  DType y_dtype;
  {
    NoGradGuard ng;
    std::vector<Tensor> ts;
    for (const Array& x : inputs) ts.emplace_back(x, false);
    const Tensor y = f(ts);
    if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
    y_shape = y.shape();
    y_dtype = y.dtype();
  }
  const std::size_t n = inputs.size();
  const DType dtype = inputs[0].dtype();
  // G(x, v): recorded (create_graph) when the checker's leaves require grad; on the numeric
  // side (constants, grad mode off) the plain first-order gradients' values.
  const GradcheckFn G = [&f, n, dtype, op](const std::vector<Tensor>& in) {
    const std::vector<Tensor> xs(in.begin(), in.begin() + static_cast<long>(n));
    const Tensor& v = in[n];
    if (in[0].requires_grad()) {
      const Tensor y = f(xs);
      if (!y.defined() || !y.requires_grad())
        throw ValueError(op_message(op, "f's output does not depend on any input through a differentiable op"));
      BackwardOptions o;
      o.create_graph = true;
      return pack(grad(y, xs, v, o), dtype);
    }
    EnableGradGuard recording;
    Tape tape;
    std::vector<Tensor> leaves;
    for (const Tensor& x : xs) leaves.emplace_back(x.value(), true);
    const Tensor y = f(leaves);
    if (!y.defined() || !y.requires_grad())
      throw ValueError(op_message(op, "f's output does not depend on any input through a differentiable op"));
    const std::vector<Array> g = grad(y, leaves, v.value());
    std::vector<Tensor> values;
    for (const Array& a : g) values.emplace_back(a, false);
    NoGradGuard constant;
    return pack(values, dtype);
  };
  std::vector<Array> all = inputs;
  Generator gen(opts.seed ^ 0x9e3779b97f4a7c15ULL);
  all.push_back(random_normal(y_shape, gen, y_dtype));
  std::vector<std::string> all_names;
  for (std::size_t k = 0; k < n; ++k) all_names.push_back(k < names.size() ? names[k] : "input " + std::to_string(k));
  all_names.push_back("grad_output");
  GradcheckReport r = gradcheck(G, all, opts, all_names);
  return r;
}

// ---------------------------------------------------------------------------------------
// gradcheck_leaves

namespace {

using Leaves = std::vector<std::pair<std::string, Tensor>>;

// The leaves' values, each leaf checked: defined, a leaf, float64 (float32 when allowed);
// `total` is set to their number of elements.
std::vector<Array> checked_leaf_values(const Leaves& leaves, const GradcheckOptions& o, const std::string& op,
                                       std::size_t& total) {
  if (leaves.empty()) throw ValueError(op_message(op, "needs at least one leaf"));
  if (!(o.eps > 0) || !(o.atol >= 0) || !(o.rtol >= 0))
    throw ValueError(op_message(op, "eps must be > 0 and atol, rtol >= 0"));
  std::vector<Array> saved;
  total = 0;
  for (const auto& [name, t] : leaves) {
    if (!t.defined()) throw ValueError(op_message(op, "leaf '" + name + "' is an undefined Tensor"));
    if (!t.is_leaf())
      throw ValueError(op_message(op, "'" + name + "' is not a leaf (it was recorded by an op); pass parameters "
                                      "or tensors created with requires_grad"));
    if (t.dtype() == DType::float32 && !o.allow_float32)
      throw DTypeError(op_message(op, "leaf '" + name + "' is float32; finite differences need float64. Set "
                                      "allow_float32 and loosen eps, atol and rtol to opt in"));
    saved.push_back(t.value());
    total += t.size();
  }
  return saved;
}

// Restores every leaf's value on the way out, whatever happens.
struct RestoreValues {
  const Leaves& leaves;
  const std::vector<Array>& saved;
  ~RestoreValues() {
    for (std::size_t k = 0; k < leaves.size(); ++k) {
      Tensor t = leaves[k].second;
      t.set_value(saved[k]);
    }
  }
};

// The leaves as tensors to differentiate with respect to, each requiring grad while this lives;
// those that did not before stop again on the way out.
struct RequireGrad {
  std::vector<Tensor> wrt;
  std::vector<bool> had_grad;
  explicit RequireGrad(const Leaves& leaves) {
    for (const auto& kv : leaves) {
      wrt.push_back(kv.second);
      had_grad.push_back(kv.second.requires_grad());
      Tensor t = kv.second;
      if (!t.requires_grad()) t.requires_grad_(true);
    }
  }
  ~RequireGrad() {
    for (std::size_t k = 0; k < wrt.size(); ++k)
      if (!had_grad[k]) wrt[k].requires_grad_(false);
  }
  RequireGrad(const RequireGrad&) = delete;
  RequireGrad& operator=(const RequireGrad&) = delete;
};

// The analytic side: `v`, a random cotangent of f's output drawn from `gen`, and `g`, the
// gradients of v . f() with respect to `wrt` from the tape.
void analytic_gradients(const std::function<Tensor()>& f, const std::vector<Tensor>& wrt, Generator& gen,
                        const std::string& op, std::vector<double>& v, std::vector<Array>& g) {
  Tape tape;
  Tensor y = f();
  if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
  if (!y.requires_grad())
    throw ValueError(op_message(op, "f's output does not depend on any leaf through a differentiable op"));
  const Array va = random_normal(y.shape(), gen, y.dtype());
  v = va.to_vector();
  g = grad(y, wrt, va);
}

// The numeric side: central differences of v . f() with the leaves' values moved from `saved`
// (and put back), compared with the analytic gradients `g`.
struct LeafDifferences {
  const std::function<Tensor()>& f;
  const Leaves& leaves;
  const std::vector<Array>& saved;
  const GradcheckOptions& o;
  const std::vector<double>& v;
  const std::vector<Array>& g;
  const std::string& op;

  // v . f() in double, with the leaf values as they are now.
  double eval() const {
    NoGradGuard ng;
    Tape tape;
    const Tensor y = f();
    if (y.size() != v.size())
      throw ValueError(op_message(op, "f's output changed shape between calls: " + shape_str(y.shape())));
    return dot_values(v, y.value());
  }

  // Every element of every leaf, one at a time.
  void full(GradcheckComparer& cmp) const {
    cmp.report().mode = "full";
    for (std::size_t k = 0; k < leaves.size(); ++k) {
      Tensor t = leaves[k].second;
      const Array& x = saved[k];
      for (std::size_t j = 0; j < x.size(); ++j) {
        const double x0 = x.flat(j), h = o.eps * std::max(1.0, std::fabs(x0));
        Array xp = x.clone(), xm = x.clone();
        xp.set_flat(j, x0 + h);
        xm.set_flat(j, x0 - h);
        // The step actually taken (x0 + h is rounded to the leaf's dtype).
        const double step = xp.flat(j) - xm.flat(j);
        t.set_value(xp);
        const double fp = eval();
        t.set_value(xm);
        const double fm = eval();
        t.set_value(x);
        cmp.compare(g[k].flat(j), (fp - fm) / step, k, unravel_index(j, x.shape()));
      }
    }
  }

  // o.projections rounds of one random direction (drawn from `gen`) per leaf.
  void projections(GradcheckComparer& cmp, Generator& gen) const {
    cmp.report().mode = "projection";
    for (int r = 0; r < o.projections; ++r)
      for (std::size_t k = 0; k < leaves.size(); ++k) {
        Tensor t = leaves[k].second;
        const Array& x = saved[k];
        const Array u = random_normal(x.shape(), gen, DType::float64);
        const std::vector<double> uu = u.to_vector(), xx = x.to_vector();
        double scale = 0;
        for (double xi : xx) scale = std::max(scale, std::fabs(xi));
        const double h = o.eps * std::max(1.0, scale);
        Array xp = Array::empty(x.shape(), DType::float64), xm = xp.clone();
        for (std::size_t j = 0; j < xx.size(); ++j) {
          xp.set_flat(j, xx[j] + h * uu[j]);
          xm.set_flat(j, xx[j] - h * uu[j]);
        }
        t.set_value(xp.astype(x.dtype()));
        const double fp = eval();
        t.set_value(xm.astype(x.dtype()));
        const double fm = eval();
        t.set_value(x);
        cmp.compare(dot_values(uu, g[k]), (fp - fm) / (2 * h), k, {});
      }
  }
};

}  // namespace

GradcheckReport gradcheck_leaves(const std::function<Tensor()>& f,
                                 const std::vector<std::pair<std::string, Tensor>>& leaves,
                                 const GradcheckOptions& o) {
  const std::string op = "gradcheck_leaves";
  std::size_t total = 0;
  const std::vector<Array> saved = checked_leaf_values(leaves, o, op, total);
  const RestoreValues restore{leaves, saved};
  const RequireGrad require_grad(leaves);

  Generator gen(o.seed);
  std::vector<Array> g;
  std::vector<double> v;
  analytic_gradients(f, require_grad.wrt, gen, op, v, g);

  GradcheckComparer cmp(o.atol, o.rtol);
  const LeafDifferences differences{f, leaves, saved, o, v, g, op};
  // Automatic: full when the Jacobian is small (as for gradcheck) and the 2 forward passes per
  // element stay affordable (a scalar loss has a one-row Jacobian of any width).
  const bool use_full =
      o.mode == GradcheckOptions::Mode::full ||
      (o.mode == GradcheckOptions::Mode::automatic && total * v.size() <= o.full_max_entries &&
       total <= o.full_max_entries / 8);
  if (use_full)
    differences.full(cmp);
  else
    differences.projections(cmp, gen);
  GradcheckReport rep = cmp.report();
  rep.input_name = leaves[rep.input].first;
  return rep;
}

// ---------------------------------------------------------------------------------------
// gradgradcheck_leaves and jvpcheck_leaves

namespace {

// Flattened and joined, as pack() lays the gradients out.
std::vector<double> joined(const std::vector<Array>& parts) {
  std::vector<double> out;
  for (const Array& a : parts) {
    const std::vector<double> v = a.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The second-order checks of leaves read in place: f, the leaves (requiring grad while the
// check runs, as `wrt`) and their saved values.
struct LeafSecondOrder {
  const std::function<Tensor()>& f;
  const Leaves& leaves;
  const std::vector<Tensor>& wrt;
  const std::vector<Array>& saved;
  const std::string& op;
  DType dtype;  // of the joined gradients: the first leaf's

  // f() recorded on the current tape; it must depend on a leaf.
  Tensor output() const {
    Tensor y = f();
    if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
    if (!y.requires_grad())
      throw ValueError(op_message(op, "f's output does not depend on any leaf through a differentiable op"));
    return y;
  }

  // f()'s value with the leaves' values as they are now (nothing recorded).
  Array value() const {
    NoGradGuard ng;
    Tape tape;
    const Tensor y = f();
    if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
    return y.value();
  }

  // G(x, v): the first-order gradients of v . f() with the leaves' values as they are now, from
  // a plain backward pass, joined into one vector (pack()'s layout).
  std::vector<double> gradients(const Array& v) const {
    EnableGradGuard recording;
    Tape tape;
    const Tensor y = output();
    if (y.shape() != v.shape())
      throw ValueError(op_message(op, "f's output changed shape between calls: " + shape_str(y.shape())));
    return joined(grad(y, wrt, v));
  }

  // The analytic second derivatives: for each seed W in `seeds` (G's shape), the gradient of
  // <W, G(x, v)> with respect to every leaf and then v, G recorded by a backward pass with
  // create_graph (the ops' second-order rules). One recorded G, one reverse pass per seed.
  std::vector<std::vector<Array>> second(const Array& v, const std::vector<Array>& seeds) const {
    EnableGradGuard recording;
    Tape tape;
    const Tensor y = output();
    const Tensor vt(v, true);
    BackwardOptions graph;
    graph.create_graph = true;
    const Tensor G = pack(grad(y, wrt, vt, graph), dtype);
    std::vector<Tensor> all = wrt;
    all.push_back(vt);
    std::vector<std::vector<Array>> out;
    for (std::size_t s = 0; s < seeds.size(); ++s) {
      if (!G.requires_grad()) {  // no gradient depends on a leaf or on v: every derivative is 0
        std::vector<Array> zeros;
        for (const Tensor& t : all) zeros.push_back(Array::zeros(t.shape(), t.dtype()));
        out.push_back(std::move(zeros));
        continue;
      }
      BackwardOptions keep;
      keep.retain_graph = s + 1 < seeds.size();
      out.push_back(grad(G, all, seeds[s], keep));
    }
    return out;
  }

  // J u for one tangent per leaf (joined as `u_joined`), by linearising the reverse mode as
  // jvp() does: with a cotangent c (zeros: G is linear in it), G(x, c) = J^T c is recorded
  // with create_graph and J u = d<G(x, c), u>/dc is one more reverse pass.
  Array forward_tangent(const Array& u_joined) const {
    EnableGradGuard recording;
    Tape tape;
    const Tensor y = output();
    const Tensor c(Array::zeros(y.shape(), y.dtype()), true);
    BackwardOptions graph;
    graph.create_graph = true;
    const Tensor G = pack(grad(y, wrt, c, graph), dtype);
    if (!G.requires_grad()) return Array::zeros(y.shape(), y.dtype());
    return grad(G, {c}, u_joined)[0];
  }

  // Sets leaf k to saved[k] + step * u (u in float64, rounded to the leaf's dtype).
  void move(std::size_t k, double step, const Array& u) const {
    const Array& x = saved[k];
    Array moved = Array::empty(x.shape(), DType::float64);
    for (std::size_t j = 0; j < x.size(); ++j) moved.set_flat(j, x.flat(j) + step * u.flat(j));
    Tensor t = leaves[k].second;
    t.set_value(moved.astype(x.dtype()));
  }
  void restore(std::size_t k) const {
    Tensor t = leaves[k].second;
    t.set_value(saved[k]);
  }
};

double max_abs(const Array& a) {
  double m = 0;
  for (std::size_t j = 0; j < a.size(); ++j) m = std::max(m, std::fabs(a.flat(j)));
  return m;
}

}  // namespace

GradcheckReport gradgradcheck_leaves(const std::function<Tensor()>& f,
                                     const std::vector<std::pair<std::string, Tensor>>& leaves,
                                     const GradcheckOptions& o) {
  const std::string op = "gradgradcheck_leaves";
  std::size_t total = 0;
  const std::vector<Array> saved = checked_leaf_values(leaves, o, op, total);
  const RestoreValues restore{leaves, saved};
  const RequireGrad require_grad(leaves);
  const DType dtype = saved[0].dtype();
  const LeafSecondOrder s{f, leaves, require_grad.wrt, saved, op, dtype};
  const std::size_t n = leaves.size();  // input n is the cotangent v ("grad_output")

  Generator gen(o.seed ^ 0x9e3779b97f4a7c15ULL);
  const Array y0 = s.value();
  const Array v = random_normal(y0.shape(), gen, y0.dtype());
  const std::size_t n_in = total + v.size(), n_out = total;

  GradcheckComparer cmp(o.atol, o.rtol);
  // Automatic: full when G's Jacobian (n_out x n_in) is small, as for gradcheck_leaves, and
  // the 2 first-order passes per input element stay affordable; projections otherwise.
  const bool use_full = o.mode == GradcheckOptions::Mode::full ||
                        (o.mode == GradcheckOptions::Mode::automatic && n_in * n_out <= o.full_max_entries &&
                         n_in <= o.full_max_entries / 8);
  if (!use_full && o.projections < 1)
    throw ValueError(op_message(op, "projection mode needs projections >= 1, got " + std::to_string(o.projections)));
  if (use_full) {
    cmp.report().mode = "full";
    // Analytic: row i of G's Jacobian is the gradient of G_i (seed e_i).
    std::vector<Array> seeds;
    for (std::size_t i = 0; i < n_out; ++i) {
      Array e = Array::zeros({n_out}, dtype);
      e.set_flat(i, 1.0);
      seeds.push_back(std::move(e));
    }
    const std::vector<std::vector<Array>> rows = s.second(v, seeds);
    // Numeric: columns, one input element moved at a time.
    const auto compare_column = [&](std::size_t k, std::size_t j, const Shape& shape, const std::vector<double>& gp,
                                    const std::vector<double>& gm, double step) {
      for (std::size_t i = 0; i < n_out; ++i)
        cmp.compare(rows[i][k].flat(j), (gp[i] - gm[i]) / step, k, unravel_index(j, shape), {i});
    };
    for (std::size_t k = 0; k < n; ++k) {
      const Array& x = saved[k];
      Tensor t = leaves[k].second;
      for (std::size_t j = 0; j < x.size(); ++j) {
        const double x0 = x.flat(j), h = o.eps * std::max(1.0, std::fabs(x0));
        Array xp = x.clone(), xm = x.clone();
        xp.set_flat(j, x0 + h);
        xm.set_flat(j, x0 - h);
        const double step = xp.flat(j) - xm.flat(j);  // as taken, after rounding to the leaf's dtype
        t.set_value(xp);
        const std::vector<double> gp = s.gradients(v);
        t.set_value(xm);
        const std::vector<double> gm = s.gradients(v);
        t.set_value(x);
        compare_column(k, j, x.shape(), gp, gm, step);
      }
    }
    for (std::size_t j = 0; j < v.size(); ++j) {
      const double v0 = v.flat(j), h = o.eps * std::max(1.0, std::fabs(v0));
      Array vp = v.clone(), vm = v.clone();
      vp.set_flat(j, v0 + h);
      vm.set_flat(j, v0 - h);
      compare_column(n, j, v.shape(), s.gradients(vp), s.gradients(vm), vp.flat(j) - vm.flat(j));
    }
  } else {
    cmp.report().mode = "projection";
    for (int r = 0; r < o.projections; ++r) {
      // <W, G> for a random W over all the gradients; its gradient against central
      // differences of <W, G> along a random direction u of each leaf and of v.
      const Array W = random_normal({n_out}, gen, dtype);
      const std::vector<double> w = W.to_vector();
      const std::vector<Array> a = s.second(v, {W})[0];
      for (std::size_t k = 0; k <= n; ++k) {
        const Array& x = k < n ? saved[k] : v;
        const Array u = random_normal(x.shape(), gen, DType::float64);
        const double h = o.eps * std::max(1.0, max_abs(x));
        std::vector<double> gp, gm;
        if (k < n) {
          s.move(k, h, u);
          gp = s.gradients(v);
          s.move(k, -h, u);
          gm = s.gradients(v);
          s.restore(k);
        } else {
          Array vp = Array::empty(v.shape(), DType::float64), vm = vp.clone();
          for (std::size_t j = 0; j < v.size(); ++j) {
            vp.set_flat(j, v.flat(j) + h * u.flat(j));
            vm.set_flat(j, v.flat(j) - h * u.flat(j));
          }
          gp = s.gradients(vp.astype(v.dtype()));
          gm = s.gradients(vm.astype(v.dtype()));
        }
        double numeric = 0;
        for (std::size_t i = 0; i < n_out; ++i) numeric += w[i] * (gp[i] - gm[i]) / (2 * h);
        cmp.compare(dot_values(u.to_vector(), a[k]), numeric, k);
      }
    }
  }
  GradcheckReport rep = cmp.report();
  rep.input_name = rep.input < n ? leaves[rep.input].first : "grad_output";
  return rep;
}

GradcheckReport jvpcheck_leaves(const std::function<Tensor()>& f,
                                const std::vector<std::pair<std::string, Tensor>>& leaves,
                                const GradcheckOptions& o) {
  const std::string op = "jvpcheck_leaves";
  std::size_t total = 0;
  const std::vector<Array> saved = checked_leaf_values(leaves, o, op, total);
  if (o.projections < 1) throw ValueError(op_message(op, "projections must be >= 1"));
  const RestoreValues restore{leaves, saved};
  const RequireGrad require_grad(leaves);
  const DType dtype = saved[0].dtype();
  const LeafSecondOrder s{f, leaves, require_grad.wrt, saved, op, dtype};
  const std::size_t n = leaves.size();
  double scale = 0;  // the step is relative to the largest leaf magnitude, as in jvpcheck
  for (const Array& x : saved) scale = std::max(scale, max_abs(x));
  const double h = o.eps * std::max(1.0, scale);
  GradcheckComparer cmp(o.atol, o.rtol);
  cmp.report().mode = "jvp";
  Generator gen(o.seed ^ 0x6a09e667f3bcc908ULL);
  for (int r = 0; r < o.projections; ++r) {
    std::vector<Array> u;
    for (const Array& x : saved) u.push_back(random_normal(x.shape(), gen, DType::float64));
    const std::vector<double> uj = joined(u);
    const Array ju = s.forward_tangent(Array::from_vector({total}, uj, dtype));
    // (1) J u against (f(x + h u) - f(x - h u)) / 2h, every leaf moved together.
    for (std::size_t k = 0; k < n; ++k) s.move(k, h, u[k]);
    const std::vector<double> yp = s.value().to_vector();
    for (std::size_t k = 0; k < n; ++k) s.move(k, -h, u[k]);
    const std::vector<double> ym = s.value().to_vector();
    for (std::size_t k = 0; k < n; ++k) s.restore(k);
    if (ju.size() != yp.size())
      throw ValueError(op_message(op, "J u has " + std::to_string(ju.size()) + " values for an output of " +
                                          std::to_string(yp.size())));
    for (std::size_t i = 0; i < ju.size(); ++i)
      cmp.compare(ju.flat(i), (yp[i] - ym[i]) / (2 * h), 0, unravel_index(i, ju.shape()));
    // (2) <v, J u> = <J^T v, u>, J^T v from a plain first-order pass.
    const Array v = random_normal(ju.shape(), gen, ju.dtype());
    cmp.compare(dot_values(v.to_vector(), ju), dot(s.gradients(v), uj), 1);
  }
  GradcheckReport rep = cmp.report();
  rep.input_name = rep.input == 0 ? "J u" : "<v, J u>";
  return rep;
}

// ---------------------------------------------------------------------------------------
// jvpcheck

GradcheckReport jvpcheck(const GradcheckFn& f, const std::vector<Array>& inputs, const GradcheckOptions& o,
                         const std::vector<std::string>& names) {
  const std::string op = "jvpcheck";
  if (inputs.empty()) throw ValueError(op_message(op, "needs at least one input"));
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!inputs[k].defined()) throw ValueError(op_message(op, "input " + std::to_string(k) + " is undefined"));
    if (inputs[k].dtype() == DType::float32 && !o.allow_float32)
      throw DTypeError(op_message(op, "input " + std::to_string(k) + " (" +
                                          (k < names.size() ? names[k] : "input " + std::to_string(k)) +
                                          ") is float32; finite differences need float64. Set allow_float32 and "
                                          "loosen eps, atol and rtol to opt in"));
  }
  if (!(o.eps > 0) || !(o.atol >= 0) || !(o.rtol >= 0))
    throw ValueError(op_message(op, "eps must be > 0 and atol, rtol >= 0"));
  if (o.projections < 1) throw ValueError(op_message(op, "projections must be >= 1"));
  const auto evaluate = [&](const std::vector<Array>& xs) {
    NoGradGuard ng;
    std::vector<Tensor> ts;
    for (const Array& x : xs) ts.emplace_back(x, false);
    const Tensor y = f(ts);
    if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
    return y.value();
  };
  double scale = 0;  // the step is relative to the largest input magnitude, as in projection mode
  for (const Array& x : inputs)
    for (std::size_t j = 0; j < x.size(); ++j) scale = std::max(scale, std::fabs(x.flat(j)));
  const double h = o.eps * std::max(1.0, scale);
  GradcheckComparer cmp(o.atol, o.rtol);
  cmp.report().mode = "jvp";
  Generator gen(o.seed ^ 0x6a09e667f3bcc908ULL);
  for (int r = 0; r < o.projections; ++r) {
    std::vector<Array> u;
    for (const Array& x : inputs) u.push_back(random_normal(x.shape(), gen, x.dtype()));
    const JvpResult jv = jvp(f, inputs, u);
    // (1) J u against the central difference (f(x + h u) - f(x - h u)) / 2h, element by element.
    std::vector<Array> xp, xm;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      Array p = inputs[k].clone(), m = inputs[k].clone();
      for (std::size_t j = 0; j < p.size(); ++j) {
        p.set_flat(j, inputs[k].flat(j) + h * u[k].flat(j));
        m.set_flat(j, inputs[k].flat(j) - h * u[k].flat(j));
      }
      xp.push_back(std::move(p));
      xm.push_back(std::move(m));
    }
    const std::vector<double> yp = evaluate(xp).to_vector(), ym = evaluate(xm).to_vector();
    const std::vector<double> ju = jv.tangent.to_vector();
    if (ju.size() != yp.size())
      throw ValueError(op_message(op, "jvp returned " + std::to_string(ju.size()) + " values for an output of " +
                                          std::to_string(yp.size())));
    for (std::size_t i = 0; i < ju.size(); ++i)
      cmp.compare(ju[i], (yp[i] - ym[i]) / (2 * h), 0, unravel_index(i, jv.tangent.shape()));
    // (2) The transpose identity <v, J u> = <J^T v, u>, J^T v from a plain first-order pass.
    const Array v = random_normal(jv.tangent.shape(), gen, jv.tangent.dtype());
    std::vector<Array> jtv;
    {
      EnableGradGuard recording;
      Tape tape;
      std::vector<Tensor> leaves;
      for (const Array& x : inputs) leaves.emplace_back(x, true);
      const Tensor y = f(leaves);
      if (!y.defined() || !y.requires_grad())
        throw ValueError(op_message(op, "f's output does not depend on any input through a differentiable op"));
      jtv = grad(y, leaves, v);
    }
    double lhs = dot_values(v.to_vector(), jv.tangent), rhs = 0;
    for (std::size_t k = 0; k < inputs.size(); ++k) rhs += dot_values(u[k].to_vector(), jtv[k]);
    cmp.compare(lhs, rhs, 1);
  }
  GradcheckReport rep = cmp.report();
  rep.input_name = rep.input == 0 ? "J u" : "<v, J u>";
  return rep;
}

}  // namespace xg
