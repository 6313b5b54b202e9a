// <xgrad/xtensor.hpp>: Arrays as zero-copy xtensor views, and Arrays and Tensors from any
// xtensor expression (containers of either layout, strided and transposed views, lazy
// expressions), float32 and float64, with errors on the wrong dtype.
// GCC 12 warns inside its own AVX-512 intrinsics that xsimd reaches from xtensor's assignments
// under -march=native (-Wmaybe-uninitialized false positives; ops/unary.cpp gets the same).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include <catch2/catch.hpp>
#include <vector>

#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xmanipulation.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include <xgrad/xgrad.hpp>
#include <xgrad/xtensor.hpp>

using namespace xg;

namespace {

// The row-major values of an xtensor expression, as doubles, read element by element through
// its own indexing (not its storage), so layouts and views are read by their meaning.
template <class E> std::vector<double> values_of(const E& e) {
  std::vector<double> out;
  const auto shape = e.shape();
  const std::size_t n = e.size();
  std::vector<std::size_t> idx(shape.size(), 0);
  for (std::size_t k = 0; k < n; ++k) {
    out.push_back(static_cast<double>(e.element(idx.begin(), idx.end())));
    for (std::size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("xtensor door: an xt::xarray round-trips through an Array in float64 and float32", "[core][xtensor]") {
  const xt::xarray<double> a = {{1.5, -2.0, 3.25}, {4.0, 5.5, -6.75}};
  const Array arr = from_xtensor(a);
  CHECK(arr.dtype() == DType::float64);
  CHECK(arr.shape() == Shape{2, 3});
  CHECK(arr.to_vector() == std::vector<double>{1.5, -2.0, 3.25, 4.0, 5.5, -6.75});
  const xt::xarray<double> back = as_xtensor<double>(arr);
  CHECK(back == a);

  const xt::xtensor<float, 3> f = {{{1.f, 2.f}}, {{3.f, 4.f}}};
  const Array arr32 = from_xtensor(f);
  CHECK(arr32.dtype() == DType::float32);
  CHECK(arr32.shape() == Shape{2, 1, 2});
  CHECK(arr32.to_vector() == std::vector<double>{1, 2, 3, 4});
  const xt::xtensor<float, 3> back32 = as_xtensor<float>(arr32);
  CHECK(back32 == f);
}

TEST_CASE("xtensor door: a mutable view shares the Array's memory both ways", "[core][xtensor]") {
  Array a = Array::zeros({2, 3}, DType::float64);
  auto v = as_xtensor<double>(a);
  CHECK(v.data() == a.data<double>());
  v(1, 2) = 7.5;               // write through the view ...
  CHECK(a.at({1, 2}) == 7.5);  // ... the Array sees it
  a.set_flat(1, -3.0);         // write through the Array ...
  CHECK(v(0, 1) == -3.0);      // ... the view sees it
  // A lazy expression assigned into the view lands in the Array.
  v = 2.0 * xt::ones<double>({2, 3}) + v;
  CHECK(a.to_vector() == std::vector<double>{2, -1, 2, 2, 2, 9.5});
  // Arrays sharing the data (copies, reshape views) see writes through the view as well.
  const Array shared = a;
  const Array flat = a.view({6});
  v(0, 0) = 42.0;
  CHECK(shared.flat(0) == 42.0);
  CHECK(flat.flat(0) == 42.0);

  Array f = Array::zeros({3}, DType::float32);
  auto vf = as_xtensor<float>(f);
  vf(2) = 0.25f;
  CHECK(f.flat(2) == 0.25);
}

TEST_CASE("xtensor door: a read-only view of an Array or a Tensor copies nothing and has its shape", "[core][xtensor]") {
  const Array a = Array::of({{1, 2, 3}, {4, 5, 6}}, DType::float64);
  const auto v = as_xtensor<double>(a);
  CHECK(v.data() == a.data<double>());
  CHECK(v.dimension() == 2);
  CHECK(v.shape()[0] == 2);
  CHECK(v.shape()[1] == 3);
  CHECK(v.strides()[0] == 3);  // row-major
  CHECK(v.strides()[1] == 1);
  CHECK(v(1, 0) == 4.0);

  // A Tensor's value and its gradient, after backward.
  const Tensor t(a, true);
  ops::sum(t * t).backward();
  const auto g = as_xtensor<double>(t.grad());
  CHECK(values_of(g) == std::vector<double>{2, 4, 6, 8, 10, 12});
  const auto tv = as_xtensor<double>(t);
  CHECK(tv.data() == t.value().data<double>());
  CHECK(tv(1, 2) == 6.0);

  // 0-d and empty arrays.
  const Array s = Array::scalar(2.5, DType::float32);
  const auto sv = as_xtensor<float>(s);
  CHECK(sv.dimension() == 0);
  CHECK(sv() == 2.5f);
  const Array e = Array::zeros({0, 4}, DType::float64);
  CHECK(as_xtensor<double>(e).size() == 0);
  CHECK(from_xtensor(as_xtensor<double>(e)).shape() == Shape{0, 4});
}

TEST_CASE("xtensor door: strided and transposed views are read by meaning and stay views", "[core][xtensor]") {
  // A transposed view of an Array's view shares its memory: writing through it writes the
  // Array at the transposed index.
  Array a = Array::of({{1, 2, 3}, {4, 5, 6}}, DType::float64);
  auto v = as_xtensor<double>(a);
  auto tr = xt::transpose(v);
  CHECK(tr.shape()[0] == 3);
  CHECK(tr(2, 1) == 6.0);
  tr(2, 0) = -1.0;
  CHECK(a.at({0, 2}) == -1.0);

  // Arrays from non-contiguous expressions hold the values in row-major order.
  const Array at = from_xtensor(tr);
  CHECK(at.shape() == Shape{3, 2});
  CHECK(at.to_vector() == std::vector<double>{1, 4, 2, 5, -1, 6});

  const xt::xarray<double> big = xt::arange<double>(24.0).reshape({4, 6});
  const auto strided = xt::view(big, xt::range(1, 4, 2), xt::range(0, 6, 3));  // rows 1, 3; columns 0, 3
  const Array st = from_xtensor(strided);
  CHECK(st.shape() == Shape{2, 2});
  CHECK(st.to_vector() == std::vector<double>{6, 9, 18, 21});

  const auto col = xt::view(big, xt::all(), 2);  // a column: stride 6
  CHECK(from_xtensor(col).to_vector() == std::vector<double>{2, 8, 14, 20});

  // A column-major container is read by index, not by storage order.
  xt::xarray<float, xt::layout_type::column_major> cm = {{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}};
  CHECK(cm.data()[1] == 4.f);  // storage order differs from row-major
  const Array fromcm = from_xtensor(cm);
  CHECK(fromcm.dtype() == DType::float32);
  CHECK(fromcm.to_vector() == std::vector<double>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("xtensor door: lazy expressions become Arrays and Tensors with their broadcast shape", "[core][xtensor]") {
  const xt::xarray<double> a = {{1.0, 2.0}, {3.0, 4.0}};
  const xt::xarray<double> b = {10.0, 20.0};
  const Array sum = from_xtensor(a + 2.0 * b);  // b broadcasts along the rows
  CHECK(sum.shape() == Shape{2, 2});
  CHECK(sum.to_vector() == std::vector<double>{21, 42, 23, 44});
  const Array e = from_xtensor(xt::abs(xt::view(a, 0, xt::all()) - 3.0) * b);
  CHECK(e.shape() == Shape{2});
  CHECK(e.to_vector() == std::vector<double>{20, 20});

  // A Tensor leaf from an expression, with gradients flowing to it.
  const Tensor t = tensor_from_xtensor(a * a, true);
  CHECK(t.requires_grad());
  CHECK(t.dtype() == DType::float64);
  ops::sum(t * 3.0).backward();
  CHECK(t.grad().to_vector() == std::vector<double>{3, 3, 3, 3});
  CHECK(values_of(as_xtensor<double>(t)) == std::vector<double>{1, 4, 9, 16});

  // An Array's view takes part in xtensor expressions like any container.
  const Array x = Array::of({1, 2, 3}, DType::float32);
  const xt::xarray<float> y = as_xtensor<float>(x) * 2.f + 1.f;
  CHECK(values_of(y) == std::vector<double>{3, 5, 7});
}

TEST_CASE("xtensor door: an explicit dtype converts (integer expressions included)", "[core][xtensor]") {
  const xt::xarray<double> a = {0.1, 0.2};
  const Array f = from_xtensor(a, DType::float32);
  CHECK(f.dtype() == DType::float32);
  CHECK(f.to_vector() == std::vector<double>{static_cast<float>(0.1), static_cast<float>(0.2)});
  const xt::xarray<int> ints = {{1, -2}, {3, 4}};
  const Array d = from_xtensor(ints, DType::float64);
  CHECK(d.dtype() == DType::float64);
  CHECK(d.to_vector() == std::vector<double>{1, -2, 3, 4});
  const Tensor t = tensor_from_xtensor(ints + 1, DType::float32, true);
  CHECK(t.dtype() == DType::float32);
  CHECK(t.requires_grad());
  CHECK(t.value().to_vector() == std::vector<double>{2, -1, 4, 5});
}

TEST_CASE("xtensor door: a view of the wrong dtype or of an undefined Array is an error naming both", "[core][xtensor][errors]") {
  Array a64 = Array::zeros({2}, DType::float64);
  const Array a32 = Array::zeros({2}, DType::float32);
  CHECK_THROWS_AS(as_xtensor<float>(a64), DTypeError);
  CHECK_THROWS_WITH(as_xtensor<float>(a64),
                    Catch::Contains("[as_xtensor]") && Catch::Contains("float64") && Catch::Contains("float32") &&
                        Catch::Contains("as_xtensor<double>"));
  CHECK_THROWS_AS(as_xtensor<double>(a32), DTypeError);
  CHECK_THROWS_WITH(as_xtensor<double>(a32), Catch::Contains("the array is float32") && Catch::Contains("as_xtensor<float>"));
  CHECK_THROWS_AS(as_xtensor<double>(Tensor(a32)), DTypeError);
  Array undefined;
  CHECK_THROWS_AS(as_xtensor<double>(undefined), ValueError);
  CHECK_THROWS_WITH(as_xtensor<double>(undefined), Catch::Contains("[as_xtensor]") && Catch::Contains("undefined"));
  CHECK_THROWS_WITH(as_xtensor<float>(Tensor()), Catch::Contains("[as_xtensor]") && Catch::Contains("undefined"));
  const xt::xarray<double> x = {1.0};
  CHECK_THROWS_AS(from_xtensor(x, static_cast<DType>(7)), DTypeError);
  CHECK_THROWS_WITH(from_xtensor(x, static_cast<DType>(7)), Catch::Contains("[from_xtensor]") && Catch::Contains("float32 or float64"));
}
