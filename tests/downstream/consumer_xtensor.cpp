// A user's program that includes the optional <xgrad/xtensor.hpp> (tests/downstream/run.sh
// builds it against the installed package, linking xtensor itself): Arrays and Tensors from
// xtensor expressions, zero-copy views both ways, the dtype error. Exit status 0 only when all
// of it holds; every failure prints one line saying which property broke.
#include <iostream>
#include <string>

#include <xtensor/xarray.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xview.hpp>

#include <xgrad/xgrad.hpp>
#include <xgrad/xtensor.hpp>

#include "expect.hpp"

using namespace xg;

using consumer::expect;
using consumer::failures;

int main() {
  const xt::xarray<double> a = {{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}};
  const Array t = from_xtensor(xt::transpose(a) * 2.0);  // a lazy expression over a strided view
  expect(t.shape() == Shape{3, 2} && t.to_vector() == std::vector<double>{2, 8, 4, 10, 6, 12},
         "from_xtensor evaluates a lazy expression over a transposed view in row-major order");

  Array owned = Array::zeros({2, 3}, DType::float32);
  auto v = as_xtensor<float>(owned);
  v = xt::view(a, xt::all(), xt::all()) + 0.5;
  expect(owned.to_vector() == std::vector<double>{1.5, 2.5, 3.5, 4.5, 5.5, 6.5},
         "a writable view writes into the Array (float32, converted from a float64 expression)");
  owned.set_flat(0, -1.0);
  expect(v(0, 0) == -1.0f, "the view sees writes through the Array (shared memory)");

  Tensor x = tensor_from_xtensor(a, true);
  ops::sum(x * x).backward();
  const auto g = as_xtensor<double>(x.grad());
  expect(g(1, 2) == 12.0 && g.data() == x.grad().data<double>(), "a gradient read through a zero-copy view");

  bool refused = false;
  try {
    (void)as_xtensor<double>(owned);
  } catch (const DTypeError& e) {
    refused = std::string(e.what()).find("float32") != std::string::npos;
  }
  expect(refused, "a view of the wrong dtype is a DTypeError naming the array's dtype");

  if (failures) std::cout << failures << " failure(s)\n";
  return failures ? 1 : 0;
}
