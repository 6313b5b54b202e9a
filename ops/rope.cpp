// Rotary position embedding (see ops/rope.hpp for the definition). Per position p and pair k,
// the angle theta = p * base^(-2k/r) is computed in double; the forward rotates (x_a, x_b)
// by theta, the VJP rotates the cotangent (g_a, g_b) by -theta:
//   x_bar_a =  g_a cos + g_b sin,   x_bar_b = -g_a sin + g_b cos
// Second-order rule: that rotation as a recorded op (rope_rotate), whose VJP rotates back.
#include <xgrad/ops/rope.hpp>

#include <cmath>
#include <memory>

#include <xgrad/core/check.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/core/error.hpp>

namespace xg::ops {

namespace {

const char* kOp = "rope";

// cos and sin of every (position, pair), [T, r/2] each.
struct Angles {
  std::size_t T = 0, half = 0;
  std::vector<double> c, s;
};

std::shared_ptr<Angles> compute_angles(const std::vector<std::int64_t>& pos, std::size_t r, double base);

// The angles of the last short call (at most kReuse positions: decoding steps) on this thread are
// reused when the positions, r and base are the same (the Q and K of every layer of a step share
// them: a decoding step computes them once, not twice per layer). Angles are never changed once
// made; a reused one is the same values. Longer calls compute theirs (nothing large is kept).
constexpr std::size_t kReuse = 64;
std::shared_ptr<Angles> angles(const std::vector<std::int64_t>& pos, std::size_t r, double base) {
  struct Last {
    std::vector<std::int64_t> pos;
    std::size_t r = 0;
    double base = 0;
    std::shared_ptr<Angles> a;
  };
  thread_local Last last;
  if (pos.size() > kReuse) return compute_angles(pos, r, base);
  if (last.a && last.r == r && last.base == base && last.pos == pos) return last.a;
  last.a = compute_angles(pos, r, base);
  last.pos = pos;
  last.r = r;
  last.base = base;
  return last.a;
}

std::shared_ptr<Angles> compute_angles(const std::vector<std::int64_t>& pos, std::size_t r, double base) {
  auto a = std::make_shared<Angles>();
  a->T = pos.size();
  a->half = r / 2;
  a->c.resize(a->T * a->half);
  a->s.resize(a->T * a->half);
  for (std::size_t k = 0; k < a->half; ++k) {
    const double inv_freq = std::pow(base, -2.0 * static_cast<double>(k) / static_cast<double>(r));
    for (std::size_t t = 0; t < a->T; ++t) {
      const double theta = static_cast<double>(pos[t]) * inv_freq;
      a->c[t * a->half + k] = std::cos(theta);
      a->s[t * a->half + k] = std::sin(theta);
    }
  }
  return a;
}

// Rotates every row of `in` (rows of width w, row index mod T is the position) by sign * theta
// into `out`: the first `heads` runs of d features each as one head (features r .. d-1 of a
// head copied), features heads * d .. w-1 copied. rope() has w = d and one head.
template <class T>
void rotate(const T* in, T* out, std::size_t rows, std::size_t w, std::size_t heads, std::size_t d, std::size_t r,
            RopeLayout layout, const Angles& a, double sign) {
  const std::size_t half = r / 2;
  for (std::size_t row = 0; row < rows; ++row) {
    const std::size_t t = row % a.T;
    for (std::size_t h = 0; h < heads; ++h) {
      const T* x = in + row * w + h * d;
      T* y = out + row * w + h * d;
      for (std::size_t k = 0; k < half; ++k) {
        const std::size_t ia = layout == RopeLayout::interleaved ? 2 * k : k;
        const std::size_t ib = layout == RopeLayout::interleaved ? 2 * k + 1 : k + half;
        const T c = static_cast<T>(a.c[t * half + k]), s = static_cast<T>(sign * a.s[t * half + k]);
        const T xa = x[ia], xb = x[ib];
        y[ia] = xa * c - xb * s;
        y[ib] = xa * s + xb * c;
      }
      for (std::size_t j = r; j < d; ++j) y[j] = x[j];
    }
    for (std::size_t j = heads * d; j < w; ++j) out[row * w + j] = in[row * w + j];
  }
}

// The rotation's parameters: what the VJP and the second-order rule need.
struct Rotation {
  std::shared_ptr<Angles> a;
  std::size_t rows, w, heads, d, r;
  RopeLayout layout;
  Array apply(const Array& in, double sign) const {
    Array out = Array::empty(in.shape(), in.dtype());
    if (rows > 0)
      detail::dispatch(in.dtype(), [&](auto t) {
        using V = decltype(t);
        rotate<V>(in.data<V>(), out.data<V>(), rows, w, heads, d, r, layout, *a, sign);
      });
    return out;
  }
};

// in rotated by sign * theta, recorded (its VJP rotates by -sign * theta).
Tensor rotate_recorded(const Tensor& in, const Rotation& rot, double sign) {
  return record(
      "rope_rotate", rot.apply(in.value(), sign), {in},
      [rot, sign](const VjpContext& c) { return Cotangents{rot.apply(c.grad_output, -sign)}; },
      [rot, sign](const DiffVjpContext& c) { return DiffCotangents{rotate_recorded(c.grad_output, rot, -sign)}; });
}

// rope's VJP as a named type: the second-order rule reads the rotation from it.
struct RopeVjp {
  Rotation rot;
  Cotangents operator()(const VjpContext& c) const {
    Cotangents cot(1);
    cot[0] = rot.apply(c.grad_output, -1.0);
    return cot;
  }
};

// x [..., T, w] rotated as rope_heads() says; rope() is heads = 1, d = w.
Tensor rotate_op(const Tensor& x, std::size_t heads, std::size_t d, const std::vector<std::int64_t>& positions,
                 const RopeConfig& cfg) {
  const Shape& shape = x.shape();
  const std::size_t T = shape[shape.size() - 2], w = shape.back();
  if (positions.size() != T)
    throw ShapeError(op_message(kOp, "positions has " + std::to_string(positions.size()) + " entries, x of shape " +
                                         shape_str(shape) + " has T = " + std::to_string(T) + " (axis -2)"));
  for (std::size_t t = 0; t < T; ++t)
    if (positions[t] < 0)
      throw ValueError(op_message(kOp, "position " + std::to_string(t) + " is " + std::to_string(positions[t]) +
                                           "; positions must be >= 0"));
  const std::size_t r = rope_rotary_dims(kOp, cfg, d);
  const RopeLayout layout = cfg.layout;
  const std::size_t rows = T == 0 ? 0 : x.size() / w;
  const auto a = angles(positions, r, cfg.base);
  Array y = Array::empty(shape, x.dtype());
  if (rows > 0)
    detail::dispatch(x.dtype(), [&](auto t) {
      using V = decltype(t);
      rotate<V>(x.value().data<V>(), y.data<V>(), rows, w, heads, d, r, layout, *a, 1.0);
    });
  return record(kOp, std::move(y), {x}, RopeVjp{Rotation{a, rows, w, heads, d, r, layout}},
                second_order([](const DiffVjpContext& c) {
                  return DiffCotangents{rotate_recorded(c.grad_output, c.first_order_as<RopeVjp>().rot, -1.0)};
                }));
}

}  // namespace

std::string rope_layout_name(RopeLayout layout) {
  return layout == RopeLayout::interleaved ? "interleaved" : "half-split";
}

RopeLayout rope_layout_from_name(const std::string& name) {
  if (name == "interleaved") return RopeLayout::interleaved;
  if (name == "half-split") return RopeLayout::half_split;
  throw ValueError(op_message(kOp, "unknown layout '" + name + "' (interleaved or half-split)"));
}

std::size_t rope_rotary_dims(const std::string& op, const RopeConfig& cfg, std::size_t d) {
  if (!(std::isfinite(cfg.base) && cfg.base > 1.0))
    throw ValueError(op_message(op, "RoPE base must be finite and > 1, got " + std::to_string(cfg.base)));
  if (!(cfg.fraction > 0.0 && cfg.fraction <= 1.0))
    throw ValueError(op_message(op, "RoPE fraction must be in (0, 1], got " + std::to_string(cfg.fraction)));
  std::size_t r = static_cast<std::size_t>(std::floor(cfg.fraction * static_cast<double>(d)));
  r -= r % 2;
  if (r == 0)
    throw ValueError(op_message(op, "RoPE rotates floor(fraction * d) rounded down to even = 0 features (fraction " +
                                        std::to_string(cfg.fraction) + ", head width d = " + std::to_string(d) +
                                        "); it needs at least 2"));
  return r;
}

Tensor rope(const Tensor& x, const std::vector<std::int64_t>& positions, const RopeConfig& cfg) {
  check::rank_at_least(kOp, "x", x, 2);
  return rotate_op(x, 1, x.shape().back(), positions, cfg);
}

Tensor rope_heads(const Tensor& x, std::size_t heads, std::size_t d, const std::vector<std::int64_t>& positions,
                  const RopeConfig& cfg) {
  check::rank_at_least(kOp, "x", x, 2);
  if (heads == 0 || d == 0 || heads * d > x.shape().back())
    throw ShapeError(op_message(kOp, "rope_heads: " + std::to_string(heads) + " heads of width " + std::to_string(d) +
                                         " need 1 to " + std::to_string(x.shape().back()) +
                                         " features per row (axis -1 of x, shape " + shape_str(x.shape()) + ")"));
  return rotate_op(x, heads, d, positions, cfg);
}

}  // namespace xg::ops
