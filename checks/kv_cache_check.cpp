// The KV-cache equivalence checker (checks/kv_cache_check.hpp).
#include <xgrad/checks/kv_cache_check.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include <xgrad/core/shape.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/ops/join.hpp>

namespace xg {

namespace {

const char* kOp = "kv_cache_check";

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", v);
  return buf;
}

std::string chunks_text(const std::vector<std::size_t>& c) {
  std::string s = "[";
  for (std::size_t i = 0; i < c.size(); ++i) s += (i ? ", " : "") + std::to_string(c[i]);
  return s + "]";
}

std::string index_text(const std::vector<std::size_t>& idx) {
  std::string s = "out[";
  for (std::size_t i = 0; i < idx.size(); ++i) s += (i ? ", " : "") + std::to_string(idx[i]);
  return s + "]";
}

std::string schedule_label(const KVComparison& c) {
  return c.chunks.empty() ? c.name : "schedule \"" + c.name + "\" " + chunks_text(c.chunks);
}

// |a - b| with NaN counting as infinite.
double absdiff(double a, double b) {
  const double d = std::fabs(a - b);
  return std::isnan(d) ? INFINITY : d;
}

// Compares out [B, n, inner...] with full positions [at, at + n) (full is [B, T, inner...]),
// position by position, into c (accumulating over calls).
void compare_positions(const std::vector<double>& out, const std::vector<double>& full, const Shape& full_shape,
                       std::size_t at, std::size_t n, double tol, std::size_t chunk, KVComparison& c) {
  const std::size_t B = full_shape[0], T = full_shape[1];
  std::size_t inner = 1;
  for (std::size_t a = 2; a < full_shape.size(); ++a) inner *= full_shape[a];
  for (std::size_t j = 0; j < n; ++j) {
    double pos_max = 0;
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t k = 0; k < inner; ++k) {
        const double d = absdiff(out[(b * n + j) * inner + k], full[(b * T + at + j) * inner + k]);
        if (d > pos_max) pos_max = d;
        if (d > c.max_abs_diff || c.worst.empty()) {
          c.max_abs_diff = d;
          std::vector<std::size_t> idx = {b, at + j};
          std::size_t rest = k;
          std::vector<std::size_t> tail(full_shape.size() - 2);
          for (std::size_t a = full_shape.size(); a-- > 2;) {
            tail[a - 2] = rest % full_shape[a];
            rest /= full_shape[a];
          }
          idx.insert(idx.end(), tail.begin(), tail.end());
          c.worst = index_text(idx);
        }
      }
    if (!(pos_max <= tol) && c.first_bad_position == KVComparison::npos) {
      c.first_bad_position = at + j;
      c.first_bad_diff = pos_max;
      c.bad_chunk = chunk;
      c.chunk_begin = at;
      c.chunk_end = at + n;
    }
  }
}

void check_output(const Tensor& y, const Shape& want, DType dtype, const std::string& what) {
  if (!y.defined())
    throw ValueError(op_message(kOp, what + " returned an undefined tensor"));
  if (y.shape() != want)
    throw ShapeError(op_message(kOp, what + " returned shape " + shape_str(y.shape()) + ", expected " + shape_str(want)));
  if (y.dtype() != dtype)
    throw DTypeError(op_message(kOp, what + " returned " + dtype_name(y.dtype()) + " where the full forward returned " +
                                         dtype_name(dtype)));
}

// The input with every position from p on changed (see KVCacheCheckOptions::prefix_isolation);
// false when token ids cannot be changed (one distinct id).
bool perturb_suffix(const DecoderInput& in, std::size_t p, DecoderInput& out) {
  const std::size_t B = in.batch(), T = in.length();
  if (in.is_tokens()) {
    const std::set<std::int64_t> ids(in.tokens().data.begin(), in.tokens().data.end());
    if (ids.size() < 2) return false;
    IndexArray t = in.tokens();
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t i = p; i < T; ++i) {
        std::int64_t& id = t.data[b * T + i];
        auto next = ids.upper_bound(id);
        id = next == ids.end() ? *ids.begin() : *next;
      }
    out = DecoderInput(t);
    return true;
  }
  const Array& v = in.values();
  Array c = v.clone();
  std::size_t inner = 1;
  for (std::size_t a = 2; a < v.ndim(); ++a) inner *= v.shape()[a];
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t i = p; i < T; ++i)
      for (std::size_t k = 0; k < inner; ++k) {
        const std::size_t f = (b * T + i) * inner + k;
        c.set_flat(f, v.flat(f) + 1.0);
      }
  out = DecoderInput(c);
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// DecoderInput

DecoderInput::DecoderInput(IndexArray tokens) : is_tokens_(true), tokens_(std::move(tokens)) {
  if (tokens_.shape.size() != 2)
    throw ShapeError(op_message(kOp, "token ids must be [B, T], got shape " + shape_str(tokens_.shape)));
}

DecoderInput::DecoderInput(Array values) : is_tokens_(false), values_(std::move(values)) {
  if (!values_.defined()) throw ValueError(op_message(kOp, "the input values are an undefined Array"));
  if (values_.ndim() < 2)
    throw ShapeError(op_message(kOp, "input values must be [B, T, ...], got shape " + shape_str(values_.shape())));
}

const IndexArray& DecoderInput::tokens() const {
  if (!is_tokens_)
    throw ValueError(op_message(kOp, "the input holds values of shape " + shape_str(values_.shape()) +
                                         ", not token ids (take it as const Array&)"));
  return tokens_;
}

const Array& DecoderInput::values() const {
  if (is_tokens_)
    throw ValueError(op_message(kOp, "the input holds token ids of shape " + shape_str(tokens_.shape) +
                                         ", not values (take it as const IndexArray&)"));
  return values_;
}

Shape DecoderInput::shape() const {
  if (is_tokens_) return tokens_.shape.empty() ? Shape{0, 0} : tokens_.shape;
  return values_.defined() ? values_.shape() : Shape{0, 0};
}

std::size_t DecoderInput::batch() const { return shape()[0]; }
std::size_t DecoderInput::length() const { return shape()[1]; }

DecoderInput DecoderInput::slice(std::size_t begin, std::size_t end) const {
  const std::size_t B = batch(), T = length();
  if (!(begin < end && end <= T))
    throw ValueError(op_message(kOp, "slice [" + std::to_string(begin) + ", " + std::to_string(end) +
                                         ") of an input of " + std::to_string(T) + " positions"));
  if (is_tokens_) {
    std::vector<std::int64_t> ids;
    ids.reserve(B * (end - begin));
    for (std::size_t b = 0; b < B; ++b)
      ids.insert(ids.end(), tokens_.data.begin() + long(b * T + begin), tokens_.data.begin() + long(b * T + end));
    return DecoderInput(IndexArray({B, end - begin}, std::move(ids)));
  }
  NoGradGuard ng;
  return DecoderInput(ops::slice(Tensor(values_), 1, long(begin), long(end)).value().clone());
}

// ---------------------------------------------------------------------------------------
// Schedules

std::vector<KVSchedule> default_kv_schedules(std::size_t T) {
  std::vector<KVSchedule> all;
  if (T == 0) return all;
  all.push_back({"prefill", {T}});
  all.push_back({"token by token", std::vector<std::size_t>(T, 1)});
  {
    std::vector<std::size_t> c;
    std::size_t at = 0;
    for (std::size_t i = 0; at < T; ++i) {
      const std::size_t n = std::min<std::size_t>(1 + i % 3, T - at);
      c.push_back(n);
      at += n;
    }
    all.push_back({"chunks 1,2,3", c});
  }
  if (T / 3 > 0) all.push_back({"uneven split", {T - T / 3, T / 3}});
  if (T > 1) {
    const std::size_t k = std::min<std::size_t>(3, T - 1);
    std::vector<std::size_t> c = {T - k};
    c.insert(c.end(), k, 1);
    all.push_back({"prefill then decode", c});
  }
  std::vector<KVSchedule> out;
  for (const KVSchedule& s : all) {
    bool seen = false;
    for (const KVSchedule& o : out) seen = seen || o.chunks == s.chunks;
    if (!seen) out.push_back(s);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// The checker

std::string KVCacheReport::summary() const {
  if (!passed) return message;
  std::size_t n = 0;
  bool prefix = false;
  double worst = 0;
  for (const KVComparison& c : comparisons) {
    if (c.chunks.empty())
      prefix = true;
    else
      ++n;
    worst = std::max(worst, c.max_abs_diff);
  }
  return "KV cache: " + std::to_string(n) + " schedule" + (n == 1 ? "" : "s") + (prefix ? " and prefix isolation" : "") +
         " agree with the full forward " + shape_str(output_shape) + ": max |diff| " + sci(worst) + " <= tolerance " +
         sci(tolerance);
}

KVCacheReport check_kv_cache(const KVCacheDecoder& decoder, const DecoderInput& input,
                             const KVCacheCheckOptions& options) {
  if (!decoder.forward || !decoder.make_state || !decoder.forward_cached)
    throw ValueError(op_message(kOp, std::string("the decoder lacks ") +
                                         (!decoder.forward ? "forward" : !decoder.make_state ? "make_state" : "forward_cached")));
  const std::size_t B = input.batch(), T = input.length();
  if (B == 0 || T == 0)
    throw ValueError(op_message(kOp, "the input has shape " + shape_str(input.shape()) +
                                         ": it needs at least one sample and one position"));
  const std::vector<KVSchedule> schedules = options.schedules.empty() ? default_kv_schedules(T) : options.schedules;
  for (const KVSchedule& s : schedules) {
    std::size_t sum = 0;
    for (std::size_t n : s.chunks) {
      if (n == 0)
        throw ValueError(op_message(kOp, "schedule \"" + s.name + "\" " + chunks_text(s.chunks) + " has a chunk of 0"));
      sum += n;
    }
    if (sum != T)
      throw ValueError(op_message(kOp, "schedule \"" + s.name + "\" " + chunks_text(s.chunks) + " covers " +
                                           std::to_string(sum) + " positions, the input has " + std::to_string(T)));
  }

  NoGradGuard ng;
  KVCacheReport r;
  const Tensor full_t = decoder.forward(input);
  if (!full_t.defined()) throw ValueError(op_message(kOp, "the full forward returned an undefined tensor"));
  r.output_shape = full_t.shape();
  r.dtype = full_t.dtype();
  if (r.output_shape.size() < 2 || r.output_shape[0] != B || r.output_shape[1] != T)
    throw ShapeError(op_message(kOp, "the full forward on input " + shape_str(input.shape()) + " returned shape " +
                                         shape_str(r.output_shape) + ", expected [" + std::to_string(B) + ", " +
                                         std::to_string(T) + ", ...]"));
  const std::vector<double> full = full_t.value().to_vector();
  for (double v : full) r.scale = std::max(r.scale, std::fabs(v));
  const bool f64 = r.dtype == DType::float64;
  const double rtol = options.rtol >= 0 ? options.rtol : (f64 ? 1e-10 : 1e-4);
  const double atol = options.atol >= 0 ? options.atol : (f64 ? 1e-12 : 1e-6);
  r.tolerance = atol + rtol * (std::isfinite(r.scale) ? r.scale : 0.0);

  for (const KVSchedule& s : schedules) {
    KVComparison c;
    c.name = s.name;
    c.chunks = s.chunks;
    const std::shared_ptr<void> state = decoder.make_state();
    if (!state) throw ValueError(op_message(kOp, "make_state returned a null state"));
    std::size_t at = 0;
    for (std::size_t i = 0; i < s.chunks.size(); ++i) {
      const std::size_t n = s.chunks[i];
      const Tensor y = decoder.forward_cached(state.get(), input.slice(at, at + n));
      Shape want = r.output_shape;
      want[1] = n;
      check_output(y, want, r.dtype,
                   "schedule \"" + s.name + "\" " + chunks_text(s.chunks) + ": the cached forward of chunk " +
                       std::to_string(i) + " (positions " + std::to_string(at) + ".." + std::to_string(at + n - 1) + ")");
      compare_positions(y.value().to_vector(), full, r.output_shape, at, n, r.tolerance, i, c);
      at += n;
    }
    c.passed = c.first_bad_position == KVComparison::npos;
    r.comparisons.push_back(std::move(c));
  }

  DecoderInput changed;
  const std::size_t p = T / 2;
  if (options.prefix_isolation && p > 0 && perturb_suffix(input, p, changed)) {
    KVComparison c;
    c.name = "prefix isolation";
    const Tensor y = decoder.forward(changed);
    check_output(y, r.output_shape, r.dtype, "the full forward on the input changed from position " + std::to_string(p));
    compare_positions(ops::slice(y, 1, 0, long(p)).value().clone().to_vector(), full, r.output_shape, 0, p, r.tolerance, 0,
                      c);
    c.passed = c.first_bad_position == KVComparison::npos;
    r.comparisons.push_back(std::move(c));
  }

  r.passed = true;
  for (const KVComparison& c : r.comparisons) {
    if (c.passed) continue;
    r.passed = false;
    if (c.chunks.empty())
      r.message = "KV cache: prefix isolation: output at position " + std::to_string(c.first_bad_position) +
                  " changed by " + sci(c.first_bad_diff) + " > tolerance " + sci(r.tolerance) +
                  " when only the inputs from position " + std::to_string(p) +
                  " on changed: the full forward is not causal (largest at " + c.worst + ")";
    else
      r.message = "KV cache: " + schedule_label(c) + ": position " + std::to_string(c.first_bad_position) +
                  " (chunk " + std::to_string(c.bad_chunk) + ", positions " + std::to_string(c.chunk_begin) + ".." +
                  std::to_string(c.chunk_end - 1) + ") differs from the full forward by " + sci(c.first_bad_diff) +
                  " > tolerance " + sci(r.tolerance) + " (largest at " + c.worst + ")";
    break;
  }
  return r;
}

KVCacheReport require_kv_cache_equivalence(const KVCacheDecoder& decoder, const DecoderInput& input,
                                           const KVCacheCheckOptions& options) {
  KVCacheReport r = check_kv_cache(decoder, input, options);
  if (!r.passed) throw KVCacheMismatch(std::move(r));
  return r;
}

CheckResult to_check_result(const KVCacheReport& report) {
  CheckResult c;
  c.mode = "property";
  c.passed = report.passed;
  c.comparisons = report.comparisons.size();
  const KVComparison* worst = nullptr;
  for (const KVComparison& k : report.comparisons) {
    if (std::isnan(k.max_abs_diff) || k.max_abs_diff > c.max_abs_error) c.max_abs_error = k.max_abs_diff;
    if (!report.passed && !worst && !k.passed) worst = &k;
  }
  if (!worst)
    for (const KVComparison& k : report.comparisons)
      if (!worst || k.max_abs_diff > worst->max_abs_diff) worst = &k;
  if (worst && (worst->max_abs_diff > 0 || !worst->passed)) c.worst = worst->worst + " (" + worst->name + ")";
  c.message = report.summary();
  return c;
}

GradcheckSuite& add_kv_cache_check(GradcheckSuite& suite, const std::string& name, const std::string& config,
                                   std::function<KVCacheCheck(CheckContext&)> make) {
  if (!make) throw ValueError(op_message(kOp, "add_kv_cache_check(\"" + name + "\"): no function given"));
  return suite.add(name, "kv-cache", config, [make](CheckContext& ctx) {
    const KVCacheCheck k = make(ctx);
    return to_check_result(check_kv_cache(k.decoder, k.input, k.options));
  });
}

namespace detail {
bool register_default_kv_cache_check(const char* name, const char* config, KVCacheCheck (*fn)(CheckContext&)) {
  add_kv_cache_check(default_gradcheck_suite(), name, config, fn);
  return true;
}
}  // namespace detail

}  // namespace xg
