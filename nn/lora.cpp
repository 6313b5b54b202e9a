// LoRA over the public API: what a user's own layer would include, nothing more.
#include <xgrad/nn/lora.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include <xgrad/core/error.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/matmul.hpp>
#include <xgrad/ops/reduce.hpp>
#include <xgrad/ops/shape_ops.hpp>

namespace xg::nn {

namespace {

std::string str(std::size_t v) { return std::to_string(v); }

}  // namespace

// ---------------------------------------------------------------------------------------
// The adapted projection as one op

namespace {

// x W + s (x A) B + b composed from recorded matmuls: lora_affine's second-order rule (and,
// in tests/nn/test_lora.cpp, its oracle). in = {x, W, A, B[, b]}.
Tensor composed_lora(const std::vector<Tensor>& in, double s) {
  const Tensor y = ops::matmul(in[0], in[1]) + ops::matmul(ops::matmul(in[0], in[2]) * s, in[3]);
  return in.size() > 4 ? y + in[4] : y;
}

}  // namespace

Tensor lora_affine(const Tensor& x, const Tensor& W, const Tensor& b, const Tensor& A, const Tensor& B, double s) {
  const std::string op = "lora_affine";
  auto shape_of = [](const Tensor& t) { return t.defined() ? shape_str(t.shape()) : std::string("undefined"); };
  if (!x.defined() || !W.defined() || !A.defined() || !B.defined() || x.ndim() == 0 || W.ndim() != 2 ||
      A.ndim() != 2 || B.ndim() != 2 || x.shape().back() != W.shape()[0] || A.shape()[0] != W.shape()[0] ||
      B.shape()[0] != A.shape()[1] || B.shape()[1] != W.shape()[1] ||
      (b.defined() && (b.ndim() != 1 || b.shape()[0] != W.shape()[1])))
    throw ShapeError(op_message(op, "x " + shape_of(x) + ", W " + shape_of(W) + ", b " + shape_of(b) + ", A " +
                                        shape_of(A) + ", B " + shape_of(B) +
                                        " do not fit x [..., d_in], W [d_in, d_out], b [d_out], A [d_in, r], B [r, d_out]"));
  for (const Tensor* t : {&W, &A, &B, &b})
    if (t->defined() && t->dtype() != x.dtype())
      throw DTypeError(op_message(op, "x is " + std::string(dtype_name(x.dtype())) + ", an operand is " +
                                          dtype_name(t->dtype()) + "; all must be one dtype"));
  std::vector<Tensor> in = {x, W, A, B};
  if (b.defined()) in.push_back(b);
  return custom_op(
      op, in,
      [s](const std::vector<Array>& v) {
        NoGradGuard ng;
        const Tensor xt(v[0]);
        Tensor y = ops::matmul(xt, Tensor(v[1])) + ops::matmul(ops::matmul(xt, Tensor(v[2])) * s, Tensor(v[3]));
        if (v.size() > 4) y = y + Tensor(v[4]);
        return y.value();
      },
      [s](const VjpContext& c) {
        NoGradGuard ng;
        const Array& xa = c.inputs[0];
        const auto d_in = static_cast<long>(xa.shape().back());
        const auto d_out = static_cast<long>(c.grad_output.shape().back());
        const long rows = d_in ? static_cast<long>(xa.size()) / d_in : 0;
        const Tensor x2 = ops::reshape(Tensor(xa), {rows, d_in});
        const Tensor g2 = ops::reshape(Tensor(c.grad_output), {rows, d_out});
        const Tensor Wt(c.inputs[1]), At(c.inputs[2]), Bt(c.inputs[3]);
        Cotangents cot(c.inputs.size());
        Tensor gB;  // g B^T [rows, r]: shared by dx and dA
        if (c.needs(0) || c.needs(2)) gB = ops::matmul(g2, Bt, {false, true});
        if (c.needs(0)) {
          const Tensor dx = ops::matmul(g2, Wt, {false, true}) + ops::matmul(gB * s, At, {false, true});
          std::vector<long> shape(xa.shape().begin(), xa.shape().end());
          cot[0] = ops::reshape(dx, shape).value();
        }
        if (c.needs(1)) cot[1] = ops::matmul(x2, g2, {true, false}).value();  // skipped for a frozen W
        if (c.needs(2)) cot[2] = (ops::matmul(x2, gB, {true, false}) * s).value();
        if (c.needs(3)) cot[3] = ops::matmul(ops::matmul(x2, At) * s, g2, {true, false}).value();  // x A recomputed
        if (c.inputs.size() > 4 && c.needs(4)) cot[4] = ops::sum(g2, {0}).value();
        return cot;
      },
      [s](const DiffVjpContext& c) {
        return composed_vjp(c, [s](const std::vector<Tensor>& v) { return composed_lora(v, s); });
      });
}

// ---------------------------------------------------------------------------------------
// LoRA

LoRA::LoRA(std::size_t d_in, std::size_t d_out, const LoRAConfig& cfg, Generator& gen, DType dtype,
           const std::string& layer)
    : d_in_(d_in), d_out_(d_out), rank_(cfg.rank), alpha_(cfg.alpha) {
  const std::string op = "lora";
  if (d_in == 0 || d_out == 0)
    throw ValueError(op_message(op, layer + ": d_in and d_out must be positive, got " + str(d_in) + " and " + str(d_out)));
  if (cfg.rank == 0) throw ValueError(op_message(op, layer + ": rank must be positive, got 0"));
  if (cfg.rank > std::min(d_in, d_out))
    throw ValueError(op_message(op, layer + ": rank " + str(cfg.rank) + " is larger than the layer: min(d_in " +
                                        str(d_in) + ", d_out " + str(d_out) + ") = " + str(std::min(d_in, d_out))));
  if (!(cfg.alpha > 0.0) || !std::isfinite(cfg.alpha))
    throw ValueError(op_message(op, layer + ": alpha must be positive and finite, got " + std::to_string(cfg.alpha)));
  // peft draws lora_A [r, d_in] with kaiming_uniform_(a = sqrt(5)): bound = gain sqrt(3 / fan_in)
  // with gain sqrt(2 / (1 + 5)), i.e. 1 / sqrt(d_in) (torch.nn.Linear's default). Each column of
  // x A then has the variance of x over 3, whatever d_in; B = 0 makes the term start at zero.
  const double bound = 1.0 / std::sqrt(static_cast<double>(d_in));
  lora_A = register_parameter("lora_A", random_uniform({d_in, cfg.rank}, gen, dtype, -bound, bound));
  lora_B = register_parameter("lora_B", Array::zeros({cfg.rank, d_out}, dtype));
}

Tensor LoRA::operator()(const Tensor& x) const {
  if (!x.defined() || x.ndim() == 0 || x.shape().back() != d_in_)
    throw ShapeError(op_message("lora", "x must be [..., " + str(d_in_) + "], has shape " +
                                            (x.defined() ? shape_str(x.shape()) : "undefined")));
  if (x.dtype() != lora_A.dtype())
    throw DTypeError(op_message("lora", "x is " + std::string(dtype_name(x.dtype())) + ", lora_A is " +
                                            dtype_name(lora_A.dtype())));
  // (x A) first: [..., r] is narrow, so the term costs O(r (d_in + d_out)) per row and its
  // backward never forms a [d_in, d_out] gradient.
  return ops::matmul(ops::matmul(x, lora_A) * scale(), lora_B);
}

Tensor LoRA::project(const Tensor& x, const Tensor& W, const Tensor& b) const {
  if (x.dtype() != lora_A.dtype())
    throw DTypeError(op_message("lora", "x is " + std::string(dtype_name(x.dtype())) + ", lora_A is " +
                                            dtype_name(lora_A.dtype())));
  return lora_affine(x, W, b, lora_A, lora_B, scale());
}

bool LoRA::low_rank(Tensor& A, Tensor& B) const {
  A = lora_A * scale();
  B = lora_B;
  return true;
}

Array LoRA::weight_delta() const {
  NoGradGuard ng;
  return (ops::matmul(lora_A, lora_B) * scale()).value();
}

// ---------------------------------------------------------------------------------------
// LoRALinear

namespace {

// The weights of a LoRALinear, checked as Linear(W, b) checks them (without its copy).
void check_weights(const Array& W, const Array& b) {
  const std::string op = "lora_linear";
  if (!W.defined()) throw ValueError(op_message(op, "W is an undefined Array"));
  if (W.ndim() != 2 || W.shape()[0] == 0 || W.shape()[1] == 0)
    throw ShapeError(op_message(op, "W must be a non-empty [d_in, d_out] matrix, has shape " + shape_str(W.shape())));
  if (b.defined()) {
    if (b.dtype() != W.dtype())
      throw DTypeError(op_message(op, "b is " + std::string(dtype_name(b.dtype())) + ", W is " + dtype_name(W.dtype())));
    if (b.ndim() != 1 || b.shape()[0] != W.shape()[1])
      throw ShapeError(op_message(op, "b has shape " + shape_str(b.shape()) + ", W " + shape_str(W.shape()) +
                                          " needs b of shape (" + str(W.shape()[1]) + ")"));
  }
}

const Array& checked_W(const Array& W, const Array& b) {
  check_weights(W, b);
  return W;
}

Array value_or_undefined(const Tensor& t) { return t.defined() ? t.value() : Array(); }

}  // namespace

LoRALinear::LoRALinear(const Linear& base, const LoRAConfig& cfg, Generator& gen)
    : LoRALinear(base.W.value(), value_or_undefined(base.b), cfg, gen) {}

LoRALinear::LoRALinear(const Array& W_, const Array& b_, const LoRAConfig& cfg, Generator& gen)
    : lora(checked_W(W_, b_).shape()[0], W_.shape()[1], cfg, gen, W_.dtype(), "lora_linear") {
  // The frozen weights share the given arrays: xgrad never writes into an array in place
  // (optimizers replace values), so sharing is safe and costs no memory.
  W = register_parameter("W", W_);
  W.requires_grad_(false);
  if (b_.defined()) {
    b = register_parameter("b", b_);
    b.requires_grad_(false);
  }
  register_module("", lora);  // lora_A, lora_B under their own names
}

Tensor LoRALinear::operator()(const Tensor& x) const {
  if (!x.defined() || x.ndim() == 0 || x.shape().back() != lora.d_in())
    throw ShapeError(op_message("lora", "x must be [..., " + str(lora.d_in()) + "], has shape " +
                                            (x.defined() ? shape_str(x.shape()) : "undefined")));
  return lora.project(x, W, b);  // one op: x W + b + s (x A) B
}

Array LoRALinear::merged_weight() const {
  NoGradGuard ng;
  return (Tensor(W.value()) + Tensor(lora.weight_delta())).value();
}

std::unique_ptr<Linear> LoRALinear::merged() const {
  return std::make_unique<Linear>(merged_weight(), b.defined() ? b.value() : Array());
}

// ---------------------------------------------------------------------------------------
// Adapters in a GPT or Llama model

namespace {

const std::vector<std::string> kAttn = {"q", "k", "v", "o"};
const std::vector<std::string> kLlamaMlp = {"gate", "up", "down"};
const std::vector<std::string> kGptMlp = {"fc1", "fc2"};

const std::vector<std::string>& mlp_names(Architecture arch) {
  return arch == Architecture::llama ? kLlamaMlp : kGptMlp;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// One projection of one block that can hold an adapter: an attention projection or a Linear.
struct Site {
  std::string path;  // "blocks.0.attn.q"
  MultiHeadAttention* attn = nullptr;
  MultiHeadAttention::Projection proj = MultiHeadAttention::Projection::q;
  Linear* linear = nullptr;

  Adapter* adapter() const { return attn ? attn->adapter(proj) : linear->adapter(); }
  std::size_t d_in() const {
    if (linear) return linear->W.shape()[0];
    return proj == MultiHeadAttention::Projection::o ? attn->W_O.shape()[0] : attn->config().d_model;
  }
  std::size_t d_out() const {
    if (linear) return linear->W.shape()[1];
    const auto& c = attn->config();
    switch (proj) {
      case MultiHeadAttention::Projection::q: return c.H_q * attn->d_head();
      case MultiHeadAttention::Projection::k:
      case MultiHeadAttention::Projection::v: return c.H_kv * attn->d_head();
      case MultiHeadAttention::Projection::o: return c.d_model;
    }
    return 0;
  }
  DType dtype() const { return linear ? linear->W.dtype() : attn->W_QKV.dtype(); }
  void attach(std::unique_ptr<Adapter> a) const {
    if (attn)
      attn->set_adapter(proj, std::move(a));
    else
      linear->set_adapter(std::move(a));
  }
  void merge() const {
    if (attn)
      attn->merge_adapter(proj);
    else
      linear->merge_adapter();
  }
};

// The projection `name` of block `L`.
Site site(GPT& model, std::size_t L, const std::string& name) {
  DecoderLayer& block = *model.blocks.at(L);
  Site s;
  const std::string prefix = "blocks." + str(L) + ".";
  for (std::size_t i = 0; i < kAttn.size(); ++i)
    if (name == kAttn[i]) {
      s.path = prefix + "attn." + name;
      s.attn = &block.attn;
      s.proj = static_cast<MultiHeadAttention::Projection>(i);
      return s;
    }
  s.path = prefix + "ffn." + name;
  if (SwiGLUFeedForward* f = swiglu_ffn(block)) {
    s.linear = name == "gate" ? &f->gate : name == "up" ? &f->up : &f->down;
    if (name == "gate" || name == "up" || name == "down") return s;
  } else if (FeedForward* f = gelu_ffn(block)) {
    s.linear = name == "fc1" ? &f->fc1 : &f->fc2;
    if (name == "fc1" || name == "fc2") return s;
  }
  throw ValueError(op_message("lora", "block " + str(L) + " has no projection '" + name + "'" +
                                          (swiglu_ffn(block) || gelu_ffn(block)
                                               ? std::string()
                                               : " (its feed-forward sub-layer is the registered mlp '" +
                                                     model.config().mlp + "')")));
}

// Every projection of every block that may hold an adapter (a registered mlp has none).
std::vector<Site> all_sites(GPT& model) {
  std::vector<Site> out;
  const auto names = lora_targets("all", model.config().arch);
  for (std::size_t L = 0; L < model.blocks.size(); ++L) {
    const bool builtin_ffn = swiglu_ffn(*model.blocks[L]) || gelu_ffn(*model.blocks[L]);
    for (const auto& n : names)
      if (builtin_ffn || std::find(kAttn.begin(), kAttn.end(), n) != kAttn.end()) out.push_back(site(model, L, n));
  }
  return out;
}

}  // namespace

std::vector<std::string> lora_targets(const std::string& targets, Architecture arch) {
  const std::string op = "lora";
  const std::vector<std::string>& mlp = mlp_names(arch);
  std::vector<std::string> valid = kAttn;
  valid.insert(valid.end(), mlp.begin(), mlp.end());
  const std::string hint = "; a " + architecture_name(arch) + " model's targets are " + joined(valid) +
                           " and the groups attn, mlp, all";
  std::set<std::string> chosen;
  std::size_t start = 0;
  bool any = false;
  while (start <= targets.size()) {
    const std::size_t comma = std::min(targets.find(',', start), targets.size());
    const std::string t = targets.substr(start, comma - start);
    start = comma + 1;
    if (t.empty()) {
      if (targets.empty()) break;
      throw ValueError(op_message(op, "targets '" + targets + "' has an empty entry" + hint));
    }
    any = true;
    if (t == "attn" || t == "all") chosen.insert(kAttn.begin(), kAttn.end());
    if (t == "mlp" || t == "all") chosen.insert(mlp.begin(), mlp.end());
    if (t == "attn" || t == "mlp" || t == "all") continue;
    bool ok = false;
    for (const auto& v : valid) ok = ok || v == t;
    if (!ok) {
      const bool other_arch = t == "gate" || t == "up" || t == "down" || t == "fc1" || t == "fc2";
      throw ValueError(op_message(op, "target '" + t + "' names no layer of " +
                                          (other_arch ? "a " + architecture_name(arch) + " model" : "a block") + hint));
    }
    chosen.insert(t);
  }
  if (!any) throw ValueError(op_message(op, "targets is empty" + hint));
  std::vector<std::string> out;  // block order
  for (const auto& v : valid)
    if (chosen.count(v)) out.push_back(v);
  return out;
}

std::size_t add_lora(GPT& model, const std::string& targets, const LoRAConfig& cfg, Generator& gen) {
  const auto names = lora_targets(targets, model.config().arch);
  // Every adapter is made (and so checked) before the first is attached: a refused call
  // leaves the model as it was.
  std::vector<std::pair<Site, std::unique_ptr<Adapter>>> made;
  for (std::size_t L = 0; L < model.blocks.size(); ++L)
    for (const auto& n : names) {
      Site s = site(model, L, n);
      if (s.adapter())
        throw ValueError(op_message("lora", s.path + " has an adapter already; merge it (merge_lora) first"));
      made.emplace_back(s, std::make_unique<LoRA>(s.d_in(), s.d_out(), cfg, gen, s.dtype(), s.path));
    }
  for (auto& [s, a] : made) s.attach(std::move(a));
  if (cfg.freeze_base) {  // only the adapters train, as peft does
    std::set<std::string> adapter_params;
    for (const Site& s : all_sites(model))
      if (const Adapter* a = s.adapter())
        for (const auto& [n, t] : a->named_parameters()) adapter_params.insert(s.path + "." + n);
    model.set_requires_grad([&](const std::string& n) { return adapter_params.count(n) == 0; }, false);
    model.set_requires_grad([&](const std::string& n) { return adapter_params.count(n) > 0; }, true);
  }
  return made.size();
}

std::size_t count_adapters(const GPT& model) {
  std::size_t n = 0;
  for (const auto& block : model.blocks) {
    for (std::size_t i = 0; i < kAttn.size(); ++i)
      n += block->attn.adapter(static_cast<MultiHeadAttention::Projection>(i)) ? 1 : 0;
    if (const SwiGLUFeedForward* f = swiglu_ffn(*block))
      for (const Linear* l : {&f->gate, &f->up, &f->down}) n += l->adapter() ? 1 : 0;
    if (const FeedForward* f = gelu_ffn(*block))
      for (const Linear* l : {&f->fc1, &f->fc2}) n += l->adapter() ? 1 : 0;
  }
  return n;
}

std::size_t merge_lora(GPT& model) {
  std::size_t n = 0;
  for (const Site& s : all_sites(model))
    if (s.adapter()) {
      s.merge();
      ++n;
    }
  if (n == 0) throw ValueError(op_message("merge_lora", "the model has no adapters to merge"));
  return n;
}

}  // namespace xg::nn
