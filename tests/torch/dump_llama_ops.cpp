// dump_llama_ops: the xgrad half of the PyTorch cross-check of the Llama-block ops
// (tests/torch/llama_ops_crosscheck.py), float64.
//
// Writes ONE JSON file (argv[1]) of cases, each with its inputs, a random output cotangent G,
// xgrad's output and the gradients of L = sum(G * output):
//   rms_norm  ops::rms_norm(x, weight, eps), with and without a weight, rows of zeros, large
//             and small scales;
//   silu      ops::silu(x), including x far below the point where e^-x overflows;
//   swiglu    ops::swiglu(a, b) = silu(a) * b.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "tests/support/json_text.hpp"
#include <xgrad/xgrad.hpp>

using namespace xg;
using namespace xgt::json_text;

namespace {

Array uniform(const Shape& s, Generator& g, double lo, double hi) { return random_uniform(s, g, DType::float64, lo, hi); }

std::string rms_case(Generator& g, const Shape& shape, bool weighted, double eps, double scale, std::size_t zero_rows) {
  Array xv = uniform(shape, g, -scale, scale);
  const std::size_t D = shape.back();
  for (std::size_t i = 0; i < zero_rows * D && i < xv.size(); ++i) xv.set_flat(i, 0.0);
  const Tensor x(xv, true);
  const Tensor w = weighted ? Tensor(uniform({D}, g, -1.5, 1.5), true) : Tensor();
  const Array G = uniform(shape, g, -1, 1);
  const Tensor y = ops::rms_norm(x, w, eps);
  std::vector<Tensor> wrt{x};
  if (weighted) wrt.push_back(w);
  const std::vector<Array> d = grad(y, wrt, G);
  std::string s = "{\"kind\":\"rms_norm\",\"eps\":" + jnum(eps) + ",\"x\":" + jarray(x.value()) + ",\"G\":" + jarray(G) +
                  ",\"y\":" + jarray(y.value()) + ",\"dx\":" + jarray(d[0]);
  if (weighted) s += ",\"weight\":" + jarray(w.value()) + ",\"dweight\":" + jarray(d[1]);
  return s + "}";
}

std::string silu_case(Generator& g, const Array& xv) {
  const Tensor x(xv, true);
  const Array G = uniform(xv.shape(), g, -1, 1);
  const Tensor y = ops::silu(x);
  const Array dx = grad(y, {x}, G)[0];
  return "{\"kind\":\"silu\",\"x\":" + jarray(x.value()) + ",\"G\":" + jarray(G) + ",\"y\":" + jarray(y.value()) +
         ",\"dx\":" + jarray(dx) + "}";
}

std::string swiglu_case(Generator& g, const Shape& shape, double range) {
  const Tensor a(uniform(shape, g, -range, range), true), b(uniform(shape, g, -2, 2), true);
  const Array G = uniform(shape, g, -1, 1);
  const Tensor y = ops::swiglu(a, b);
  const std::vector<Array> d = grad(y, {a, b}, G);
  return "{\"kind\":\"swiglu\",\"a\":" + jarray(a.value()) + ",\"b\":" + jarray(b.value()) + ",\"G\":" + jarray(G) +
         ",\"y\":" + jarray(y.value()) + ",\"da\":" + jarray(d[0]) + ",\"db\":" + jarray(d[1]) + "}";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && std::string(argv[2]) == "automatic")) {
    std::fprintf(stderr, "usage: dump_llama_ops OUT.json\n");
    return 2;
  }
  try {
    Generator g(20261219);
    std::vector<std::string> cases;
    cases.push_back(rms_case(g, {2, 5, 8}, true, 1e-5, 2.0, 0));
    cases.push_back(rms_case(g, {3, 288}, true, 1e-6, 1.0, 1));   // stories15M's width; one row of zeros
    cases.push_back(rms_case(g, {4, 7}, false, 1e-5, 3.0, 2));    // no weight; two rows of zeros
    cases.push_back(rms_case(g, {2, 3, 16}, true, 1e-5, 1e-3, 0));  // mean square ~ eps: eps matters
    cases.push_back(rms_case(g, {5, 64}, true, 0.5, 1e4, 0));      // large x, large eps
    cases.push_back(silu_case(g, uniform({3, 50}, g, -30, 30)));
    cases.push_back(silu_case(  // silu' = 0 near -1.2785 (its minimum)
        g, Array::from_vector({9}, {-700, -100, -50, -1.2784645427610738, -1e-8, 0, 1e-8, 50, 700}, DType::float64)));
    cases.push_back(swiglu_case(g, {2, 6, 16}, 8.0));
    cases.push_back(swiglu_case(g, {4, 96}, 40.0));
    std::FILE* f = std::fopen(argv[1], "w");
    if (!f) throw FormatError(std::string("dump_llama_ops: cannot write ") + argv[1]);
    std::string out = "{\"cases\":[";
    for (std::size_t i = 0; i < cases.size(); ++i) out += (i ? "," : "") + cases[i];
    out += "]}\n";
    const bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
    if (std::fclose(f) != 0 || !ok) throw FormatError(std::string("dump_llama_ops: writing ") + argv[1] + " failed");
    std::printf("dump_llama_ops: %zu cases -> %s\n", cases.size(), argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_llama_ops: %s\n", e.what());
    return 1;
  }
  return 0;
}
