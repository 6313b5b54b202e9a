// operator<< on Arrays and Tensors (core/array.hpp, core/tensor.hpp): values, and for a Tensor
// its dtype, whether it needs a gradient, its name, the op it came from, and the undefined Tensor.
#include <sstream>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

TEST_CASE("printing: operator<< prints Arrays and Tensors", "[core][printing]") {
  std::ostringstream a;
  a << Array::of({{1.0, 2.5}, {-3.0, 4.0}});
  CHECK(a.str() == Array::of({{1.0, 2.5}, {-3.0, 4.0}}).str());
  CHECK(a.str().find("2.5") != std::string::npos);

  std::ostringstream leaf, out, plain, undef;
  Tensor x(Array::of({1.0, 2.0}), true);
  x.set_name("x");
  leaf << x;
  CHECK(leaf.str() == "tensor(" + x.value().str() + ", dtype=float64, requires_grad=true, name=x)");
  out << ops::sum(x);
  CHECK(out.str() == "tensor(3, dtype=float64, grad_fn=sum)");
  plain << Tensor(Array::of({1.0}, DType::float32));
  CHECK(plain.str() == "tensor(" + Array::of({1.0}, DType::float32).str() + ", dtype=float32)");
  undef << Tensor();
  CHECK(undef.str() == "tensor(<undefined>)");
}
