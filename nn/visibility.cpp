#include "nn/visibility.hpp"

#include <cmath>
#include <functional>
#include <limits>

#include "core/error.hpp"
#include "core/kernels.hpp"
#include "ops/mask.hpp"

namespace xg::nn {

namespace {

const char* kOp = "visibility";

// [T, S] -> [1, 1, T, S]; rank 4 kept; anything else is an error.
Shape to_rank4(const Shape& s, const std::string& what) {
  if (s.size() == 2) return {1, 1, s[0], s[1]};
  if (s.size() == 4) return s;
  throw ShapeError(op_message(kOp, what + " must be [T, S] or [B, H, T, S], has shape " + shape_str(s)));
}

Array hard_from_bools(const BoolArray& m, bool true_means_allowed, const std::string& what) {
  const Shape s = to_rank4(m.shape, what);
  Array h = Array::empty(s, DType::float64);
  double* p = h.data<double>();
  for (std::size_t i = 0; i < m.size(); ++i) p[i] = (m.data[i] != 0) == true_means_allowed ? 1.0 : 0.0;
  return h;
}

Array from_function(std::size_t T, std::size_t S, const std::function<bool(std::size_t, std::size_t)>& ok) {
  Array h = Array::empty({1, 1, T, S}, DType::float64);
  double* p = h.data<double>();
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j < S; ++j) p[i * S + j] = ok(i, j) ? 1.0 : 0.0;
  return h;
}

}  // namespace

Visibility Visibility::all() { return Visibility(); }

Visibility Visibility::allowed(const BoolArray& m) {
  Visibility v;
  v.hard_ = hard_from_bools(m, true, "allowed mask");
  return v;
}

Visibility Visibility::forbidden(const BoolArray& m) {
  Visibility v;
  v.hard_ = hard_from_bools(m, false, "forbidden mask");
  return v;
}

Visibility Visibility::additive(const Array& bias) {
  const Shape s = to_rank4(bias.shape(), "additive bias");
  const auto b = bias.to_vector();
  Visibility v;
  v.hard_ = Array::empty(s, DType::float64);
  v.soft_ = Array::empty(s, DType::float64);
  ops::check_additive_bias(kOp, bias);
  for (std::size_t i = 0; i < b.size(); ++i) {
    const bool forbid = std::isinf(b[i]);
    v.hard_.set_flat(i, forbid ? 0.0 : 1.0);
    v.soft_.set_flat(i, forbid ? 0.0 : b[i]);
  }
  return v;
}

Visibility Visibility::causal(const std::vector<std::int64_t>& q_pos, const std::vector<std::int64_t>& k_pos) {
  Visibility v;
  v.hard_ = from_function(q_pos.size(), k_pos.size(),
                          [&](std::size_t i, std::size_t j) { return k_pos[j] <= q_pos[i]; });
  return v;
}

Visibility Visibility::causal(std::size_t T, std::size_t S) {
  if (T > S)
    throw ShapeError(op_message(kOp, "causal(T, S) aligns T queries with the last T of S keys; T (" +
                                         std::to_string(T) + ") exceeds S (" + std::to_string(S) +
                                         "). Pass absolute positions for other layouts"));
  std::vector<std::int64_t> q(T), k(S);
  for (std::size_t j = 0; j < S; ++j) k[j] = static_cast<std::int64_t>(j);
  for (std::size_t i = 0; i < T; ++i) q[i] = static_cast<std::int64_t>(S - T + i);
  return causal(q, k);
}

Visibility Visibility::key_lengths(const std::vector<std::size_t>& lengths, std::size_t S) {
  BoolArray valid = BoolArray::filled({lengths.size(), S}, false);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] > S)
      throw ShapeError(op_message(kOp, "key length " + std::to_string(lengths[b]) + " of sample " +
                                           std::to_string(b) + " exceeds S (" + std::to_string(S) + ")"));
    for (std::size_t j = 0; j < lengths[b]; ++j) valid.data[b * S + j] = 1;
  }
  return valid_keys(valid);
}

Visibility Visibility::valid_keys(const BoolArray& valid) {
  if (valid.shape.size() != 2)
    throw ShapeError(op_message(kOp, "key mask must be [B, S], has shape " + shape_str(valid.shape)));
  return allowed(BoolArray({valid.shape[0], 1, 1, valid.shape[1]}, valid.data));
}

Visibility Visibility::padded_keys(const BoolArray& padding) {
  if (padding.shape.size() != 2)
    throw ShapeError(op_message(kOp, "key mask must be [B, S], has shape " + shape_str(padding.shape)));
  return forbidden(BoolArray({padding.shape[0], 1, 1, padding.shape[1]}, padding.data));
}

Visibility Visibility::documents(const IndexArray& doc_ids) {
  const Shape& s = doc_ids.shape;
  if (s.size() != 1 && s.size() != 2)
    throw ShapeError(op_message(kOp, "document ids must be [T] or [B, T], have shape " + shape_str(s)));
  const std::size_t B = s.size() == 2 ? s[0] : 1, T = s.back();
  BoolArray m = BoolArray::filled({B, 1, T, T}, false);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = 0; i < T; ++i)
      for (std::size_t j = 0; j <= i; ++j)
        m.data[(b * T + i) * T + j] = doc_ids.data[b * T + i] == doc_ids.data[b * T + j];
  return allowed(m);
}

Visibility Visibility::operator&(const Visibility& o) const {
  Visibility v;
  auto combine = [](const Array& a, const Array& b, bool multiply) {
    if (!a.defined()) return b;
    if (!b.defined()) return a;
    broadcast_shapes(kOp, "left visibility", a.shape(), "right visibility", b.shape());
    return multiply ? kernels::mul(a, b) : kernels::add(a, b);
  };
  v.hard_ = combine(hard_, o.hard_, true);   // intersection of allowed sets
  v.soft_ = combine(soft_, o.soft_, false);  // soft biases add
  return v;
}

Shape Visibility::shape() const {
  if (hard_.defined() && soft_.defined())
    return broadcast_shapes(kOp, "hard mask", hard_.shape(), "soft bias", soft_.shape());
  if (hard_.defined()) return hard_.shape();
  if (soft_.defined()) return soft_.shape();
  return {1, 1, 1, 1};
}

Array Visibility::bias(DType dtype) const {
  const Shape s = shape();
  const Array h = hard_.defined() ? kernels::broadcast_to(hard_, s) : Array::full(s, 1.0, DType::float64);
  const Array b = soft_.defined() ? kernels::broadcast_to(soft_, s) : Array::zeros(s, DType::float64);
  Array out = Array::empty(s, dtype);
  for (std::size_t i = 0; i < out.size(); ++i)
    out.set_flat(i, h.flat(i) != 0.0 ? b.flat(i) : -std::numeric_limits<double>::infinity());
  return out;
}

std::vector<unsigned char> Visibility::expand_allowed(const std::string& op, const Shape& BHTS) const {
  const Shape s = shape();
  Shape b;
  try {
    b = broadcast_shapes(op, "visibility", s, "scores", BHTS);
  } catch (const ShapeError&) {
    b.clear();
  }
  if (b != BHTS)
    throw ShapeError(op_message(op, "visibility of shape " + shape_str(s) +
                                        " does not broadcast to the scores' shape [B, H_q, T, S] = " +
                                        shape_str(BHTS)));
  std::vector<unsigned char> out(numel(BHTS), 1);
  if (!hard_.defined()) return out;
  const Array h = kernels::broadcast_to(hard_, BHTS);
  const double* p = h.data<double>();
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i] != 0.0;
  return out;
}

BoolArray valid_queries_from_lengths(const std::vector<std::size_t>& lengths, std::size_t T) {
  BoolArray v = BoolArray::filled({lengths.size(), T}, false);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] > T)
      throw ShapeError(op_message("visibility", "query length " + std::to_string(lengths[b]) + " of sample " +
                                                    std::to_string(b) + " exceeds T (" + std::to_string(T) + ")"));
    for (std::size_t i = 0; i < lengths[b]; ++i) v.data[b * T + i] = 1;
  }
  return v;
}

}  // namespace xg::nn
