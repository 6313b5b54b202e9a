/// \file
/// The tape: an append-only list of recorded ops in execution order. Creation order is a
/// topological order, so backward is one reverse loop (no recursion, no stack overflow on
/// deep graphs). Built-in ops and user-defined custom ops record themselves through the same
/// call, record(), handing over a vector-Jacobian product (VJP).
///
/// Lifetime: a tape per step. backward() consumes the tape (frees every node, bumps its
/// generation) unless retain_graph is set; tensors recorded before then become stale and
/// using them in a recorded op is a TapeError. Each thread has a default tape; declaring
/// `xg::Tape tape;` makes a scoped tape current until it goes out of scope.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/core/tensor.hpp>

namespace xg {

namespace detail {
struct TapeImpl;
}

/// What a VJP receives. The output and the inputs are the forward values (shared, not
/// copied); grad_output has the output's shape. needs(i) says whether input i wants a
/// cotangent: a VJP may return an undefined Array for inputs that do not.
struct VjpContext {
  const std::vector<Array>& inputs;   ///< The forward input values, in input order.
  const Array& output;                ///< The forward output value.
  const Array& grad_output;           ///< The cotangent of the output (the output's shape).
  const std::vector<bool>& needs_grad;  ///< Per input: whether it wants a cotangent.
  /// Whether input `i` wants a cotangent (needs_grad[i]).
  bool needs(std::size_t i) const { return needs_grad[i]; }
};

/// One cotangent per input, in input order, each with that input's shape and dtype. The
/// tape checks arity, shape and dtype and names the op when one is off (InternalError).
using Cotangents = std::vector<Array>;
/// A vector-Jacobian product: from the forward values and the output's cotangent to the
/// inputs' cotangents.
using VjpFn = std::function<Cotangents(const VjpContext&)>;

/// Records an op named `op` whose forward value `output` the caller computed from the values
/// of `inputs`, with its VJP `vjp`. When grad mode is off or no input requires grad, nothing
/// is recorded and the result is a constant. This is the extension point for custom layers
/// (see custom_op below).
Tensor record(const std::string& op, Array output, const std::vector<Tensor>& inputs,
              VjpFn vjp);
/// record() of a braced list of inputs (`record("mul", out, {a, b}, vjp)`): the same, without
/// building a vector.
Tensor record(const std::string& op, Array output, std::initializer_list<Tensor> inputs, VjpFn vjp);

/// The forward function of a custom op: input values to the output value.
using ForwardFn = std::function<Array(const std::vector<Array>&)>;
/// torch.autograd.Function / jax.custom_vjp in one call: runs `forward` on the values of
/// `inputs` and records the result as op `name` with the VJP `vjp` (as for record()).
Tensor custom_op(const std::string& name, const std::vector<Tensor>& inputs,
                 const ForwardFn& forward, VjpFn vjp);

/// A tape: the recorded ops of one step. Declaring one makes it this thread's current tape
/// until it goes out of scope; every op recorded meanwhile lands on it.
class Tape {
 public:
  Tape();   ///< Becomes this thread's current tape.
  ~Tape();  ///< Stops being current; frees every node.
  Tape(const Tape&) = delete;             ///< Not copyable.
  Tape& operator=(const Tape&) = delete;  ///< Not copyable.

  std::size_t size() const;          ///< Nodes currently recorded.
  std::uint64_t generation() const;  ///< Bumped by clear() and by a consuming backward.
  /// Frees every node and bumps the generation: tensors recorded so far become stale.
  void clear();

  /// Name of the op at tape position `position`, for diagnostics.
  std::string op_at(std::size_t position) const;

  static std::size_t current_size();  ///< Nodes on this thread's current tape.

 private:
  std::shared_ptr<detail::TapeImpl> impl_;
};

/// Options of backward() and grad().
struct BackwardOptions {
  bool retain_graph = false;  ///< Keep the nodes so backward can run again.
  /// backward() only: called (on the calling thread, during the sweep) for each leaf as soon
  /// as its gradient of this pass is complete -- no op left to run feeds it -- with that
  /// gradient (not including what .grad() already held). Data-parallel training starts the
  /// gradient all-reduce here, overlapping it with the rest of the sweep (distributed/data_parallel.hpp).
  /// The gradient is committed to .grad() only when the whole sweep succeeds, as always.
  std::function<void(const Tensor& leaf, const Array& grad)> on_leaf_grad;
};

/// Accumulates d(seed . y)/d(leaf) into every leaf that requires grad. `seed` has y's shape;
/// undefined means 1 for a one-element `y`. `opts` as in BackwardOptions.
void backward(const Tensor& y, const Array& seed = Array(), BackwardOptions opts = {});

/// Returns d(seed . y)/d(x) for each x in `wrt` (leaves or recorded tensors) without touching
/// any .grad(). A tensor y does not depend on gets zeros (as in JAX); a tensor may be listed
/// more than once; a recorded tensor from another tape than y's is a TapeError. `seed` and
/// `opts` as for backward().
///
/// Both run every VJP with recording off (higher-order gradients are not supported), and
/// both are all-or-nothing for leaves: if a VJP throws, no .grad() has changed.
std::vector<Array> grad(const Tensor& y, const std::vector<Tensor>& wrt,
                        const Array& seed = Array(), BackwardOptions opts = {});

/// Grad mode (on by default), per thread: whether ops record on the tape.
bool grad_enabled();
/// Turns grad mode off for its scope (this thread): ops record nothing and return constants.
class NoGradGuard {
 public:
  NoGradGuard();   ///< Turns recording off.
  ~NoGradGuard();  ///< Restores the previous grad mode.
  NoGradGuard(const NoGradGuard&) = delete;             ///< Not copyable.
  NoGradGuard& operator=(const NoGradGuard&) = delete;  ///< Not copyable.

 private:
  bool prev_;
};

/// Anomaly mode (off by default), per thread: every recorded forward output and every
/// cotangent a VJP returns is checked; the first non-finite value raises AnomalyError naming
/// the op, its tape position and the element.
bool anomaly_mode();
/// Turns anomaly mode on or off (`on`) for this thread.
void set_anomaly_mode(bool on);
/// Sets anomaly mode for its scope (this thread).
class AnomalyModeGuard {
 public:
  explicit AnomalyModeGuard(bool on = true);  ///< Sets anomaly mode to `on`.
  ~AnomalyModeGuard();                        ///< Restores the previous anomaly mode.
  AnomalyModeGuard(const AnomalyModeGuard&) = delete;             ///< Not copyable.
  AnomalyModeGuard& operator=(const AnomalyModeGuard&) = delete;  ///< Not copyable.

 private:
  bool prev_;
};

}  // namespace xg
