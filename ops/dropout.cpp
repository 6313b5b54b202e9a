// Forward (SPEC 2):  y = x * m / q,  m ~ Bernoulli(q), q = 1 - p
// VJP:               x_bar = g * m / q  (the mask saved by the forward pass)
// Second-order rule:  the same mask applied to the recorded cotangent (apply_dropout_mask).
#include <xgrad/ops/dropout.hpp>

#include <xgrad/core/check.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>

namespace xg::ops {

namespace {

thread_local std::size_t tl_row_offset = 0;

// The VJP as a named type: the second-order rule reads the mask from it.
struct DropoutVjp {
  Array scaled_mask;
  Cotangents operator()(const VjpContext& c) const { return Cotangents{kernels::mul(c.grad_output, scaled_mask)}; }
};

}  // namespace

DropoutRowOffset::DropoutRowOffset(std::size_t offset) : prev_(tl_row_offset) { tl_row_offset = offset; }
DropoutRowOffset::~DropoutRowOffset() { tl_row_offset = prev_; }
std::size_t dropout_row_offset() { return tl_row_offset; }

bool dropout_keep(std::uint64_t seed, std::uint64_t flat, double p) {
  return dropout_keep_bits(seed, flat, dropout_keep_threshold(p));
}

Array dropout_mask_from_seed(const std::string& op, const std::string& p_name, const Shape& shape, double p,
                             std::uint64_t seed, DType dtype, std::size_t row_offset) {
  if (!(p >= 0.0 && p < 1.0))  // p = 1: everything zeroed, scaled by 1 / (1 - p) = inf
    throw ValueError(op_message(op, p_name + " must be in [0, 1), got " + std::to_string(p)));
  Array m = Array::empty(shape, dtype);
  const std::size_t n = m.size();
  // Position in the global batch: rows of dimension 0 start at the row offset.
  const std::uint64_t base = shape.empty() || n == 0 ? 0 : row_offset * (n / shape[0]);
  detail::dispatch(dtype, [&](auto t) {
    using T = decltype(t);
    dropout_draw<T>(seed, base, dropout_keep_threshold(p), static_cast<T>(1.0 / (1.0 - p)), nullptr, m.data<T>(), n);
  });
  return m;
}

Array dropout_mask(const Shape& shape, double p, Generator& gen, DType dtype) {
  if (!(p >= 0.0 && p < 1.0))  // checked before drawing the seed: a refused call leaves gen alone
    throw ValueError(op_message("dropout", "p must be in [0, 1), got " + std::to_string(p)));
  return dropout_mask_from_seed("dropout", "p", shape, p, gen.next_u64(), dtype, dropout_row_offset());
}

Tensor apply_dropout_mask(const Tensor& x, const Array& scaled_mask) {
  check::defined("dropout", "x", x);
  check::same_shape("dropout", "x", x.shape(), "mask", scaled_mask.shape());
  if (scaled_mask.dtype() != x.dtype())
    throw DTypeError(op_message("dropout", std::string("mask is ") + dtype_name(scaled_mask.dtype()) +
                                               ", x is " + dtype_name(x.dtype())));
  return record("dropout", kernels::mul(x.value(), scaled_mask), {x}, DropoutVjp{scaled_mask},
                second_order([](const DiffVjpContext& c) {
                  return DiffCotangents{apply_dropout_mask(c.grad_output, c.first_order_as<DropoutVjp>().scaled_mask)};
                }));
}

Tensor dropout(const Tensor& x, double p, Generator& gen, bool training) {
  check::defined("dropout", "x", x);
  if (!(p >= 0.0 && p < 1.0))  // p = 1: everything zeroed, scaled by 1 / (1 - p) = inf
    throw ValueError(op_message("dropout", "p must be in [0, 1), got " + std::to_string(p)));
  if (!training || p == 0.0) return x;
  return apply_dropout_mask(x, dropout_mask(x.shape(), p, gen, x.dtype()));
}

}  // namespace xg::ops
