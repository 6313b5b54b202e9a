// Tape, backward sweep, grad mode and anomaly mode. See core/tape.hpp for the contract and
// docs/architecture.md for the picture.
#include <xgrad/core/tape.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <ostream>
#include <unordered_map>

#include <xgrad/core/allocator.hpp>
#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/detail/profile.hpp>
#include <xgrad/core/detail/record.hpp>
#include <xgrad/core/detail/same_shape.hpp>
#include <xgrad/core/detail/storage.hpp>

namespace xg {
namespace detail {

// --- the opt-in step profile (core/detail/profile.hpp) ---
std::atomic<bool> g_profiling{false};
namespace {
std::mutex g_profile_mutex;
std::map<std::string, OpTime> g_op_times;  // guarded by g_profile_mutex
std::atomic<std::uint64_t> g_gemm_ns{0}, g_gemm_calls{0};
thread_local std::chrono::steady_clock::time_point tl_last_record{};

std::uint64_t ns_since(std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
}

void add_op_time(const std::string& op, std::uint64_t ns, bool forward) {
  std::lock_guard<std::mutex> lk(g_profile_mutex);
  OpTime& t = g_op_times[op];
  t.op = op;
  (forward ? t.forward_ms : t.backward_ms) += static_cast<double>(ns) * 1e-6;
  ++(forward ? t.forward_calls : t.backward_calls);
}
}  // namespace

void set_profiling(bool on) {
  g_profiling.store(on, std::memory_order_relaxed);
  profile_mark();
}
void profile_mark() { tl_last_record = std::chrono::steady_clock::now(); }
void reset_profile() {
  std::lock_guard<std::mutex> lk(g_profile_mutex);
  g_op_times.clear();
  g_gemm_ns = 0;
  g_gemm_calls = 0;
}
std::vector<OpTime> op_profile() {
  std::vector<OpTime> out;
  {
    std::lock_guard<std::mutex> lk(g_profile_mutex);
    for (const auto& [name, t] : g_op_times) out.push_back(t);
  }
  std::stable_sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) {
    return a.forward_ms + a.backward_ms > b.forward_ms + b.backward_ms;
  });
  return out;
}
double gemm_profile_ms() { return static_cast<double>(g_gemm_ns.load()) * 1e-6; }
std::uint64_t gemm_profile_calls() { return g_gemm_calls.load(); }
void add_gemm_time(std::uint64_t ns) {
  g_gemm_ns.fetch_add(ns, std::memory_order_relaxed);
  g_gemm_calls.fetch_add(1, std::memory_order_relaxed);
}

struct TensorImpl {
  // User-provided, so that allocate_shared's value-initialisation runs the member initialisers
  // alone: a defaulted constructor first zero-fills the whole object (a `rep stos`, which costs
  // about 8% of a one-element op on AMD Zen 1: docs/performance.md, "Per-op overhead").
  TensorImpl() {}
  Array value;
  Array grad;  // leaves only
  std::shared_ptr<TensorImpl> grad_graph;  // leaves only: grad as recorded by create_graph passes
  bool requires_grad = false;
  bool is_leaf = true;
  // Non-leaves: the serial of the tape that recorded them (TapeImpl::serial; lock_tape() finds
  // the tape while it lives). A number rather than a weak_ptr: recording an op and dropping
  // its output then touch no reference count of the tape.
  std::uint64_t tape_serial = 0;
  std::uint64_t generation = 0;
  std::size_t node = 0;
  std::string name;
};

struct Edge {
  enum Kind { none, leaf, node } kind = none;
  std::shared_ptr<TensorImpl> leaf_impl;  // kind == leaf
  std::size_t node_index = 0;             // kind == node
};

struct Node {
  std::string op;
  std::vector<Array> inputs;
  Array output;
  std::vector<Edge> edges;
  std::vector<bool> needs;
  VjpFn vjp;
  DiffVjpFn dvjp;  // the second-order rule (create_graph), if the op has one

  // Drops what the node holds (values, leaves, the VJP) but keeps the lists' capacity. edges
  // and needs keep their length too, emptied (no leaf, no flag): record() sizes them again,
  // usually to the same arity, and resizing a vector<bool> each op was not free. op stays:
  // only recorded nodes' names are read, and record() compares before it copies (a training
  // loop records the same op in the same slot every step).
  void reset() {
    inputs.clear();
    output = Array();
    for (Edge& e : edges)
      if (e.kind != Edge::none) e = Edge();
    std::fill(needs.begin(), needs.end(), false);
    vjp = nullptr;
    if (dvjp) dvjp = nullptr;
  }
};

// The node arena: slots [0, count) hold the recorded nodes. clear() resets them and keeps
// the slots, so the next step's record() reuses their lists instead of allocating new ones
// (a training loop records the same graph every step). The slots go with the tape.
struct TapeImpl {
  std::vector<Node> slots;
  std::size_t count = 0;
  std::uint64_t generation = 0;
  std::uint64_t serial = 0;  // unique in the process (never reused); set by make_tape()

  TapeImpl() = default;
  TapeImpl(const TapeImpl&) = delete;
  TapeImpl& operator=(const TapeImpl&) = delete;
  ~TapeImpl();

  std::size_t size() const { return count; }
  Node& operator[](std::size_t i) { return slots[i]; }
  const Node& operator[](std::size_t i) const { return slots[i]; }
  // The slot the next node is built in (recorded only when commit() is called).
  Node& next_slot() {
    if (count == slots.size()) slots.emplace_back();
    Node& n = slots[count];
    n.reset();  // empty unless a record() threw halfway
    return n;
  }
  void commit() { ++count; }

  void clear() {
    for (std::size_t i = 0; i < count; ++i) slots[i].reset();
    if (count < slots.size()) slots[count].reset();  // a half-built node
    count = 0;
    ++generation;
  }
};

// The live tapes by serial: how a recorded tensor finds its tape (lock_tape) without holding a
// reference to it. Registered by make_tape(), removed by ~TapeImpl(); consulted only off the
// per-op path (backward, error messages, printing).
namespace {
struct TapeRegistry {
  std::mutex m;
  std::unordered_map<std::uint64_t, std::weak_ptr<TapeImpl>> live;  // guarded by m
  std::uint64_t next_serial = 1;                                     // guarded by m
};
TapeRegistry& tape_registry() {
  static TapeRegistry* r = new TapeRegistry;  // never destroyed: tapes may end during static destruction
  return *r;
}
}  // namespace

TapeImpl::~TapeImpl() {
  if (serial == 0) return;
  TapeRegistry& r = tape_registry();
  std::lock_guard<std::mutex> lk(r.m);
  r.live.erase(serial);
}

std::shared_ptr<TapeImpl> make_tape() {
  auto tape = std::make_shared<TapeImpl>();
  TapeRegistry& r = tape_registry();
  std::lock_guard<std::mutex> lk(r.m);
  r.live.emplace(r.next_serial, tape);  // may throw: then tape has no serial and unregisters nothing
  tape->serial = r.next_serial++;
  return tape;
}

// The tape that recorded `t` while it lives; null for a leaf or a tape that no longer exists.
std::shared_ptr<TapeImpl> lock_tape(const TensorImpl& t) {
  if (t.tape_serial == 0) return nullptr;
  TapeRegistry& r = tape_registry();
  std::lock_guard<std::mutex> lk(r.m);
  const auto it = r.live.find(t.tape_serial);
  return it == r.live.end() ? nullptr : it->second.lock();
}

}  // namespace detail

using detail::TapeImpl;
using detail::TensorImpl;
using detail::lock_tape;

namespace {

thread_local bool tl_grad_enabled = true;
thread_local bool tl_anomaly = false;
thread_local std::vector<std::shared_ptr<TapeImpl>> tl_tape_stack;
thread_local std::shared_ptr<TapeImpl> tl_default_tape;

const std::shared_ptr<TapeImpl>& current_tape() {
  if (!tl_tape_stack.empty()) return tl_tape_stack.back();
  if (!tl_default_tape) tl_default_tape = detail::make_tape();
  return tl_default_tape;
}

void accumulate(Array& slot, const Array& g) { slot = slot.defined() ? kernels::add(slot, g) : g; }
void accumulate(Array& slot, Array&& g) {
  if (slot.defined())
    slot = kernels::add(slot, g);
  else
    slot = std::move(g);  // the first cotangent of a node: handed over, no reference count touched
}

void check_finite_or_throw(const Array& a, const std::string& op, std::size_t position,
                           const std::string& what) {
  const std::size_t i = a.first_nonfinite();
  if (i == a.size()) return;
  throw AnomalyError(op_message(op, "anomaly: " + what + " has a non-finite value " +
                                        std::to_string(a.flat(i)) + " at flat index " +
                                        std::to_string(i) + " (shape " + shape_str(a.shape()) +
                                        "), tape position " + std::to_string(position)));
}

// Tape of a recorded (non-leaf) tensor, checked to be alive and of the current generation.
std::shared_ptr<TapeImpl> live_tape_of(const TensorImpl& t, const std::string& op,
                                       const std::string& what) {
  auto tape = lock_tape(t);
  if (!tape)
    throw TapeError(op_message(op, what + " was recorded on a tape that no longer exists; "
                                          "detach() it to use its value as a constant"));
  if (tape->generation != t.generation)
    throw TapeError(op_message(
        op, what + " belongs to a tape that was already consumed by backward() or cleared "
                   "(recorded in generation " + std::to_string(t.generation) +
                   ", tape is now at " + std::to_string(tape->generation) +
                   "); run the forward pass again, pass retain_graph, or detach() it"));
  return tape;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Tensor

Tensor::Tensor(Array value, bool requires_grad) : impl_(std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>())) {
  if (!value.defined()) throw ValueError(op_message("tensor", "value is an undefined Array"));
  impl_->value = std::move(value);
  impl_->requires_grad = requires_grad;
}

static const TensorImpl& checked(const std::shared_ptr<TensorImpl>& p) {
  if (!p) throw ValueError(op_message("tensor", "use of an undefined Tensor"));
  return *p;
}

const Array& Tensor::value() const { return checked(impl_).value; }
bool Tensor::requires_grad() const { return checked(impl_).requires_grad; }
bool Tensor::is_leaf() const { return checked(impl_).is_leaf; }
const Array& Tensor::grad() const { return checked(impl_).grad; }
const std::string& Tensor::name() const { return checked(impl_).name; }

Tensor& Tensor::requires_grad_(bool on) {
  if (!checked(impl_).is_leaf)
    throw TapeError(op_message("requires_grad_", "only a leaf's requires_grad can be set; "
                                                 "use detach() on an op's output first"));
  impl_->requires_grad = on;
  return *this;
}

Tensor Tensor::grad_graph() const {
  const TensorImpl& t = checked(impl_);
  return t.grad_graph ? Tensor(t.grad_graph) : Tensor();
}

void Tensor::zero_grad() {
  checked(impl_);
  impl_->grad = Array();
  impl_->grad_graph.reset();
}

void Tensor::set_grad(Array g) {
  const TensorImpl& t = checked(impl_);
  if (!t.is_leaf) throw TapeError(op_message("set_grad", "only a leaf's gradient can be replaced"));
  if (g.defined() && (g.shape() != t.value.shape() || g.dtype() != t.value.dtype()))
    throw ShapeError(op_message("set_grad", "gradient has shape " + shape_str(g.shape()) + " " +
                                                dtype_name(g.dtype()) + ", tensor has " + shape_str(t.value.shape()) +
                                                " " + dtype_name(t.value.dtype())));
  impl_->grad = std::move(g);
  impl_->grad_graph.reset();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(<undefined>)";
  const detail::TensorImpl& impl = *t.impl();
  os << "tensor(" << impl.value.str() << ", dtype=" << dtype_name(impl.value.dtype());
  if (impl.is_leaf) {
    if (impl.requires_grad) os << ", requires_grad=true";
  } else if (const auto tape = lock_tape(impl); tape && tape->generation == impl.generation && impl.node < tape->size()) {
    os << ", grad_fn=" << (*tape)[impl.node].op;
  }
  if (!impl.name.empty()) os << ", name=" << impl.name;
  return os << ")";
}

void Tensor::set_value(Array v) {
  const TensorImpl& t = checked(impl_);
  if (!t.is_leaf) throw TapeError(op_message("set_value", "only a leaf's value can be replaced"));
  if (v.defined() && t.value.defined() && v.dtype() != t.value.dtype())
    throw DTypeError(op_message("set_value", "new value is " + std::string(dtype_name(v.dtype())) + " with shape " +
                                                 shape_str(v.shape()) + ", tensor is " + dtype_name(t.value.dtype()) +
                                                 " with shape " + shape_str(t.value.shape())));
  if (v.shape() != t.value.shape() || v.dtype() != t.value.dtype())
    throw ShapeError(op_message("set_value", "new value has shape " + shape_str(v.shape()) +
                                                 " " + dtype_name(v.dtype()) + ", tensor has " +
                                                 shape_str(t.value.shape()) + " " +
                                                 dtype_name(t.value.dtype())));
  impl_->value = std::move(v);
}

Tensor& Tensor::set_name(std::string name) {
  checked(impl_);
  impl_->name = std::move(name);
  return *this;
}

Tensor Tensor::detach() const { return Tensor(value(), false); }

void Tensor::backward() const { xg::backward(*this); }
void Tensor::backward(const Array& seed) const { xg::backward(*this, seed); }

Tensor tensor(Array value, bool requires_grad) { return Tensor(std::move(value), requires_grad); }
Tensor zeros(const Shape& s, DType d, bool rg) { return Tensor(Array::zeros(s, d), rg); }
Tensor ones(const Shape& s, DType d, bool rg) { return Tensor(Array::full(s, 1.0, d), rg); }
Tensor full(const Shape& s, double v, DType d, bool rg) { return Tensor(Array::full(s, v, d), rg); }
Tensor randn(const Shape& s, Generator& g, DType d, bool rg) {
  return Tensor(random_normal(s, g, d), rg);
}
Tensor rand(const Shape& s, Generator& g, DType d, bool rg) {
  return Tensor(random_uniform(s, g, d), rg);
}

Tensor arange(double start, double stop, double step, DType d) {
  if (step == 0.0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    throw ValueError(op_message("arange", "start, stop and step must be finite and step non-zero"));
  const double count = std::ceil((stop - start) / step);
  const std::size_t n = count > 0 ? static_cast<std::size_t>(count) : 0;
  Array a = Array::empty({n}, d);
  for (std::size_t i = 0; i < n; ++i) a.set_flat(i, start + step * static_cast<double>(i));
  return Tensor(a);
}

// ---------------------------------------------------------------------------------------
// Recording

namespace {

// Whether the recorded tensor `in` is of `tape` (the current tape, alive) and its current
// generation; otherwise the TapeError that says why (input `i` of `op`). The common case
// compares two numbers: no reference count is touched and no lock taken.
void check_recorded_input(const TensorImpl& in, const std::shared_ptr<TapeImpl>& tape, const std::string& op,
                          std::size_t i) {
  if (in.tape_serial == tape->serial && in.generation == tape->generation) return;
  const std::string what = "input " + std::to_string(i);
  auto in_tape = live_tape_of(in, op, what);  // throws for a dead tape or an old generation
  if (in_tape != tape)
    throw TapeError(op_message(op, what + " was recorded on another tape than the current "
                                          "one; detach() it or record on its tape"));
}

// The one recording path. `input(i)` is the i-th of `n_inputs` inputs (a const Tensor&): from a
// vector, a braced list or a list of pointers (detail::record_refs), so no caller copies them.
template <class Input>
Tensor record_list(const std::string& op, Array output, Input input, std::size_t n_inputs, VjpFn& vjp,
                   DiffVjpFn* dvjp) {
  if (detail::profiling()) {
    const auto now = std::chrono::steady_clock::now();
    detail::add_op_time(op, detail::ns_since(detail::tl_last_record, now), true);
    detail::tl_last_record = now;
  }
  const bool anomaly = tl_anomaly;
  const auto& tape = current_tape();
  if (anomaly) check_finite_or_throw(output, op, tape->size(), "forward output");

  bool any = false;
  if (tl_grad_enabled)
    for (std::size_t i = 0; i < n_inputs; ++i) any = any || input(i).requires_grad();
  if (!any) return Tensor(std::move(output));

  detail::Node& node = tape->next_slot();
  try {
    if (node.op != op) node.op = op;  // a kept slot usually has the name already: no copy
    if (node.inputs.capacity() < n_inputs) node.inputs.reserve(n_inputs);  // a kept slot has it: no call
    if (node.edges.size() != n_inputs) node.edges.resize(n_inputs);  // reset() left them empty
    if (node.needs.size() != n_inputs) node.needs.resize(n_inputs);
    for (std::size_t i = 0; i < n_inputs; ++i) {
      const auto& in = input(i).impl();
      node.inputs.push_back(in->value);
      if (!in->requires_grad) continue;
      node.needs[i] = true;
      if (in->is_leaf) {
        node.edges[i].kind = detail::Edge::leaf;
        node.edges[i].leaf_impl = in;
      } else {
        check_recorded_input(*in, tape, op, i);
        node.edges[i].kind = detail::Edge::node;
        node.edges[i].node_index = in->node;
      }
    }
  } catch (...) {
    node.reset();  // nothing of a refused op stays on the tape
    throw;
  }
  node.output = output;
  node.vjp = std::move(vjp);
  if (dvjp) node.dvjp = std::move(*dvjp);

  auto out = std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>());
  out->value = std::move(output);
  out->requires_grad = true;
  out->is_leaf = false;
  out->tape_serial = tape->serial;
  out->generation = tape->generation;
  out->node = tape->size();
  tape->commit();
  return Tensor(std::move(out));
}

}  // namespace

namespace {
// record_list's input(i) over an array of Tensors, and over an array of pointers to them.
struct InputsOf {
  const Tensor* p;
  const Tensor& operator()(std::size_t i) const { return p[i]; }
};
struct InputsAt {
  const Tensor* const* p;
  const Tensor& operator()(std::size_t i) const { return *p[i]; }
};
}  // namespace

Tensor record(const std::string& op, Array output, const std::vector<Tensor>& inputs, VjpFn vjp) {
  return record_list(op, std::move(output), InputsOf{inputs.data()}, inputs.size(), vjp, nullptr);
}

Tensor record(const std::string& op, Array output, std::initializer_list<Tensor> inputs, VjpFn vjp) {
  return record_list(op, std::move(output), InputsOf{inputs.begin()}, inputs.size(), vjp, nullptr);
}

Tensor record(const std::string& op, Array output, const std::vector<Tensor>& inputs, VjpFn vjp, DiffVjpFn dvjp) {
  return record_list(op, std::move(output), InputsOf{inputs.data()}, inputs.size(), vjp, &dvjp);
}

Tensor record(const std::string& op, Array output, std::initializer_list<Tensor> inputs, VjpFn vjp,
              DiffVjpFn dvjp) {
  return record_list(op, std::move(output), InputsOf{inputs.begin()}, inputs.size(), vjp, &dvjp);
}

Tensor detail::record_refs(const std::string& op, Array output, std::initializer_list<const Tensor*> inputs, VjpFn vjp,
                           DiffVjpFn dvjp) {
  for (const Tensor* t : inputs)
    if (!t) throw InternalError(op_message(op, "record_refs: a null input pointer"));
  return record_list(op, std::move(output), InputsAt{inputs.begin()}, inputs.size(), vjp, &dvjp);
}

namespace {

Array custom_forward(const std::string& name, const std::vector<Tensor>& inputs, const ForwardFn& forward) {
  std::vector<Array> values;
  values.reserve(inputs.size());
  for (const Tensor& t : inputs) values.push_back(t.value());
  Array out = forward(values);
  if (!out.defined())
    throw InternalError(op_message(name, "forward returned an undefined Array"));
  return out;
}

}  // namespace

Tensor custom_op(const std::string& name, const std::vector<Tensor>& inputs,
                 const ForwardFn& forward, VjpFn vjp) {
  return record(name, custom_forward(name, inputs, forward), inputs, std::move(vjp));
}

Tensor custom_op(const std::string& name, const std::vector<Tensor>& inputs, const ForwardFn& forward, VjpFn vjp,
                 DiffVjpFn dvjp) {
  if (!dvjp)
    throw ValueError(op_message(name, "custom_op: the differentiable VJP is empty; pass one or use the overload "
                                      "without it"));
  return record(name, custom_forward(name, inputs, forward), inputs, std::move(vjp), std::move(dvjp));
}

Tensor custom_op(const std::string& name, const std::vector<Tensor>& inputs, const ForwardFn& forward, VjpFn vjp,
                 JvpRuleFn jvp) {
  if (!jvp)
    throw ValueError(op_message(name, "custom_op: the JVP rule is empty; pass one or use the overload without it"));
  return record(name, custom_forward(name, inputs, forward), inputs, std::move(vjp),
                [rule = std::move(jvp)](const DiffVjpContext& c) { return transposed_jvp(c, rule); });
}

void DiffVjpContext::throw_first_order_mismatch() {
  throw InternalError(op_message("create_graph", "a second-order rule asked for its op's first-order VJP as a "
                                                 "type it was not recorded with"));
}

// ---------------------------------------------------------------------------------------
// Backward

namespace {

void accumulate_recorded(Tensor& slot, const Tensor& g);  // (below) the sum, recorded on the tape
void add_into(Array& slot, const Array& g) { accumulate(slot, g); }
void add_into(Tensor& slot, const Tensor& g) { accumulate_recorded(slot, g); }

// Gradients that reach leaves during one sweep, committed only when the sweep completes, so a
// VJP that throws leaves every .grad() as it was. G: Array (the plain sweep) or Tensor (the
// recorded sweep of create_graph, whose sums are recorded too).
template <class G>
struct LeafGradsOf {
  std::vector<std::pair<std::shared_ptr<TensorImpl>, G>> items;
  std::unordered_map<const TensorImpl*, std::size_t> index;

  void add(const std::shared_ptr<TensorImpl>& leaf, const G& g) {
    auto [it, fresh] = index.emplace(leaf.get(), items.size());
    if (fresh)
      items.emplace_back(leaf, g);
    else
      add_into(items[it->second].second, g);
  }
};
using LeafGrads = LeafGradsOf<Array>;
using GraphLeafGrads = LeafGradsOf<Tensor>;

// What grad() wants back: wrt positions per leaf and per node (a tensor may be listed twice).
template <class G>
struct CaptureOf {
  std::unordered_map<const TensorImpl*, std::vector<std::size_t>> leaves;
  std::unordered_map<std::size_t, std::vector<std::size_t>> nodes;
  std::vector<G>* out = nullptr;
};
using Capture = CaptureOf<Array>;

[[noreturn]] void throw_bad_cotangent(const detail::Node& n, std::size_t j, const Array& c) {
  const std::string who = n.op + " vjp";
  if (!c.defined())
    throw InternalError(op_message(who, "returned no cotangent for input " + std::to_string(j) +
                                            ", which requires grad"));
  const Array& in = n.inputs[j];
  if (c.shape() != in.shape())
    throw InternalError(op_message(who, "returned cotangent " + std::to_string(j) +
                                            " has shape " + shape_str(c.shape()) +
                                            ", input has shape " + shape_str(in.shape())));
  throw InternalError(op_message(who, "returned cotangent " + std::to_string(j) + " is " +
                                          dtype_name(c.dtype()) + ", input is " + dtype_name(in.dtype())));
}

// A VJP's cotangent j for an input that requires grad: defined, of the input's shape and
// dtype, and finite in anomaly mode. The message (naming the op) is built only on failure.
void check_cotangent(const detail::Node& n, std::size_t j, const Array& c, std::size_t pos) {
  if (!c.defined()) throw_bad_cotangent(n, j, c);
  const detail::Storage& cs = c.storage();
  const detail::Storage& is = n.inputs[j].storage();
  if (cs.dtype != is.dtype || !detail::same_shape(cs.shape, is.shape)) throw_bad_cotangent(n, j, c);
  if (tl_anomaly)
    check_finite_or_throw(c, n.op, pos, "backward cotangent for input " + std::to_string(j));
}

// y's impl, where a sweep named `op` starts: ValueError when y is undefined, TapeError when
// it does not require grad.
const std::shared_ptr<TensorImpl>& sweep_root(const std::string& op, const Tensor& y) {
  if (!y.defined()) throw ValueError(op_message(op, "y is an undefined Tensor"));
  const auto& yi = y.impl();
  if (!yi->requires_grad)
    throw TapeError(op_message(op, "y does not require grad: no input of the ops that produced "
                                   "it requires grad, or it was computed under no_grad"));
  return yi;
}

Array checked_seed(const std::string& op, const Tensor& y, Array seed) {
  if (!seed.defined()) {
    if (y.size() != 1)
      throw TapeError(op_message(op, "y has shape " + shape_str(y.shape()) +
                                         "; backward of a non-scalar needs a seed of that shape"));
    return Array::full(y.shape(), 1.0, y.dtype());
  }
  if (seed.shape() != y.shape())
    throw ShapeError(op_message(op, "seed has shape " + shape_str(seed.shape()) + ", y has shape " +
                                        shape_str(y.shape())));
  if (seed.dtype() != y.dtype())
    throw DTypeError(op_message(op, std::string("seed is ") + dtype_name(seed.dtype()) + ", y is " +
                                        dtype_name(y.dtype())));
  const std::size_t bad = seed.first_nonfinite();
  if (bad != seed.size())
    throw ValueError(op_message(op, "seed element " + std::to_string(bad) + " is " + std::to_string(seed.flat(bad)) +
                                        ": a backward seed must be finite"));
  return seed;
}

// The reverse sweep from y. Leaf gradients go to `leaves`; cotangents of captured nodes to
// cap->out. VJPs run with recording off: a VJP computes values, it never extends the tape
// (so the node it reads cannot move under it). Higher-order gradients are not supported.
void sweep(const Tensor& y, Array seed, const BackwardOptions& opts, Capture* cap, LeafGrads& leaves) {
  const std::string op = cap ? "grad" : "backward";
  const auto& yi = sweep_root(op, y);
  seed = checked_seed(op, y, std::move(seed));
  if (yi->is_leaf) {
    leaves.add(yi, seed);
    return;
  }
  auto tape = live_tape_of(*yi, op, "y");
  NoGradGuard no_recording;

  // on_leaf_grad: a leaf's gradient is complete once the sweep has passed the first node
  // that uses it. (position, leaf) pairs of those first uses, walked from the end.
  std::vector<std::pair<std::size_t, TensorImpl*>> first_use;
  if (opts.on_leaf_grad) {
    std::unordered_map<const TensorImpl*, std::size_t> seen;
    for (std::size_t i = 0; i <= yi->node; ++i)
      for (const detail::Edge& e : (*tape)[i].edges)
        if (e.kind == detail::Edge::leaf && seen.emplace(e.leaf_impl.get(), i).second)
          first_use.emplace_back(i, e.leaf_impl.get());
  }
  auto leaves_done_at = [&](std::size_t i) {
    while (!first_use.empty() && first_use.back().first == i) {
      auto it = leaves.index.find(first_use.back().second);
      if (it != leaves.index.end()) opts.on_leaf_grad(Tensor(leaves.items[it->second].first), leaves.items[it->second].second);
      first_use.pop_back();
    }
  };

  std::vector<Array> grads(yi->node + 1);
  grads[yi->node] = seed;
  try {
    for (std::size_t i = yi->node + 1; i-- > 0;) {
      if (!grads[i].defined()) {
        leaves_done_at(i);
        continue;
      }
      detail::Node& n = (*tape)[i];
      if (cap) {
        auto it = cap->nodes.find(i);
        if (it != cap->nodes.end())
          for (std::size_t k : it->second) (*cap->out)[k] = grads[i];
      }
      const bool timed = detail::profiling();
      const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      const VjpContext ctx{n.inputs, n.output, grads[i], n.needs};
      Cotangents cot = n.vjp(ctx);
      if (cot.size() != n.inputs.size())
        throw InternalError(op_message(n.op + " vjp", "returned " + std::to_string(cot.size()) +
                                                          " cotangents for " +
                                                          std::to_string(n.inputs.size()) +
                                                          " inputs"));
      for (std::size_t j = 0; j < cot.size(); ++j) {
        if (!n.needs[j]) continue;
        check_cotangent(n, j, cot[j], i);
        const detail::Edge& e = n.edges[j];
        if (e.kind == detail::Edge::node)
          accumulate(grads[e.node_index], std::move(cot[j]));
        else
          leaves.add(e.leaf_impl, cot[j]);
      }
      grads[i] = Array();  // this cotangent has been passed on
      if (timed) detail::add_op_time(n.op, detail::ns_since(t0, std::chrono::steady_clock::now()), false);
      if (!opts.retain_graph) {  // free the node's saved values early
        n.vjp = nullptr;
        n.inputs.clear();
        n.output = Array();
      }
      leaves_done_at(i);
    }
  } catch (...) {
    if (!opts.retain_graph) tape->clear();
    throw;
  }
  if (!opts.retain_graph) tape->clear();
}

// ---------------------------------------------------------------------------------------
// The recorded sweep (create_graph). A separate loop from sweep(): the first-order path above
// is not touched. Each reached node's second-order rule runs with grad mode on and y's tape
// current, so the cotangents it returns are recorded Tensors; they are accumulated with a
// recorded add. Nothing is freed: the recorded gradients refer to the forward nodes.

// A handle to the output of node `i` of `tape` (its value `value`): using it in an op records
// an edge to that node.
Tensor node_tensor(const std::shared_ptr<TapeImpl>& tape, std::size_t i, const Array& value) {
  auto t = std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>());
  t->value = value;
  t->requires_grad = true;
  t->is_leaf = false;
  t->tape_serial = tape->serial;
  t->generation = tape->generation;
  t->node = i;
  return Tensor(std::move(t));
}

// a + b (same shape) recorded, with its rules: how recorded cotangents accumulate.
Tensor add_recorded(const Tensor& a, const Tensor& b) {
  return record(
      "add", kernels::add(a.value(), b.value()), {a, b},
      [](const VjpContext& c) { return Cotangents{c.grad_output, c.grad_output}; },
      [](const DiffVjpContext& c) { return DiffCotangents{c.grad_output, c.grad_output}; });
}

void accumulate_recorded(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add_recorded(slot, g) : g; }

// The identity, recorded: composed_vjp's stand-ins for an op's inputs.
Tensor identity_recorded(const Tensor& x) {
  return record(
      "composed_input", x.value(), {x}, [](const VjpContext& c) { return Cotangents{c.grad_output}; },
      [](const DiffVjpContext& c) { return DiffCotangents{c.grad_output}; });
}

struct GraphCapture : CaptureOf<Tensor> {
  // The captured nodes are where the sweep stops: their rules do not run (composed_vjp's
  // local backward through an op's composition, which must not leave it).
  bool terminal = false;
};

// Makes `tape` current and grad mode on for the sweep; restores both.
class RecordOn {
 public:
  explicit RecordOn(const std::shared_ptr<TapeImpl>& tape) : prev_grad_(tl_grad_enabled) {
    tl_tape_stack.push_back(tape);
    tl_grad_enabled = true;
  }
  ~RecordOn() {
    tl_tape_stack.pop_back();
    tl_grad_enabled = prev_grad_;
  }
  RecordOn(const RecordOn&) = delete;
  RecordOn& operator=(const RecordOn&) = delete;

 private:
  bool prev_grad_;
};

Tensor checked_graph_seed(const std::string& op, const Tensor& y, const Tensor& seed) {
  if (!seed.defined()) return Tensor(checked_seed(op, y, Array()));
  checked_seed(op, y, seed.value());  // shape, dtype, finite
  return seed;
}

void graph_sweep(const Tensor& y, const Tensor& seed_in, const BackwardOptions& opts, GraphCapture* cap,
                 GraphLeafGrads& leaves) {
  const std::string op = cap ? "grad" : "backward";
  const auto& yi = sweep_root(op, y);
  if (opts.on_leaf_grad)
    throw ValueError(op_message(op, "on_leaf_grad is not supported with create_graph"));
  const Tensor seed = checked_graph_seed(op, y, seed_in);
  if (yi->is_leaf) {
    leaves.add(yi, seed);
    return;
  }
  auto tape = live_tape_of(*yi, op, "y");
  const std::size_t top = yi->node;
  std::size_t stop = 0;  // terminal capture: nodes below the lowest captured one are not reached
  if (cap && cap->terminal && !cap->nodes.empty()) {
    stop = top;
    for (const auto& kv : cap->nodes) stop = std::min(stop, kv.first);
  }

  // Which nodes the sweep reaches, so that an op without a second-order rule is refused
  // before anything is recorded.
  std::vector<char> reached(top + 1, 0);
  reached[top] = 1;
  for (std::size_t i = top + 1; i-- > stop;) {
    if (!reached[i]) continue;
    const detail::Node& n = (*tape)[i];
    if (!n.vjp)
      throw TapeError(op_message(op, "node " + std::to_string(i) + " (" + n.op +
                                         ") was already consumed by a backward pass without retain_graph"));
    if (cap && cap->terminal && cap->nodes.count(i)) continue;
    if (!n.dvjp)
      throw TapeError(op_message(n.op, "has no second-order rule (a custom op needs a differentiable VJP or a JVP "
                                       "rule): create_graph, jvp and hvp cannot differentiate through it "
                                       "(docs/higher-order.md lists the ops that have one)"));
    for (const detail::Edge& e : n.edges)
      if (e.kind == detail::Edge::node) reached[e.node_index] = 1;
  }

  RecordOn recording(tape);
  std::vector<Tensor> grads(top + 1);
  grads[top] = seed;
  for (std::size_t i = top + 1; i-- > stop;) {
    if (!grads[i].defined()) continue;
    if (cap) {
      auto it = cap->nodes.find(i);
      if (it != cap->nodes.end()) {
        for (std::size_t k : it->second) (*cap->out)[k] = grads[i];
        if (cap->terminal) continue;
      }
    }
    // Copies of what the rule reads: it records nodes, which may move the tape's slots.
    const detail::Node& n = (*tape)[i];
    const std::string name = n.op;
    const std::vector<detail::Edge> edges = n.edges;
    const std::vector<bool> needs = n.needs;
    const std::vector<Array> values = n.inputs;
    const DiffVjpFn rule = n.dvjp;
    const VjpFn first = n.vjp;
    const Tensor out = node_tensor(tape, i, n.output);
    std::vector<Tensor> ins;
    ins.reserve(values.size());
    for (std::size_t j = 0; j < values.size(); ++j) {
      if (edges[j].kind == detail::Edge::leaf)
        ins.emplace_back(edges[j].leaf_impl);
      else if (edges[j].kind == detail::Edge::node)
        ins.push_back(node_tensor(tape, edges[j].node_index, values[j]));
      else
        ins.emplace_back(values[j], false);
    }
    const bool timed = detail::profiling();
    const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    const DiffVjpContext ctx{ins, out, grads[i], needs, first};
    DiffCotangents cot = rule(ctx);
    if (cot.size() != values.size())
      throw InternalError(op_message(name + " second-order rule", "returned " + std::to_string(cot.size()) +
                                                                     " cotangents for " +
                                                                     std::to_string(values.size()) + " inputs"));
    for (std::size_t j = 0; j < cot.size(); ++j) {
      if (!needs[j]) continue;
      const std::string who = name + " second-order rule";
      if (!cot[j].defined())
        throw InternalError(op_message(who, "returned no cotangent for input " + std::to_string(j) +
                                                ", which requires grad"));
      if (cot[j].shape() != values[j].shape() || cot[j].dtype() != values[j].dtype())
        throw InternalError(op_message(who, "returned cotangent " + std::to_string(j) + " of shape " +
                                                shape_str(cot[j].shape()) + " " + dtype_name(cot[j].dtype()) +
                                                ", input has shape " + shape_str(values[j].shape()) + " " +
                                                dtype_name(values[j].dtype())));
      if (tl_anomaly)
        check_finite_or_throw(cot[j].value(), name, i, "backward cotangent for input " + std::to_string(j));
      if (edges[j].kind == detail::Edge::node)
        accumulate_recorded(grads[edges[j].node_index], cot[j]);
      else
        leaves.add(edges[j].leaf_impl, cot[j]);
    }
    grads[i] = Tensor();
    if (timed) detail::add_op_time(name, detail::ns_since(t0, std::chrono::steady_clock::now()), false);
  }
}

}  // namespace

DiffCotangents composed_vjp(const DiffVjpContext& c,
                            const std::function<Tensor(const std::vector<Tensor>&)>& composed) {
  std::vector<Tensor> stand_ins;
  stand_ins.reserve(c.inputs.size());
  for (std::size_t j = 0; j < c.inputs.size(); ++j)
    stand_ins.push_back(c.needs(j) ? identity_recorded(c.inputs[j]) : c.inputs[j].detach());
  const Tensor y = composed(stand_ins);
  if (!y.defined() || y.shape() != c.output.shape() || y.dtype() != c.output.dtype())
    throw InternalError(op_message("composed_vjp", "the composition's output has shape " +
                                                       (y.defined() ? shape_str(y.shape()) : std::string("<undefined>")) +
                                                       ", the op's has " + shape_str(c.output.shape())));
  DiffCotangents out(c.inputs.size());
  if (y.requires_grad()) {
    std::vector<Tensor> wrt;
    GraphCapture cap;
    cap.terminal = true;
    std::vector<Tensor> got(c.inputs.size());
    cap.out = &got;
    for (std::size_t j = 0; j < c.inputs.size(); ++j)
      if (c.needs(j)) cap.nodes[stand_ins[j].impl()->node].push_back(j);
    GraphLeafGrads leaves;
    BackwardOptions opts;
    graph_sweep(y, c.grad_output, opts, &cap, leaves);
    out = got;
  }
  for (std::size_t j = 0; j < c.inputs.size(); ++j)
    if (c.needs(j) && !out[j].defined())
      out[j] = Tensor(Array::zeros(c.inputs[j].shape(), c.inputs[j].dtype()));
  return out;
}

DiffCotangents transposed_jvp(const DiffVjpContext& c, const JvpRuleFn& jvp) {
  const std::size_t n = c.inputs.size();
  // Stand-ins for the inputs (recorded when they require grad, so the cotangents stay
  // differentiable in them) and for the tangents (fresh zero leaves behind a recorded identity:
  // the rule is linear in them, so where it is evaluated does not matter). Both are where the
  // local reverse pass stops.
  std::vector<Tensor> xs, ts;
  for (std::size_t j = 0; j < n; ++j) {
    xs.push_back(c.inputs[j].requires_grad() ? identity_recorded(c.inputs[j]) : c.inputs[j].detach());
    ts.push_back(c.needs(j) ? identity_recorded(Tensor(Array::zeros(c.inputs[j].shape(), c.inputs[j].dtype()), true))
                            : Tensor(Array::zeros(c.inputs[j].shape(), c.inputs[j].dtype())));
  }
  const Tensor y = jvp(xs, ts);
  if (!y.defined() || y.shape() != c.output.shape() || y.dtype() != c.output.dtype())
    throw InternalError(op_message(
        "transposed_jvp", "the JVP rule's tangent has shape " +
                              (y.defined() ? shape_str(y.shape()) + " " + dtype_name(y.dtype()) : std::string("<undefined>")) +
                              ", the op's output " + shape_str(c.output.shape()) + " " + dtype_name(c.output.dtype())));
  DiffCotangents out(n);
  if (y.requires_grad()) {
    GraphCapture cap;
    cap.terminal = true;
    std::vector<Tensor> got(2 * n);
    cap.out = &got;
    for (std::size_t j = 0; j < n; ++j) {
      if (c.needs(j) && ts[j].requires_grad()) cap.nodes[ts[j].impl()->node].push_back(j);
      if (xs[j].requires_grad()) cap.nodes[xs[j].impl()->node].push_back(n + j);  // stop there
    }
    GraphLeafGrads leaves;
    BackwardOptions opts;
    graph_sweep(y, c.grad_output, opts, &cap, leaves);
    for (std::size_t j = 0; j < n; ++j) out[j] = got[j];
  }
  for (std::size_t j = 0; j < n; ++j)
    if (c.needs(j) && !out[j].defined()) out[j] = Tensor(Array::zeros(c.inputs[j].shape(), c.inputs[j].dtype()));
  return out;
}

void backward(const Tensor& y, const Array& seed, BackwardOptions opts) {
  if (opts.create_graph) {
    GraphLeafGrads leaves;
    graph_sweep(y, seed.defined() ? Tensor(seed) : Tensor(), opts, nullptr, leaves);
    const std::shared_ptr<TapeImpl> tape = y.impl()->is_leaf ? current_tape() : lock_tape(*y.impl());
    RecordOn recording(tape);
    for (auto& [leaf, g] : leaves.items) {
      // grad_graph's value stays equal to grad: it continues the recorded gradient held so far
      // when that is still live on this tape, else starts from the plain value held so far.
      Tensor total = g;
      const auto& prev = leaf->grad_graph;
      const bool prev_live = prev && (prev->is_leaf || (tape && prev->tape_serial == tape->serial && prev->generation == tape->generation));
      if (prev_live)
        total = add_recorded(Tensor(prev), g);
      else if (leaf->grad.defined())
        total = add_recorded(Tensor(leaf->grad, false), g);
      accumulate(leaf->grad, g.value());
      leaf->grad_graph = total.impl();
    }
    return;
  }
  LeafGrads leaves;
  sweep(y, seed, opts, nullptr, leaves);
  for (auto& [leaf, g] : leaves.items) {
    accumulate(leaf->grad, g);  // committed only on success
    leaf->grad_graph.reset();   // a plain pass: the recorded gradient no longer matches
  }
}

namespace {

// grad()'s targets: checks y and each of wrt (defined, requiring grad, a non-leaf on y's tape)
// and files wrt[k] under its leaf or node in `cap` (Capture or GraphCapture).
template <class Cap>
void capture_targets(const Tensor& y, const std::vector<Tensor>& wrt, Cap& cap) {
  if (!y.defined()) throw ValueError(op_message("grad", "y is an undefined Tensor"));
  std::shared_ptr<TapeImpl> y_tape;
  if (!y.impl()->is_leaf) y_tape = live_tape_of(*y.impl(), "grad", "y");
  for (std::size_t k = 0; k < wrt.size(); ++k) {
    const std::string name = "wrt[" + std::to_string(k) + "]";
    const auto& w = wrt[k].impl();
    if (!w) throw ValueError(op_message("grad", name + " is undefined"));
    if (!w->requires_grad) throw TapeError(op_message("grad", name + " does not require grad"));
    if (w->is_leaf) {
      cap.leaves[w.get()].push_back(k);
    } else {
      if (live_tape_of(*w, "grad", name) != y_tape)
        throw TapeError(op_message("grad", name + " was recorded on another tape than y"));
      cap.nodes[w->node].push_back(k);
    }
  }
}

// grad()'s last step: each captured leaf's gradient to its wrt positions in `out`, zeros of
// wrt[k]'s shape and dtype where nothing reached wrt[k].
template <class G>
void fill_grad_outputs(std::vector<G>& out, const LeafGradsOf<G>& leaves, const CaptureOf<G>& cap,
                       const std::vector<Tensor>& wrt) {
  for (auto& [leaf, g] : leaves.items) {
    auto it = cap.leaves.find(leaf.get());
    if (it != cap.leaves.end())
      for (std::size_t k : it->second) out[k] = g;
  }
  for (std::size_t k = 0; k < wrt.size(); ++k)
    if (!out[k].defined()) out[k] = G(Array::zeros(wrt[k].shape(), wrt[k].dtype()));
}

}  // namespace

std::vector<Array> grad(const Tensor& y, const std::vector<Tensor>& wrt, const Array& seed,
                        BackwardOptions opts) {
  if (opts.create_graph)
    throw ValueError(op_message("grad", "create_graph returns recorded Tensors: call the overload with a Tensor "
                                        "seed, grad(y, wrt, Tensor(seed), opts) (Tensor() for a one-element y)"));
  std::vector<Array> out(wrt.size());
  Capture cap;
  cap.out = &out;
  capture_targets(y, wrt, cap);
  LeafGrads leaves;
  opts.on_leaf_grad = nullptr;  // backward() only
  sweep(y, seed, opts, &cap, leaves);
  fill_grad_outputs(out, leaves, cap, wrt);
  return out;
}

std::vector<Tensor> grad(const Tensor& y, const std::vector<Tensor>& wrt, const Tensor& seed,
                         BackwardOptions opts) {
  if (!opts.create_graph) {
    const std::vector<Array> g = grad(y, wrt, seed.defined() ? seed.value() : Array(), opts);
    return std::vector<Tensor>(g.begin(), g.end());
  }
  std::vector<Tensor> out(wrt.size());
  GraphCapture cap;
  cap.out = &out;
  capture_targets(y, wrt, cap);
  GraphLeafGrads leaves;
  graph_sweep(y, seed, opts, &cap, leaves);
  fill_grad_outputs(out, leaves, cap, wrt);
  return out;
}

// ---------------------------------------------------------------------------------------
// Tape object, modes

Tape::Tape() : impl_(detail::make_tape()) { tl_tape_stack.push_back(impl_); }

Tape::~Tape() {
  auto it = std::find(tl_tape_stack.rbegin(), tl_tape_stack.rend(), impl_);
  if (it != tl_tape_stack.rend()) tl_tape_stack.erase(std::next(it).base());
}

std::size_t Tape::size() const { return impl_->size(); }
std::uint64_t Tape::generation() const { return impl_->generation; }
void Tape::clear() { impl_->clear(); }
namespace {
void check_position(const detail::TapeImpl& t, std::size_t p) {
  if (p >= t.size())
    throw ValueError(op_message("tape", "position " + std::to_string(p) + " is past the end (" +
                                            std::to_string(t.size()) + " nodes)"));
}
}  // namespace
std::string Tape::op_at(std::size_t p) const {
  check_position(*impl_, p);
  return (*impl_)[p].op;
}
std::size_t Tape::inputs_at(std::size_t p) const {
  check_position(*impl_, p);
  return (*impl_)[p].edges.size();
}
std::size_t Tape::current_size() { return current_tape()->size(); }

bool grad_enabled() { return tl_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(tl_grad_enabled) { tl_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { tl_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(tl_grad_enabled) { tl_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { tl_grad_enabled = prev_; }

bool anomaly_mode() { return tl_anomaly; }
void set_anomaly_mode(bool on) { tl_anomaly = on; }
AnomalyModeGuard::AnomalyModeGuard(bool on) : prev_(tl_anomaly) { tl_anomaly = on; }
AnomalyModeGuard::~AnomalyModeGuard() { tl_anomaly = prev_; }

}  // namespace xg
