// jvp, hvp and hessian on top of create_graph (core/higher_order.hpp, docs/higher-order.md).
#include <xgrad/core/higher_order.hpp>

#include <string>

#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/tape.hpp>

namespace xg {

namespace {

// <g, v> for a constant v of g's shape: one recorded op (first order only; core has no ops
// layer to compose it from). VJP: g_bar = s_bar * v.
Tensor dot_constant(const Tensor& g, const Array& v) {
  const Array prod = kernels::mul(g.value(), v);
  double s = 0;
  for (std::size_t i = 0; i < prod.size(); ++i) s += prod.flat(i);
  return record("dot_constant", Array::full({}, s, g.dtype()), {g}, [v](const VjpContext& c) {
    return Cotangents{kernels::mul(kernels::broadcast_to(c.grad_output, v.shape()), v)};
  });
}

void check_like(const std::string& op, const std::string& what, const Array& a, const std::string& ref_name,
                const Array& ref) {
  if (!a.defined()) throw ValueError(op_message(op, what + " is undefined"));
  if (a.dtype() != ref.dtype())
    throw DTypeError(op_message(op, what + " is " + dtype_name(a.dtype()) + ", " + ref_name + " is " +
                                        dtype_name(ref.dtype())));
  if (a.shape() != ref.shape())
    throw ShapeError(op_message(op, what + " has shape " + shape_str(a.shape()) + ", " + ref_name + " has shape " +
                                        shape_str(ref.shape())));
}

BackwardOptions graph_opts() {
  BackwardOptions o;
  o.create_graph = true;
  return o;
}

// f(x) on a leaf that requires grad, checked to be one element.
Tensor scalar_output(const std::string& op, const ScalarFn& f, const Tensor& x) {
  Tensor y = f(x);
  if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
  if (y.size() != 1)
    throw ValueError(op_message(op, "f must return one element, returned shape " + shape_str(y.shape())));
  return y;
}

// a + b for one-element a and b: one recorded op (first order only).
Tensor add_scalars(const std::string& name, const Tensor& a, const Tensor& b) {
  return record(name, kernels::add(a.value(), b.value()), {a, b},
                [](const VjpContext& c) { return Cotangents{c.grad_output, c.grad_output}; });
}

// sum_k <g[k], v[k]> over the recorded g[k] (constants do not depend on the leaves: skipped);
// undefined when none is recorded.
Tensor dot_all(const std::vector<Tensor>& g, const std::vector<Array>& v) {
  Tensor s;
  for (std::size_t k = 0; k < g.size(); ++k) {
    if (!g[k].requires_grad()) continue;
    const Tensor d = dot_constant(g[k], v[k]);
    s = s.defined() ? add_scalars("hvp_sum", s, d) : d;
  }
  return s;
}

// The checks of the parameter forms: leaves requiring grad, and (when `v` is given) one v per
// parameter like it.
void check_params(const std::string& op, const std::vector<Tensor>& params, const std::vector<Array>* v) {
  if (params.empty()) throw ValueError(op_message(op, "needs at least one parameter"));
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::string name = "params[" + std::to_string(k) + "]";
    if (!params[k].defined()) throw ValueError(op_message(op, name + " is undefined"));
    if (!params[k].is_leaf() || !params[k].requires_grad())
      throw ValueError(op_message(op, name + " must be a leaf that requires grad (a parameter)"));
  }
  if (!v) return;
  if (v->size() != params.size())
    throw ValueError(op_message(op, std::to_string(v->size()) + " vectors v for " + std::to_string(params.size()) +
                                        " parameters"));
  for (std::size_t k = 0; k < params.size(); ++k)
    check_like(op, "v[" + std::to_string(k) + "]", (*v)[k], "params[" + std::to_string(k) + "]", params[k].value());
}

std::vector<Array> zeros_like(const std::vector<Tensor>& params) {
  std::vector<Array> z;
  for (const Tensor& p : params) z.push_back(Array::zeros(p.shape(), p.dtype()));
  return z;
}

Tensor scalar_loss(const std::string& op, const LossFn& f) {
  Tensor y = f();
  if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
  if (y.size() != 1)
    throw ValueError(op_message(op, "f must return one element, returned shape " + shape_str(y.shape())));
  return y;
}

Array rademacher(const Shape& shape, DType dtype, Generator& gen) {
  Array v = Array::zeros(shape, dtype);
  for (std::size_t i = 0; i < v.size(); ++i) v.set_flat(i, (gen.next_u64() >> 63) ? 1.0 : -1.0);
  return v;
}

// Hutchinson's estimate for the leaves `wrt` of the recorded loss y.
std::vector<Array> hutchinson(const Tensor& y, const std::vector<Tensor>& wrt, std::size_t samples, Generator& gen) {
  std::vector<Array> diag = zeros_like(wrt);
  if (!y.requires_grad()) return diag;
  const std::vector<Tensor> g = grad(y, wrt, Tensor(), graph_opts());
  for (std::size_t n = 0; n < samples; ++n) {
    std::vector<Array> v;
    for (const Tensor& p : wrt) v.push_back(rademacher(p.shape(), p.dtype(), gen));
    const Tensor s = dot_all(g, v);
    if (!s.defined()) return diag;  // f is linear in the leaves: H = 0
    BackwardOptions keep;
    keep.retain_graph = true;
    const std::vector<Array> hv = grad(s, wrt, Array(), keep);
    for (std::size_t k = 0; k < wrt.size(); ++k)
      diag[k] = kernels::add(diag[k], kernels::mul(v[k], hv[k]));
  }
  const double inv = 1.0 / double(samples);
  for (Array& d : diag)
    for (std::size_t i = 0; i < d.size(); ++i) d.set_flat(i, d.flat(i) * inv);
  return diag;
}

void check_samples(const std::string& op, std::size_t samples) {
  if (samples == 0) throw ValueError(op_message(op, "samples must be at least 1, got 0"));
}

}  // namespace

JvpResult jvp(const TensorFn& f, const std::vector<Array>& primals, const std::vector<Array>& tangents) {
  const std::string op = "jvp";
  if (primals.empty()) throw ValueError(op_message(op, "needs at least one primal"));
  if (tangents.size() != primals.size())
    throw ValueError(op_message(op, std::to_string(tangents.size()) + " tangents for " +
                                        std::to_string(primals.size()) + " primals"));
  for (std::size_t k = 0; k < primals.size(); ++k) {
    if (!primals[k].defined()) throw ValueError(op_message(op, "primals[" + std::to_string(k) + "] is undefined"));
    check_like(op, "tangents[" + std::to_string(k) + "]", tangents[k], "primals[" + std::to_string(k) + "]",
               primals[k]);
  }
  Tape tape;
  EnableGradGuard recording;
  std::vector<Tensor> xs;
  for (const Array& p : primals) xs.emplace_back(p, true);
  const Tensor y = f(xs);
  if (!y.defined()) throw ValueError(op_message(op, "f returned an undefined Tensor"));
  JvpResult r{y.value(), Array::zeros(y.shape(), y.dtype())};
  if (!y.requires_grad()) return r;  // f does not depend on the primals
  // g(u) = J^T u is linear in u, so its value at u does not matter: zeros keep it cheap.
  const Tensor u(Array::zeros(y.shape(), y.dtype()), true);
  const std::vector<Tensor> g = grad(y, xs, u, graph_opts());
  Tensor s;
  for (std::size_t k = 0; k < g.size(); ++k) {
    if (!g[k].requires_grad()) continue;  // a constant: it does not depend on u
    const Tensor d = dot_constant(g[k], tangents[k]);
    s = s.defined() ? add_scalars("jvp_sum", s, d) : d;
  }
  if (!s.defined()) return r;
  r.tangent = grad(s, {u})[0];
  return r;
}

Array hvp(const ScalarFn& f, const Array& x, const Array& v) {
  const std::string op = "hvp";
  if (!x.defined()) throw ValueError(op_message(op, "x is undefined"));
  check_like(op, "v", v, "x", x);
  Tape tape;
  EnableGradGuard recording;
  const Tensor xt(x, true);
  const Tensor y = scalar_output(op, f, xt);
  if (!y.requires_grad()) return Array::zeros(x.shape(), x.dtype());
  const Tensor g = grad(y, {xt}, Tensor(), graph_opts())[0];
  if (!g.requires_grad()) return Array::zeros(x.shape(), x.dtype());  // f is linear in x
  return grad(dot_constant(g, v), {xt})[0];
}

std::vector<Array> hvp(const LossFn& f, const std::vector<Tensor>& params, const std::vector<Array>& v) {
  const std::string op = "hvp";
  check_params(op, params, &v);
  Tape tape;
  EnableGradGuard recording;
  const Tensor y = scalar_loss(op, f);
  if (!y.requires_grad()) return zeros_like(params);
  const Tensor s = dot_all(grad(y, params, Tensor(), graph_opts()), v);
  if (!s.defined()) return zeros_like(params);  // f is linear in the parameters
  return grad(s, params);
}

Array hutchinson_diagonal(const ScalarFn& f, const Array& x, std::size_t samples, Generator& gen) {
  const std::string op = "hutchinson_diagonal";
  if (!x.defined()) throw ValueError(op_message(op, "x is undefined"));
  check_samples(op, samples);
  Tape tape;
  EnableGradGuard recording;
  const Tensor xt(x, true);
  return hutchinson(scalar_output(op, f, xt), {xt}, samples, gen)[0];
}

std::vector<Array> hutchinson_diagonal(const LossFn& f, const std::vector<Tensor>& params, std::size_t samples,
                                       Generator& gen) {
  const std::string op = "hutchinson_diagonal";
  check_params(op, params, nullptr);
  check_samples(op, samples);
  Tape tape;
  EnableGradGuard recording;
  return hutchinson(scalar_loss(op, f), params, samples, gen);
}

Array hessian(const ScalarFn& f, const Array& x, std::size_t max_elements) {
  const std::string op = "hessian";
  if (!x.defined()) throw ValueError(op_message(op, "x is undefined"));
  const std::size_t limit = std::min(max_elements, kHessianMaxElements);
  if (x.size() > limit)
    throw ValueError(op_message(op, "x has " + std::to_string(x.size()) + " elements (shape " + shape_str(x.shape()) +
                                        "); the Hessian is computed for at most " + std::to_string(limit) +
                                        " (one reverse pass per element, size^2 values): use hvp() instead"));
  Shape hs = x.shape();
  hs.insert(hs.end(), x.shape().begin(), x.shape().end());
  Array H = Array::zeros(hs, x.dtype());
  Tape tape;
  EnableGradGuard recording;
  const Tensor xt(x, true);
  const Tensor y = scalar_output(op, f, xt);
  if (!y.requires_grad()) return H;
  const Tensor g = grad(y, {xt}, Tensor(), graph_opts())[0];
  if (!g.requires_grad()) return H;  // f is linear in x
  const std::size_t n = x.size();
  for (std::size_t i = 0; i < n; ++i) {
    Array e = Array::zeros(x.shape(), x.dtype());
    e.set_flat(i, 1.0);
    BackwardOptions keep;
    keep.retain_graph = true;
    const Array row = grad(g, {xt}, e, keep)[0];
    for (std::size_t j = 0; j < n; ++j) H.set_flat(i * n + j, row.flat(j));
  }
  return H;
}

}  // namespace xg
