// Gradient checks of every op in ops/*.hpp ("ops/..."): the tape against central
// differences, full Jacobian (the inputs are small), with broadcasting, repeated indices and
// odd axes where an op has them. Inputs stay clear of kinks by more than the finite-difference
// step: relu, abs and clamp away from their corners, max without ties, log, sqrt and pow on
// positive numbers, divisors away from zero.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/detail/common.hpp>

namespace xg::checks {

namespace {

using Inputs = std::vector<Tensor>;

// One gradient check: make the inputs from ctx, differentiate f.
void op(GradcheckSuite& s, const std::string& name, const std::string& config,
        std::function<std::vector<Array>(CheckContext&)> inputs, GradcheckFn f, std::vector<std::string> names) {
  s.add_gradient_check("ops/" + name, config, std::move(inputs), std::move(f), std::move(names));
}

// Distinct values spaced at least `gap` apart in random order: max has no ties, and every
// perturbation of the step size keeps the same maximum.
Array distinct(const Shape& shape, CheckContext& ctx, double gap = 0.1) {
  const std::size_t n = numel(shape);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (static_cast<double>(i) - static_cast<double>(n) / 2) * gap;
  for (std::size_t i = n; i-- > 1;) std::swap(v[i], v[ctx.gen().below(i + 1)]);
  return ctx.cast(Array::from_vector(shape, v, DType::float64));
}

// Values in [lo, hi] at least `margin` away from every corner in `corners`.
Array away_from(const Shape& shape, CheckContext& ctx, double lo, double hi, const std::vector<double>& corners,
                double margin = 0.1) {
  Array a = Array::empty(shape, DType::float64);
  for (std::size_t i = 0; i < a.size(); ++i) {
    double x;
    bool ok;
    do {
      x = lo + (hi - lo) * ctx.gen().uniform();
      ok = true;
      for (double c : corners) ok = ok && std::fabs(x - c) >= margin;
    } while (!ok);
    a.set_flat(i, x);
  }
  return ctx.cast(a);
}

// One part of a sweep: a configuration's label, its inputs (any dtype; converted to the run's)
// and the function differentiated.
struct Part {
  std::string label;
  std::vector<Array> inputs;
  GradcheckFn f;
  std::vector<std::string> names;
};

// A check over several configurations of one op with one verdict (CheckResult::combine): the
// worst element and the message name the configuration they come from.
void sweep(GradcheckSuite& s, const std::string& name, const std::string& config,
           std::function<std::vector<Part>(CheckContext&)> parts) {
  s.add("ops/" + name, "gradient", config, [parts = std::move(parts)](CheckContext& ctx) {
    std::vector<CheckResult> results;
    for (const Part& p : parts(ctx)) {
      CheckResult r = ctx.gradcheck(p.f, p.inputs, p.names);
      r.worst = p.label + ": " + r.worst;
      if (!r.message.empty()) r.message = p.label + ": " + r.message;
      results.push_back(std::move(r));
    }
    return CheckResult::combine(results);
  });
}

std::string shape_text(const Shape& s) {
  std::string t = "(";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + ")";
}

// Shape pairs that exercise NumPy broadcasting: equal, size-1 axes, missing leading axes,
// scalars, and both operands broadcasting at once.
const std::vector<std::pair<Shape, Shape>>& broadcast_pairs() {
  static const std::vector<std::pair<Shape, Shape>> pairs = {
      {{2, 3}, {2, 3}}, {{2, 3}, {1, 3}}, {{2, 3}, {3}},   {{4, 1, 3}, {2, 1}},
      {{2, 3}, {}},     {{}, {2, 2}},     {{3, 1}, {1, 4}}, {{1, 2, 1}, {3, 1, 2}},
  };
  return pairs;
}

// The axis sets of the reduction sweeps: none (all axes), one, negative, several.
const std::vector<Axes>& axis_sets() {
  static const std::vector<Axes> sets = {{}, {0}, {-1}, {0, 2}, {1}, {-3, -1}};
  return sets;
}

std::string axes_text(const Axes& a) {
  if (a.empty()) return "all axes";
  std::string t = "axes {";
  for (std::size_t i = 0; i < a.size(); ++i) t += (i ? ", " : "") + std::to_string(a[i]);
  return t + "}";
}

void elementwise(GradcheckSuite& s) {
  op(s, "add", "a (2, 3, 4) + b (3, 1): both broadcast",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 4}), c.uniform({3, 1})}; },
     [](const Inputs& in) { return in[0] + in[1]; }, {"a", "b"});
  op(s, "sub", "a (3, 1) - b (4): both broadcast",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 1}), c.uniform({4})}; },
     [](const Inputs& in) { return in[0] - in[1]; }, {"a", "b"});
  op(s, "mul", "a (2, 1, 4) * b (3, 1)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 1, 4}), c.uniform({3, 1})}; },
     [](const Inputs& in) { return in[0] * in[1]; }, {"a", "b"});
  op(s, "div", "a (2, 3) / b (3), |b| in [0.5, 1.5]",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3}), c.away_from_zero({3}, 0.5, 1.5)}; },
     [](const Inputs& in) { return in[0] / in[1]; }, {"a", "b"});
  op(s, "where", "cond (2, 3) ? a (2, 3) : b (1, 3)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3}), c.uniform({1, 3})}; },
     [](const Inputs& in) { return ops::where(BoolArray({2, 3}, {1, 0, 1, 0, 0, 1}), in[0], in[1]); }, {"a", "b"});
  op(s, "scalar-operators", "2.5 x - 3 / x + x / 4 + 1 - (-x) 0.5, x (3, 4), |x| in [0.5, 1.5]",
     [](CheckContext& c) { return std::vector<Array>{c.away_from_zero({3, 4}, 0.5, 1.5)}; },
     [](const Inputs& in) { return 2.5 * in[0] - 3.0 / in[0] + in[0] / 4.0 + 1.0 - (-in[0]) * 0.5; }, {"x"});
  using Binary = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::tuple<const char*, const char*, Binary>> binary = {
      {"add", "+", &ops::add}, {"sub", "-", &ops::sub}, {"mul", "*", &ops::mul}, {"div", "/", &ops::div}};
  for (const auto& b : binary) {
    const std::string name = std::get<0>(b), sign = std::get<1>(b);
    const Binary fn = std::get<2>(b);
    const bool divide = name == "div";
    sweep(s, name + "-broadcasting",
          "a " + sign + " b over 8 shape pairs: equal, size-1 axes, missing axes, scalars, both broadcast" +
              (divide ? "; |b| in [0.5, 1.5]" : ""),
          [divide, fn, sign](CheckContext& c) {
            std::vector<Part> parts;
            for (const auto& [sa, sb] : broadcast_pairs())
              parts.push_back({"a " + shape_text(sa) + " " + sign + " b " + shape_text(sb),
                               {c.uniform(sa), divide ? c.away_from_zero(sb, 0.5, 1.5) : c.uniform(sb)},
                               [fn](const Inputs& in) { return fn(in[0], in[1]); },
                               {"a", "b"}});
            return parts;
          });
  }
}

void unary(GradcheckSuite& s) {
  struct U {
    const char* name;
    const char* config;
    std::function<Array(CheckContext&)> x;
    std::function<Tensor(const Tensor&)> f;
  };
  const std::vector<U> us = {
      {"neg", "x (3, 4)", [](CheckContext& c) { return c.uniform({3, 4}); }, [](const Tensor& x) { return ops::neg(x); }},
      {"exp", "x (3, 4) in [-2, 2]", [](CheckContext& c) { return c.uniform({3, 4}, -2, 2); },
       [](const Tensor& x) { return ops::exp(x); }},
      {"log", "x (3, 4) in [0.2, 3]", [](CheckContext& c) { return c.uniform({3, 4}, 0.2, 3); },
       [](const Tensor& x) { return ops::log(x); }},
      {"sqrt", "x (3, 4) in [0.2, 3]", [](CheckContext& c) { return c.uniform({3, 4}, 0.2, 3); },
       [](const Tensor& x) { return ops::sqrt(x); }},
      {"pow", "x^2.5, x (3, 4) in [0.2, 2]; x^3 on signed x", [](CheckContext& c) { return c.uniform({3, 4}, 0.2, 2); },
       [](const Tensor& x) { return ops::pow(x, 2.5) + ops::pow(x - 1.0, 3.0); }},
      {"abs", "x (3, 4), |x| in [0.1, 1] (off the kink)", [](CheckContext& c) { return c.away_from_zero({3, 4}); },
       [](const Tensor& x) { return ops::abs(x); }},
      {"tanh", "x (3, 4) in [-2, 2]", [](CheckContext& c) { return c.uniform({3, 4}, -2, 2); },
       [](const Tensor& x) { return ops::tanh(x); }},
      {"sigmoid", "x (3, 4) in [-3, 3]", [](CheckContext& c) { return c.uniform({3, 4}, -3, 3); },
       [](const Tensor& x) { return ops::sigmoid(x); }},
      {"relu", "x (3, 4), |x| in [0.1, 1] (off the kink)", [](CheckContext& c) { return c.away_from_zero({3, 4}); },
       [](const Tensor& x) { return ops::relu(x); }},
      {"gelu", "exact x Phi(x), x (3, 4) in [-3, 3]", [](CheckContext& c) { return c.uniform({3, 4}, -3, 3); },
       [](const Tensor& x) { return ops::gelu(x); }},
      {"gelu-tanh", "tanh approximation, x (3, 4) in [-3, 3]", [](CheckContext& c) { return c.uniform({3, 4}, -3, 3); },
       [](const Tensor& x) { return ops::gelu(x, ops::GeluApprox::tanh); }},
      {"silu", "x sigmoid(x), x (3, 4) in [-6, 6]", [](CheckContext& c) { return c.uniform({3, 4}, -6, 6); },
       [](const Tensor& x) { return ops::silu(x); }},
      {"clamp", "clamp(x, -0.5, 0.5), x (3, 4) in [-1, 1] at least 0.1 from -0.5 and 0.5",
       [](CheckContext& c) { return away_from({3, 4}, c, -1, 1, {-0.5, 0.5}); },
       [](const Tensor& x) { return ops::clamp(x, -0.5, 0.5); }},
  };
  for (const U& u : us) {
    auto f = u.f;
    auto x = u.x;
    op(s, u.name, u.config, [x](CheckContext& c) { return std::vector<Array>{x(c)}; },
       [f](const Inputs& in) { return f(in[0]); }, {"x"});
  }
  sweep(s, "unary-edge-shapes", "neg, exp, tanh, sigmoid on x () (1) (2, 3) (2, 1, 3) in [-2, 2]; x^-1 on (3, 4) in [0.3, 2]",
        [](CheckContext& c) {
          const std::vector<std::pair<const char*, Tensor (*)(const Tensor&)>> fs = {
              {"neg", &ops::neg}, {"exp", &ops::exp}, {"tanh", &ops::tanh}, {"sigmoid", &ops::sigmoid}};
          std::vector<Part> parts;
          for (const Shape& sh : {Shape{}, Shape{1}, Shape{2, 3}, Shape{2, 1, 3}}) {
            const Array x = c.uniform(sh, -2, 2);
            for (const auto& nf : fs) {
              const auto fn = nf.second;
              parts.push_back({std::string(nf.first) + " x " + shape_text(sh), {x},
                               [fn](const Inputs& in) { return fn(in[0]); }, {"x"}});
            }
          }
          parts.push_back({"x^-1 x (3, 4)", {c.uniform({3, 4}, 0.3, 2.0)},
                           [](const Inputs& in) { return ops::pow(in[0], -1.0); }, {"x"}});
          return parts;
        });
}

void reduce(GradcheckSuite& s) {
  op(s, "sum", "x (2, 3, 4), axes {0, 2}", [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 4})}; },
     [](const Inputs& in) { return ops::sum(in[0], {0, 2}); }, {"x"});
  op(s, "mean", "x (2, 3, 4), axis -2, keepdims", [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 4})}; },
     [](const Inputs& in) { return ops::mean(in[0], {-2}, true); }, {"x"});
  op(s, "max", "x (3, 5), axis 1, distinct values 0.1 apart (no ties)",
     [](CheckContext& c) { return std::vector<Array>{distinct({3, 5}, c)}; },
     [](const Inputs& in) { return ops::max(in[0], {1}); }, {"x"});
  op(s, "max-all", "x (2, 3, 2), all axes, distinct values", [](CheckContext& c) { return std::vector<Array>{distinct({2, 3, 2}, c)}; },
     [](const Inputs& in) { return ops::max(in[0]); }, {"x"});
  op(s, "var", "x (3, 5), axis 1, correction 1 (unbiased)", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 5})}; },
     [](const Inputs& in) { return ops::var(in[0], {1}); }, {"x"});
  op(s, "var-population", "x (2, 3, 4), axes {0, 2}, correction 0, keepdims",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 4})}; },
     [](const Inputs& in) { return ops::var(in[0], {0, 2}, 0, true); }, {"x"});
  sweep(s, "sum-mean-axes", "sum and mean of x (2, 1, 3) over 6 axis sets (all, one, negative, several), keepdims or not",
        [](CheckContext& c) {
          const Array x = c.uniform({2, 1, 3});
          std::vector<Part> parts;
          for (const Axes& ax : axis_sets())
            for (bool keep : {false, true}) {
              const std::string where = axes_text(ax) + (keep ? ", keepdims" : "");
              parts.push_back({"sum " + where, {x}, [ax, keep](const Inputs& in) { return ops::sum(in[0], ax, keep); }, {"x"}});
              parts.push_back({"mean " + where, {x}, [ax, keep](const Inputs& in) { return ops::mean(in[0], ax, keep); }, {"x"}});
            }
          return parts;
        });
  sweep(s, "var-axes", "var of x (3, 4) over all axes, axis 0 and axis 1, correction 0 and 1, keepdims",
        [](CheckContext& c) {
          const Array x = c.uniform({3, 4});
          std::vector<Part> parts;
          for (const Axes& ax : {Axes{}, Axes{0}, Axes{1}})
            for (int corr : {0, 1})
              parts.push_back({axes_text(ax) + ", correction " + std::to_string(corr), {x},
                               [ax, corr](const Inputs& in) { return ops::var(in[0], ax, corr, true); }, {"x"}});
          return parts;
        });
  sweep(s, "max-axes", "max of x (2, 3, 4) over 6 axis sets, distinct values 0.1 apart (no ties)", [](CheckContext& c) {
    const Array x = distinct({2, 3, 4}, c);
    std::vector<Part> parts;
    for (const Axes& ax : axis_sets())
      parts.push_back({axes_text(ax), {x}, [ax](const Inputs& in) { return ops::max(in[0], ax); }, {"x"}});
    return parts;
  });
}

void shape_ops(GradcheckSuite& s) {
  auto x234 = [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 4})}; };
  op(s, "reshape", "x (2, 3, 4) -> (4, -1)", x234, [](const Inputs& in) { return ops::reshape(in[0], {4, -1}); }, {"x"});
  op(s, "transpose", "x (2, 3, 4), axes 0 and 2", x234, [](const Inputs& in) { return ops::transpose(in[0], 0, 2); },
     {"x"});
  op(s, "permute", "x (2, 3, 4), dims {2, 0, 1}", x234, [](const Inputs& in) { return ops::permute(in[0], {2, 0, 1}); },
     {"x"});
  op(s, "broadcast_to", "x (3, 1) -> (2, 3, 4)", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 1})}; },
     [](const Inputs& in) { return ops::broadcast_to(in[0], {2, 3, 4}); }, {"x"});
  op(s, "squeeze", "x (3, 1, 4), axis 1", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 1, 4})}; },
     [](const Inputs& in) { return ops::squeeze(in[0], 1); }, {"x"});
  op(s, "unsqueeze", "x (3, 4), axis -1", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 4})}; },
     [](const Inputs& in) { return ops::unsqueeze(in[0], -1) * 2.0; }, {"x"});
}

void join(GradcheckSuite& s) {
  op(s, "concat", "a (2, 1, 3), b (2, 2, 3), c (2, 3, 3) along axis 1",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 1, 3}), c.uniform({2, 2, 3}), c.uniform({2, 3, 3})}; },
     [](const Inputs& in) { return ops::concat({in[0], in[1], in[2]}, 1); }, {"a", "b", "c"});
  op(s, "concat-last-axis", "a (2, 2), b (2, 3) along axis -1",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 2}), c.uniform({2, 3})}; },
     [](const Inputs& in) { return ops::concat({in[0], in[1]}, -1); }, {"a", "b"});
  op(s, "slice", "x (4, 7)[:, -6:7:2]", [](CheckContext& c) { return std::vector<Array>{c.uniform({4, 7})}; },
     [](const Inputs& in) { return ops::slice(in[0], 1, -6, 7, 2); }, {"x"});
  op(s, "split", "x (2, 6) into sizes {1, 3, 2} on axis 1, pieces reordered and one squared",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 6})}; },
     [](const Inputs& in) {
       const auto p = ops::split(in[0], {1, 3, 2}, 1);
       return ops::concat({p[2], p[0] * p[0], p[1]}, 1);
     },
     {"x"});
  op(s, "chunk", "x (6, 2) into 3 chunks on axis 0, combined unevenly",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({6, 2})}; },
     [](const Inputs& in) {
       const auto p = ops::chunk(in[0], 3, 0);
       return p[0] * 2.0 + p[1] * p[2];
     },
     {"x"});
}

void index(GradcheckSuite& s) {
  op(s, "index_select", "x (5, 3), axis 0, idx {4, 0, 4, 2} (a repeat accumulates)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({5, 3})}; },
     [](const Inputs& in) { return ops::index_select(in[0], 0, IndexArray{4, 0, 4, 2}); }, {"x"});
  op(s, "index_select-axis1", "x (4, 3), axis 1, idx {2, 2} (one column twice)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({4, 3})}; },
     [](const Inputs& in) { return ops::index_select(in[0], 1, IndexArray{2, 2}); }, {"x"});
  op(s, "gather", "x (3, 4), axis 1, idx (3, 5) with repeats",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 4})}; },
     [](const Inputs& in) {
       return ops::gather(in[0], 1, IndexArray({3, 5}, {0, 3, 3, 1, 2, 2, 2, 0, 1, 3, 1, 0, 0, 3, 2}));
     },
     {"x"});
  op(s, "embedding", "weight (6, 4), ids (2, 3) with repeats",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({6, 4})}; },
     [](const Inputs& in) { return ops::embedding(in[0], IndexArray({2, 3}, {5, 1, 5, 0, 1, 1})); }, {"weight"});
}

void matmul(GradcheckSuite& s) {
  op(s, "matmul", "a (3, 4) b (4, 5)", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 4}), c.uniform({4, 5})}; },
     [](const Inputs& in) { return ops::matmul(in[0], in[1]); }, {"a", "b"});
  op(s, "linear", "x W + b as one op, x (2, 3, 4) W (4, 5) b (5)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 4}), c.uniform({4, 5}), c.uniform({5})}; },
     [](const Inputs& in) { return ops::linear(in[0], in[1], in[2]); }, {"x", "W", "b"});
  op(s, "matmul-batched", "a (2, 1, 3, 4) b (3, 4, 2): batch dims broadcast",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 1, 3, 4}), c.uniform({3, 4, 2})}; },
     [](const Inputs& in) { return ops::matmul(in[0], in[1]); }, {"a", "b"});
  op(s, "matmul-transposed", "a^T b^T, a (2, 4, 3) b (2, 5, 4)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 4, 3}), c.uniform({2, 5, 4})}; },
     [](const Inputs& in) { return ops::matmul(in[0], in[1], {true, true}); }, {"a", "b"});
  op(s, "matmul-vectors", "v (4) M (4, 3) and N (2, 4) w (4): 1-d operands",
     [](CheckContext& c) {
       return std::vector<Array>{c.uniform({4}), c.uniform({4, 3}), c.uniform({2, 4}), c.uniform({4})};
     },
     [](const Inputs& in) { return ops::concat({ops::matmul(in[0], in[1]), ops::matmul(in[2], in[3])}, 0); },
     {"v", "M", "N", "w"});
  sweep(s, "matmul-broadcasting", "a @ b over 6 shape pairs: plain, a stack of x and one W, one a and a stack of b, both "
        "broadcast, size-1 matrix dims, a stack of matrices times a vector",
        [](CheckContext& c) {
          const std::vector<std::pair<Shape, Shape>> pairs = {{{2, 3}, {3, 4}},       {{5, 2, 3}, {3, 4}},
                                                              {{2, 3}, {5, 3, 4}},    {{2, 1, 2, 3}, {3, 3, 2}},
                                                              {{1, 3}, {2, 3, 1}},    {{4, 2, 3}, {3}}};
          std::vector<Part> parts;
          for (const auto& ab : pairs)
            parts.push_back({"a " + shape_text(ab.first) + " b " + shape_text(ab.second),
                             {c.uniform(ab.first), c.uniform(ab.second)},
                             [](const Inputs& in) { return ops::matmul(in[0], in[1]); }, {"a", "b"}});
          return parts;
        });
  sweep(s, "matmul-transpose-flags", "op(a) (2, 3, 4) @ op(b) (2, 4, 5) for each pair of transpose flags; x (3, 2, 4) "
        "W^T with one W (5, 4)",
        [](CheckContext& c) {
          std::vector<Part> parts;
          for (bool ta : {false, true})
            for (bool tb : {false, true}) {
              const ops::MatmulOptions o{ta, tb};
              parts.push_back({std::string("transpose_a ") + (ta ? "1" : "0") + " transpose_b " + (tb ? "1" : "0"),
                               {c.uniform(ta ? Shape{2, 4, 3} : Shape{2, 3, 4}), c.uniform(tb ? Shape{2, 5, 4} : Shape{2, 4, 5})},
                               [o](const Inputs& in) { return ops::matmul(in[0], in[1], o); }, {"a", "b"}});
            }
          parts.push_back({"x W^T", {c.uniform({3, 2, 4}), c.uniform({5, 4})},
                           [](const Inputs& in) { return ops::matmul(in[0], in[1], {false, true}); }, {"x", "W"}});
          return parts;
        });
}

void softmax_mask(GradcheckSuite& s) {
  op(s, "softmax", "u (2, 4, 3), axis 1 (not the last)", [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 4, 3}, -2, 2)}; },
     [](const Inputs& in) { return ops::softmax(in[0], 1); }, {"u"});
  op(s, "log_softmax", "u (3, 5), axis -1", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 5}, -2, 2)}; },
     [](const Inputs& in) { return ops::log_softmax(in[0], -1); }, {"u"});
  sweep(s, "softmax-axes", "softmax of u (2, 3, 4) in [-2, 2] along axes 0, 1 and -1, of a single score u (1), and "
        "log_softmax along axis 0",
        [](CheckContext& c) {
          const Array u = c.uniform({2, 3, 4}, -2, 2);
          std::vector<Part> parts;
          for (int axis : {0, 1, -1})
            parts.push_back({"softmax axis " + std::to_string(axis), {u},
                             [axis](const Inputs& in) { return ops::softmax(in[0], axis); }, {"u"}});
          parts.push_back({"softmax u (1)", {c.uniform({1})}, [](const Inputs& in) { return ops::softmax(in[0]); }, {"u"}});
          parts.push_back({"log_softmax axis 0", {u}, [](const Inputs& in) { return ops::log_softmax(in[0], 0); }, {"u"}});
          return parts;
        });
  op(s, "add_mask", "softmax(x (3, 5) + bias): -inf and soft biases, each row keeps a finite entry",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 5}, -2, 2)}; },
     [](const Inputs& in) {
       const double ninf = -std::numeric_limits<double>::infinity();
       const Array bias = Array::from_vector({3, 5}, {0, ninf, -1.5, 0, ninf, ninf, ninf, 0.5, ninf, ninf, 0, -3, 0, 0, 2},
                                             in[0].dtype());
       return ops::softmax(ops::add_mask(in[0], bias));
     },
     {"x"});
  op(s, "add_mask-exp", "exp(x (2, 4) + bias): the gradient at -inf is exactly 0",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 4})}; },
     [](const Inputs& in) {
       const double ninf = -std::numeric_limits<double>::infinity();
       return ops::exp(ops::add_mask(in[0], Array::from_vector({4}, {0, ninf, -0.5, 0}, in[0].dtype())));
     },
     {"x"});
  op(s, "masked_fill", "x (3, 4), 5 of 12 filled with 0.5", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 4})}; },
     [](const Inputs& in) {
       return ops::masked_fill(in[0], BoolArray({3, 4}, {1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 1, 0}), 0.5) * in[0];
     },
     {"x"});
}

void nn_ops(GradcheckSuite& s) {
  op(s, "dropout", "x (4, 5), p 0.3, the same mask on every call (generator re-seeded)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({4, 5})}; },
     [](const Inputs& in) {
       Generator g(17);  // a fixed mask: dropout is then a fixed linear map
       return ops::dropout(in[0], 0.3, g, true);
     },
     {"x"});
  op(s, "apply_dropout_mask", "x (3, 4) * m / q, a fixed mask with p 0.5",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 4})}; },
     [](const Inputs& in) {
       Generator g(23);
       return ops::apply_dropout_mask(in[0], ops::dropout_mask(in[0].shape(), 0.5, g, in[0].dtype()));
     },
     {"x"});
  op(s, "layer_norm", "x (3, 6), gamma (6), beta (6), eps 1e-5",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 6}, -2, 2), c.uniform({6}, 0.5, 1.5), c.uniform({6})}; },
     [](const Inputs& in) { return ops::layer_norm(in[0], in[1], in[2]); }, {"x", "gamma", "beta"});
  op(s, "layer_norm-plain", "x (2, 3, 5), no affine part", [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 5}, -2, 2)}; },
     [](const Inputs& in) { return ops::layer_norm(in[0]); }, {"x"});
  op(s, "rms_norm", "x (3, 6), weight (6), eps 1e-5",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 6}, -2, 2), c.uniform({6}, 0.5, 1.5)}; },
     [](const Inputs& in) { return ops::rms_norm(in[0], in[1]); }, {"x", "weight"});
  op(s, "rms_norm-plain", "x (2, 3, 5), no weight", [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 5}, -2, 2)}; },
     [](const Inputs& in) { return ops::rms_norm(in[0]); }, {"x"});
  op(s, "rms_norm-zero-row", "x (3, 5) with row 1 all zeros, weight (5), eps 0.01 (r = 1/sqrt(eps) there)",
     [](CheckContext& c) {
       Array x = c.uniform({3, 5}, -2, 2);
       for (std::size_t j = 0; j < 5; ++j) x.set_flat(5 + j, 0.0);
       return std::vector<Array>{x, c.uniform({5}, 0.5, 1.5)};
     },
     [](const Inputs& in) { return ops::rms_norm(in[0], in[1], 0.01); }, {"x", "weight"});
  op(s, "rms_norm-projection", "larger, random-projection mode; x (2, 4, 32) in [-2, 2], weight (32), eps 1e-6",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 4, 32}, -2, 2), c.uniform({32}, 0.5, 1.5)}; },
     [](const Inputs& in) { return ops::rms_norm(in[0], in[1], 1e-6); }, {"x", "weight"});
  op(s, "swiglu", "silu(a) b, a (3, 4) in [-6, 6], b (3, 4)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 4}, -6, 6), c.uniform({3, 4})}; },
     [](const Inputs& in) { return ops::swiglu(in[0], in[1]); }, {"a", "b"});
  op(s, "swiglu-projection", "larger, random-projection mode; a (2, 8, 24) in [-3, 3], b (2, 8, 24)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 8, 24}, -3, 3), c.uniform({2, 8, 24})}; },
     [](const Inputs& in) { return ops::swiglu(in[0], in[1]); }, {"a", "b"});
  op(s, "cross_entropy", "logits (2, 3, 5), targets (2, 3) with ignore_index -100 and weights",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({2, 3, 5}, -2, 2)}; },
     [](const Inputs& in) {
       ops::CrossEntropyOptions o;
       o.weights = Array::from_vector({2, 3}, {1.0, 0.5, 2.0, 1.0, 1.0, 0.25}, in[0].dtype());
       return ops::cross_entropy(in[0], IndexArray({2, 3}, {4, 0, -100, 2, 2, 1}), o);
     },
     {"logits"});
  op(s, "bias_gelu", "gelu(x + b), one fused op; x (3, 5) in [-3, 3], b (5)",
     [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 5}, -3, 3), c.uniform({5})}; },
     [](const Inputs& in) { return ops::bias_gelu(in[0], in[1]); }, {"x", "b"});
  op(s, "cross_entropy-plain", "logits (4, 6), targets (4)", [](CheckContext& c) { return std::vector<Array>{c.uniform({4, 6}, -2, 2)}; },
     [](const Inputs& in) { return ops::cross_entropy(in[0], IndexArray{5, 0, 3, 3}); }, {"logits"});
  op(s, "mse", "a (3, 4), b (3, 4)", [](CheckContext& c) { return std::vector<Array>{c.uniform({3, 4}), c.uniform({3, 4})}; },
     [](const Inputs& in) { return ops::mse(in[0], in[1]); }, {"a", "b"});
}

}  // namespace

void register_op_checks(GradcheckSuite& s) {
  elementwise(s);
  unary(s);
  reduce(s);
  shape_ops(s);
  join(s);
  index(s);
  matmul(s);
  softmax_mask(s);
  nn_ops(s);
}

}  // namespace xg::checks
