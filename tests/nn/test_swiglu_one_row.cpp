// SwiGLUFeedForward's one-row path (nn/layers.cpp): decoding's gate and up projections as one
// blas::row_products call, against the op-by-op path (gate(x), up(x), swiglu, down) on the same
// layer, bit for bit (the same kernel and chains for each product); the path runs only where it
// may (no gradient wanted, float32, one row, no adapter), the op-by-op path otherwise.
#include <catch2/catch.hpp>

#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/random.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/nn/layers.hpp>
#include <xgrad/ops/unary.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;
using xgt::same_bits;

TEST_CASE("SwiGLU feed-forward: one row without gradients runs gate and up as one product", "[swiglu_one_row]") {
  Generator gen(5);
  nn::SwiGLUFeedForward ffn(96, 256, gen, DType::float32);
  const Tensor x(random_normal({1, 1, 96}, gen, DType::float32));
  NoGradGuard ng;
  const std::uint64_t before = blas::row_products_calls();
  const Tensor fused = ffn(x);
  CHECK(blas::row_products_calls() == before + 1);
  const Tensor op_by_op = ffn.down(ops::swiglu(ffn.gate(x), ffn.up(x)));
  CHECK(blas::row_products_calls() == before + 1);
  CHECK(fused.shape() == Shape{1, 1, 96});
  CHECK(same_bits(fused.value(), op_by_op.value()));
}

TEST_CASE("SwiGLU feed-forward: the op-by-op path where the one-row path may not run", "[swiglu_one_row]") {
  Generator gen(6);
  nn::SwiGLUFeedForward ffn(32, 64, gen, DType::float32);
  const Tensor two_rows(random_normal({2, 32}, gen, DType::float32));
  const Tensor one_row(random_normal({1, 32}, gen, DType::float32));
  const std::uint64_t before = blas::row_products_calls();
  {
    NoGradGuard ng;
    (void)ffn(two_rows);  // two rows
  }
  const Tensor y = ffn(one_row);  // gradients wanted (the weights require them)
  CHECK(y.requires_grad());
  nn::SwiGLUFeedForward f64(32, 64, gen, DType::float64);
  {
    NoGradGuard ng;
    (void)f64(Tensor(random_normal({1, 32}, gen, DType::float64)));  // float64
  }
  CHECK(blas::row_products_calls() == before);
}
