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
#include <type_traits>
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

/// What a differentiable VJP (a second-order rule) receives under create_graph: the same as
/// VjpContext, but as Tensors recorded on the tape, so the cotangents it computes from them
/// with recorded ops can be differentiated again. `inputs[i]` is the recorded input (a leaf,
/// an op's output, or a constant when it does not require grad), `output` the op's own
/// output, `grad_output` the cotangent (itself recorded when it depends on what is being
/// differentiated). `first_order` is the op's Array VJP: a rule that needs the state the
/// forward pass saved there (a mask, indices) reads it with first_order_as<F>() instead of
/// capturing a second copy.
struct DiffVjpContext {
  const std::vector<Tensor>& inputs;    ///< The inputs as Tensors, in input order.
  const Tensor& output;                 ///< The op's output (recorded).
  const Tensor& grad_output;            ///< The cotangent of the output.
  const std::vector<bool>& needs_grad;  ///< Per input: whether it wants a cotangent.
  const VjpFn& first_order;             ///< The op's first-order (Array) VJP.
  /// Whether input `i` wants a cotangent (needs_grad[i]).
  bool needs(std::size_t i) const { return needs_grad[i]; }
  /// The first-order VJP as the functor type F it was recorded with (InternalError if not).
  template <class F> const F& first_order_as() const {
    const F* f = first_order.template target<F>();
    if (!f) throw_first_order_mismatch();
    return *f;
  }

 private:
  [[noreturn]] static void throw_first_order_mismatch();
};

/// One cotangent Tensor per input (undefined for inputs that do not want one).
using DiffCotangents = std::vector<Tensor>;
/// A differentiable VJP: the VJP written with recorded ops (used only under create_graph).
using DiffVjpFn = std::function<DiffCotangents(const DiffVjpContext&)>;

/// Records an op named `op` whose forward value `output` the caller computed from the values
/// of `inputs`, with its VJP `vjp`. When grad mode is off or no input requires grad, nothing
/// is recorded and the result is a constant. This is the extension point for custom layers
/// (see custom_op below).
Tensor record(const std::string& op, Array output, const std::vector<Tensor>& inputs,
              VjpFn vjp);
/// record() of a braced list of inputs (`record("mul", out, {a, b}, vjp)`): the same, without
/// building a vector.
Tensor record(const std::string& op, Array output, std::initializer_list<Tensor> inputs, VjpFn vjp);
/// record() with a second-order rule `dvjp`: the VJP again, written with recorded ops, that a
/// backward pass with create_graph runs instead of `vjp` (docs/higher-order.md). Plain
/// backward passes never call it. An op recorded without one refuses create_graph (TapeError
/// naming the op). Built-in rules capture at most 16 bytes of trivially copyable data, which
/// std::function keeps inline: recording one allocates nothing.
Tensor record(const std::string& op, Array output, const std::vector<Tensor>& inputs, VjpFn vjp,
              DiffVjpFn dvjp);
/// record() of a braced list of inputs with a second-order rule `dvjp`.
Tensor record(const std::string& op, Array output, std::initializer_list<Tensor> inputs, VjpFn vjp,
              DiffVjpFn dvjp);

/// `f` as a DiffVjpFn, checked at compile time to capture at most 16 bytes of trivially
/// copyable data, so std::function stores it inline and recording it allocates nothing. The
/// built-in ops pass their second-order rules through it: a plain (first-order) pass pays
/// for moving that small object into the node, no allocation and no reference count.
template <class F> DiffVjpFn second_order(F f) {
  static_assert(sizeof(F) <= 16 && std::is_trivially_copyable<F>::value,
                "a second-order rule recorded with every op must stay small and trivially copyable; share "
                "bigger state with the first-order VJP (DiffVjpContext::first_order_as)");
  return DiffVjpFn(std::move(f));
}

/// A second-order rule for an op whose function can also be composed from recorded ops that
/// have rules of their own: `composed` recomputes the op's output from (stand-ins for) its
/// inputs, and the cotangents are that composition's recorded VJP, seeded with the context's
/// grad_output. For fused ops (layer_norm, cross_entropy, ...) whose composed form is their
/// test oracle. Costs one recomputation of the composed forward.
DiffCotangents composed_vjp(const DiffVjpContext& c,
                            const std::function<Tensor(const std::vector<Tensor>&)>& composed);

/// The forward function of a custom op: input values to the output value.
using ForwardFn = std::function<Array(const std::vector<Array>&)>;
/// torch.autograd.Function / jax.custom_vjp in one call: runs `forward` on the values of
/// `inputs` and records the result as op `name` with the VJP `vjp` (as for record()).
Tensor custom_op(const std::string& name, const std::vector<Tensor>& inputs,
                 const ForwardFn& forward, VjpFn vjp);
/// custom_op() with a differentiable VJP `dvjp` (written with recorded ops) for create_graph:
/// without one, a backward pass with create_graph through the op is a TapeError naming it.
Tensor custom_op(const std::string& name, const std::vector<Tensor>& inputs,
                 const ForwardFn& forward, VjpFn vjp, DiffVjpFn dvjp);

/// A custom op's JVP rule, written with recorded ops: the output's tangent from the inputs and
/// one tangent per input (each of its input's shape and dtype). It must be linear in the
/// tangents (as every JVP is).
using JvpRuleFn = std::function<Tensor(const std::vector<Tensor>& inputs, const std::vector<Tensor>& tangents)>;
/// custom_op() with a JVP rule instead of a differentiable VJP (as jax.custom_jvp). jvp() and
/// create_graph both run on differentiable VJPs (docs/higher-order.md), so the op's is derived
/// from the rule: transposed_jvp(), a local reverse pass over the rule in its tangents. An
/// empty rule is a ValueError.
Tensor custom_op(const std::string& name, const std::vector<Tensor>& inputs,
                 const ForwardFn& forward, VjpFn vjp, JvpRuleFn jvp);
/// The differentiable VJP that a JVP rule implies: for each input j that wants a cotangent,
/// J_j^T g (g = c.grad_output), computed by a reverse pass over `jvp` with respect to stand-in
/// tangents (the rule is linear in them, so this is exact), recorded, so it can be differentiated
/// again. Its output must have the op's shape and dtype (InternalError otherwise).
DiffCotangents transposed_jvp(const DiffVjpContext& c, const JvpRuleFn& jvp);

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
  /// Number of recorded inputs of the op at tape position `position`, for diagnostics.
  std::size_t inputs_at(std::size_t position) const;

  static std::size_t current_size();  ///< Nodes on this thread's current tape.

 private:
  std::shared_ptr<detail::TapeImpl> impl_;
};

/// Options of backward() and grad().
struct BackwardOptions {
  bool retain_graph = false;  ///< Keep the nodes so backward can run again.
  /// Record the backward pass on the tape (each op's second-order rule runs instead of its
  /// Array VJP), so the gradients are Tensors that can be differentiated again, to any order.
  /// Implies retain_graph (the recorded gradients refer to the forward nodes). Through an op
  /// without a second-order rule it is a TapeError naming the op, before anything is
  /// recorded. grad() returns the recorded gradients only from its Tensor-seed overload;
  /// backward() keeps them in Tensor::grad_graph().
  bool create_graph = false;
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
/// Without create_graph both run every VJP with recording off; with it they record the
/// sweep (see BackwardOptions::create_graph, docs/higher-order.md). Both are all-or-nothing
/// for leaves: if a VJP throws, no .grad() has changed. This overload returns values, so
/// create_graph is refused here (ValueError): use the Tensor-seed overload below.
std::vector<Array> grad(const Tensor& y, const std::vector<Tensor>& wrt,
                        const Array& seed = Array(), BackwardOptions opts = {});

/// grad() returning Tensors: with opts.create_graph they are recorded (differentiable again,
/// and differentiable in `seed` when the seed requires grad); without it they are constants
/// holding the values the Array overload returns. An undefined `seed` means 1 for a
/// one-element y. A tensor y does not depend on gets a constant of zeros.
std::vector<Tensor> grad(const Tensor& y, const std::vector<Tensor>& wrt, const Tensor& seed,
                         BackwardOptions opts = {});

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

/// Turns grad mode on for its scope (this thread), as torch.enable_grad: ops record again
/// inside a NoGradGuard.
class EnableGradGuard {
 public:
  EnableGradGuard();   ///< Turns recording on.
  ~EnableGradGuard();  ///< Restores the previous grad mode.
  EnableGradGuard(const EnableGradGuard&) = delete;             ///< Not copyable.
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;  ///< Not copyable.

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
