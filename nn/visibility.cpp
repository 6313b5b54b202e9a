#include <xgrad/nn/visibility.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>
#include <variant>

#include <xgrad/core/error.hpp>
#include <xgrad/core/detail/kernels.hpp>
#include <xgrad/core/detail/storage.hpp>
#include <xgrad/ops/mask.hpp>

namespace xg::nn {

namespace vis_detail {

// A "row" of a rule is one (b, h, i) of the rule's rank-4 shape [r0, r1, r2, S]; axes of size 1
// are shared by every b, h or i of the scores. Where a rule reads row (b, h, i) of the scores:
struct Row {
  std::size_t b, h, i;  // the indices into the rule's own axes (0 on a broadcast axis)
  std::size_t r;        // the flat row (b * r1 + h) * r2 + i
  std::size_t S;        // keys per row in the rule (1: one value for every key)
};

// Per-row bounding key ranges, precomputed once when a rule is built for the kinds whose
// visible keys are not a run found by binary search: [lo[r], hi[r]) holds every visible key
// of row r ([0, 0) when none) and exact[r] says whether every key in it is visible.
struct RowRanges {
  std::vector<std::size_t> lo, hi;
  std::vector<unsigned char> exact;

  RowRanges() = default;
  explicit RowRanges(std::size_t rows) : lo(rows, 0), hi(rows, 0), exact(rows, 1) {}

  // Row r has `count` visible keys, the first at `first` and the last at `end` - 1.
  void set(std::size_t r, std::size_t first, std::size_t end, std::size_t count) {
    if (count == 0) return;  // no visible key: the empty range [0, 0)
    lo[r] = first;
    hi[r] = end;
    exact[r] = count == end - first;
  }
  // The ranges of `rows` rows of S keys from the predicate visible(row, j), by a full scan.
  template <class Visible> static RowRanges scan(std::size_t rows, std::size_t S, Visible visible) {
    RowRanges out(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t lo = 0, hi = 0, count = 0;
      for (std::size_t j = 0; j < S; ++j)
        if (visible(r, j)) {
          if (count++ == 0) lo = j;
          hi = j + 1;
        }
      out.set(r, lo, hi, count);
    }
    return out;
  }
  bool narrow(std::size_t r, std::size_t& l, std::size_t& h) const {
    l = std::max(l, lo[r]);
    h = std::min(h, hi[r]);
    return exact[r] != 0;
  }
};

// The kinds of rule, a closed set: each is one struct with
//   hard               whether it only allows or forbids keys (false: a soft bias, hiding none)
//   narrow(row, l, h)  narrows [l, h) to the row's bounding range of visible keys and returns
//                      whether every key of that range is visible (the per-row key range)
//   apply(row, l, h, p) for keys l .. h-1 of the row (p[0] is key l): forbidden keys become
//                      -inf, soft biases are added
// and a new kind is one more struct here and in VisRule::Kind.
constexpr std::size_t kEveryKey = std::numeric_limits<std::size_t>::max();

// allowed / forbidden masks: allowed bytes in the rule's shape.
struct Dense {
  static constexpr bool hard = true;
  std::vector<unsigned char> allowed;
  RowRanges rows;

  Dense(const Shape& shape, std::vector<unsigned char> a) : allowed(std::move(a)) {
    const std::size_t n = shape[0] * shape[1] * shape[2], S = shape[3];
    if (S == 1) {  // one flag for every key of the scores' row
      rows = RowRanges(n);
      for (std::size_t r = 0; r < n; ++r) rows.hi[r] = allowed[r] ? kEveryKey : 0;
    } else {
      rows = RowRanges::scan(n, S, [&](std::size_t r, std::size_t j) { return allowed[r * S + j] != 0; });
    }
  }
  bool narrow(const Row& at, std::size_t& lo, std::size_t& hi) const { return rows.narrow(at.r, lo, hi); }
  template <class T> void apply(const Row& at, std::size_t lo, std::size_t hi, T* row) const {
    constexpr T ninf = -std::numeric_limits<T>::infinity();
    if (at.S == 1) {
      if (!allowed[at.r])
        for (std::size_t j = lo; j < hi; ++j) row[j - lo] = ninf;
      return;
    }
    const unsigned char* a = allowed.data() + at.r * at.S;
    for (std::size_t j = lo; j < hi; ++j)
      if (!a[j]) row[j - lo] = ninf;
  }
};

// additive: the finite part of an additive bias, in the rule's shape.
struct Soft {
  static constexpr bool hard = false;
  std::vector<double> bias;

  bool narrow(const Row&, std::size_t&, std::size_t&) const { return true; }
  template <class T> void apply(const Row& at, std::size_t lo, std::size_t hi, T* row) const {
    if (at.S == 1) {
      const T v = static_cast<T>(bias[at.r]);
      for (std::size_t j = lo; j < hi; ++j) row[j - lo] += v;
      return;
    }
    const double* v = bias.data() + at.r * at.S;
    for (std::size_t j = lo; j < hi; ++j) row[j - lo] += static_cast<T>(v[j]);
  }
};

// causal and sliding_window by absolute positions: key j visible to query i iff
// k_pos[j] <= q_pos[i] and, with a window W, q_pos[i] - W < k_pos[j]. With k_pos ascending the
// visible keys of a row are one run, found by binary search; otherwise each query row's
// bounding range is precomputed.
struct Causal {
  static constexpr bool hard = true;
  std::vector<std::int64_t> q_pos, k_pos;
  std::int64_t window = 0;  // 0: no window (plain causal)
  bool k_sorted = false;
  RowRanges rows;  // per query row, when !k_sorted

  Causal(std::vector<std::int64_t> q, std::vector<std::int64_t> k, std::int64_t W)
      : q_pos(std::move(q)), k_pos(std::move(k)), window(W), k_sorted(std::is_sorted(k_pos.begin(), k_pos.end())) {
    if (!k_sorted)
      rows = RowRanges::scan(q_pos.size(), k_pos.size(),
                             [&](std::size_t i, std::size_t j) { return visible(q_pos[i], k_pos[j]); });
  }
  // (q - k computed unsigned: exact for k <= q, so extreme positions cannot overflow.)
  bool visible(std::int64_t q, std::int64_t k) const {
    return k <= q && (window == 0 || static_cast<std::uint64_t>(q) - static_cast<std::uint64_t>(k) <
                                         static_cast<std::uint64_t>(window));
  }
  bool narrow(const Row& at, std::size_t& lo, std::size_t& hi) const {
    if (!k_sorted) return rows.narrow(at.i, lo, hi);
    const std::int64_t q = q_pos[at.i];
    auto first = k_pos.begin();  // the run (q - W, q]
    if (window != 0 && q >= std::numeric_limits<std::int64_t>::min() + window)  // else q - W underflows: unbounded
      first = std::upper_bound(k_pos.begin(), k_pos.end(), q - window);
    const auto end = std::upper_bound(first, k_pos.end(), q);
    lo = std::max(lo, static_cast<std::size_t>(first - k_pos.begin()));
    hi = std::min(hi, static_cast<std::size_t>(end - k_pos.begin()));
    return true;
  }
  template <class T> void apply(const Row& at, std::size_t lo, std::size_t hi, T* row) const {
    const std::int64_t q = q_pos[at.i];
    for (std::size_t j = lo; j < hi; ++j)
      if (!visible(q, k_pos[j])) row[j - lo] = -std::numeric_limits<T>::infinity();
  }
};

// documents: query ids [r0, T], key ids [r0, S] (both spread to the rule's batch), absolute
// positions q_pos [T], k_pos [S]; key j visible to query i iff k_doc[j] == q_doc[i] and (when
// causal) k_pos[j] <= q_pos[i]. Per (b, i): the bounding key range.
struct Documents {
  static constexpr bool hard = true;
  std::vector<std::int64_t> q_doc, k_doc, q_pos, k_pos;
  bool causal = true;
  RowRanges rows;

  bool narrow(const Row& at, std::size_t& lo, std::size_t& hi) const { return rows.narrow(at.r, lo, hi); }
  template <class T> void apply(const Row& at, std::size_t lo, std::size_t hi, T* row) const {
    const std::int64_t qd = q_doc[at.r], qp = q_pos[at.i];
    const std::int64_t* kd = k_doc.data() + at.b * at.S;
    for (std::size_t j = lo; j < hi; ++j)
      if (kd[j] != qd || (causal && k_pos[j] > qp)) row[j - lo] = -std::numeric_limits<T>::infinity();
  }
};

// alibi (soft, shape [1, H, T, S]): adds -slopes[h] * |q_pos[i] - k_pos[j]|; hides nothing.
struct Alibi {
  static constexpr bool hard = false;
  std::vector<double> slopes;
  std::vector<std::int64_t> q_pos, k_pos;

  bool narrow(const Row&, std::size_t&, std::size_t&) const { return true; }
  template <class T> void apply(const Row& at, std::size_t lo, std::size_t hi, T* row) const {
    const double m = slopes[at.h];
    const std::int64_t q = q_pos[at.i];
    for (std::size_t j = lo; j < hi; ++j) {
      const std::int64_t dist = q >= k_pos[j] ? q - k_pos[j] : k_pos[j] - q;
      row[j - lo] += static_cast<T>(-m * static_cast<double>(dist));
    }
  }
};

// available (SPEC 8, streaming sources): arrival times [r0, S] and query times [r0, T]; key j
// visible to query i of sample b iff arrival[b, j] <= query_time[b, i]. Per (b, i): the
// bounding key range.
struct Available {
  static constexpr bool hard = true;
  std::vector<std::int64_t> arrival, query_time;
  RowRanges rows;

  bool narrow(const Row& at, std::size_t& lo, std::size_t& hi) const { return rows.narrow(at.r, lo, hi); }
  template <class T> void apply(const Row& at, std::size_t lo, std::size_t hi, T* row) const {
    const std::int64_t t = query_time[at.r];
    const std::int64_t* a = arrival.data() + at.b * at.S;
    for (std::size_t j = lo; j < hi; ++j)
      if (a[j] > t) row[j - lo] = -std::numeric_limits<T>::infinity();
  }
};

// One rule of a Visibility: a kind and its rank-4 shape, which broadcasts against [B, H, T, S].
struct VisRule {
  using Kind = std::variant<Dense, Soft, Causal, Documents, Alibi, Available>;
  Shape shape;  // [r0, r1, r2, r3]
  Kind kind;

  VisRule(Shape s, Kind k) : shape(std::move(s)), kind(std::move(k)) {}

  Row row(std::size_t b, std::size_t h, std::size_t i) const {
    const std::size_t rb = shape[0] == 1 ? 0 : b, rh = shape[1] == 1 ? 0 : h, ri = shape[2] == 1 ? 0 : i;
    return {rb, rh, ri, (rb * shape[1] + rh) * shape[2] + ri, shape[3]};
  }
  bool hard() const {
    return std::visit([](const auto& k) { return std::decay_t<decltype(k)>::hard; }, kind);
  }
  // Narrows [lo, hi) to this rule's bounding range for the row; returns whether every key in
  // the rule's range is allowed by it.
  bool narrow(std::size_t b, std::size_t h, std::size_t i, std::size_t& lo, std::size_t& hi) const {
    const Row at = row(b, h, i);
    return std::visit([&](const auto& k) { return k.narrow(at, lo, hi); }, kind);
  }
  template <class T>
  void apply(std::size_t b, std::size_t h, std::size_t i, std::size_t lo, std::size_t hi, T* p) const {
    const Row at = row(b, h, i);
    std::visit([&](const auto& k) { k.apply(at, lo, hi, p); }, kind);
  }
};

struct VisCache {
  std::mutex mutex;
  Array bias32, bias64;
};

}  // namespace vis_detail

namespace {

const char* kOp = "visibility";
using vis_detail::VisRule;

// [T, S] -> [1, 1, T, S]; [B, T, S] -> [B, 1, T, S] (every head); rank 4 kept; anything
// else is an error.
Shape to_rank4(const Shape& s, const std::string& what) {
  if (s.size() == 2) return {1, 1, s[0], s[1]};
  if (s.size() == 3) return {s[0], 1, s[1], s[2]};
  if (s.size() == 4) return s;
  throw ShapeError(op_message(kOp, what + " must be [T, S], [B, T, S] or [B, H, T, S], has shape " + shape_str(s)));
}

std::size_t non_negative(Position v, const std::string& what) {
  if (v < 0) throw ValueError(op_message(kOp, what + " must be >= 0, got " + std::to_string(v)));
  return static_cast<std::size_t>(v);
}

std::string positions_str(std::size_t n) { return std::to_string(n) + (n == 1 ? " entry" : " entries"); }

std::shared_ptr<VisRule> dense_rule(const Shape& shape, std::vector<unsigned char> allowed) {
  return std::make_shared<VisRule>(shape, vis_detail::Dense(shape, std::move(allowed)));
}

std::shared_ptr<VisRule> from_bools(const BoolArray& m, bool true_means_allowed, const std::string& what) {
  const Shape s = to_rank4(m.shape, what);
  std::vector<unsigned char> a(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) a[i] = (m.data[i] != 0) == true_means_allowed;
  return dense_rule(s, std::move(a));
}

}  // namespace

Visibility::Visibility(std::shared_ptr<const vis_detail::VisRule> rule) : cache_(std::make_shared<vis_detail::VisCache>()) {
  rules_.push_back(std::move(rule));
}

Visibility Visibility::all() { return Visibility(); }

Visibility Visibility::allowed(const BoolArray& m) { return Visibility(from_bools(m, true, "allowed mask")); }

Visibility Visibility::forbidden(const BoolArray& m) { return Visibility(from_bools(m, false, "forbidden mask")); }

Visibility Visibility::additive(const Array& bias) {
  const Shape s = to_rank4(bias.shape(), "additive bias");
  ops::check_additive_bias(kOp, bias);
  const auto b = bias.to_vector();
  vis_detail::Soft soft;
  soft.bias.resize(b.size());
  std::vector<unsigned char> a(b.size());
  bool any_forbidden = false;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const bool forbid = std::isinf(b[i]);
    any_forbidden = any_forbidden || forbid;
    a[i] = !forbid;
    soft.bias[i] = forbid ? 0.0 : b[i];
  }
  Visibility v(std::make_shared<VisRule>(s, std::move(soft)));
  if (any_forbidden) v.rules_.insert(v.rules_.begin(), dense_rule(s, std::move(a)));
  return v;
}

Visibility Visibility::causal(const std::vector<std::int64_t>& q_pos, const std::vector<std::int64_t>& k_pos) {
  return Visibility(std::make_shared<VisRule>(Shape{1, 1, q_pos.size(), k_pos.size()},
                                             vis_detail::Causal(q_pos, k_pos, 0)));
}

Visibility Visibility::causal(Position T_, Position S_) {
  const std::size_t T = non_negative(T_, "causal(T, S): T"), S = non_negative(S_, "causal(T, S): S");
  if (T > S)
    throw ShapeError(op_message(kOp, "causal(T, S) aligns T queries with the last T of S keys; T (" +
                                         std::to_string(T) + ") exceeds S (" + std::to_string(S) +
                                         "). Pass absolute positions for other layouts"));
  std::vector<std::int64_t> q(T), k(S);
  for (std::size_t j = 0; j < S; ++j) k[j] = static_cast<std::int64_t>(j);
  for (std::size_t i = 0; i < T; ++i) q[i] = static_cast<std::int64_t>(S - T + i);
  return causal(q, k);
}

Visibility Visibility::sliding_window(const std::vector<Position>& q_pos, const std::vector<Position>& k_pos,
                                      Position W) {
  if (W < 1)
    throw ValueError(op_message(kOp, "sliding_window: the window W must be >= 1 (W = 1: each query sees only its own "
                                     "position), got W = " + std::to_string(W)));
  return Visibility(std::make_shared<VisRule>(Shape{1, 1, q_pos.size(), k_pos.size()},
                                             vis_detail::Causal(q_pos, k_pos, W)));
}

Visibility Visibility::sliding_window(Position T_, Position S_, Position W) {
  const std::size_t T = non_negative(T_, "sliding_window(T, S, W): T"), S = non_negative(S_, "sliding_window(T, S, W): S");
  if (T > S)
    throw ShapeError(op_message(kOp, "sliding_window(T, S, W) aligns T queries with the last T of S keys; T (" +
                                         std::to_string(T) + ") exceeds S (" + std::to_string(S) +
                                         "). Pass absolute positions for other layouts"));
  std::vector<std::int64_t> q(T), k(S);
  for (std::size_t j = 0; j < S; ++j) k[j] = static_cast<std::int64_t>(j);
  for (std::size_t i = 0; i < T; ++i) q[i] = static_cast<std::int64_t>(S - T + i);
  return sliding_window(q, k, W);
}

Visibility Visibility::key_lengths(const std::vector<Position>& lengths, Position S_) {
  const std::size_t S = non_negative(S_, "key_lengths: S");
  BoolArray valid = BoolArray::filled({lengths.size(), S}, false);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const std::size_t len = non_negative(lengths[b], "key_lengths: length of sample " + std::to_string(b));
    if (len > S)
      throw ShapeError(op_message(kOp, "key length " + std::to_string(len) + " of sample " +
                                           std::to_string(b) + " exceeds S (" + std::to_string(S) + ")"));
    for (std::size_t j = 0; j < len; ++j) valid.data[b * S + j] = 1;
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

Visibility Visibility::documents(const IndexArray& doc_ids, bool causal) {
  const Shape& s = doc_ids.shape;
  if (s.size() != 1 && s.size() != 2)
    throw ShapeError(op_message(kOp, "documents: document ids must be [T] or [B, T], have shape " + shape_str(s)));
  std::vector<Position> pos(s.back());
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<Position>(i);
  return documents(doc_ids, doc_ids, pos, pos, causal);
}

Visibility Visibility::documents(const IndexArray& q_doc, const IndexArray& k_doc, const std::vector<Position>& q_pos,
                                 const std::vector<Position>& k_pos, bool causal) {
  const Shape &qs = q_doc.shape, &ks = k_doc.shape;
  if (qs.size() != 1 && qs.size() != 2)
    throw ShapeError(op_message(kOp, "documents: query document ids must be [T] or [B, T], have shape " + shape_str(qs)));
  if (ks.size() != 1 && ks.size() != 2)
    throw ShapeError(op_message(kOp, "documents: key document ids must be [S] or [B, S], have shape " + shape_str(ks)));
  const std::size_t T = qs.back(), S = ks.back();
  const std::size_t Bq = qs.size() == 2 ? qs[0] : 1, Bk = ks.size() == 2 ? ks[0] : 1;
  if (qs.size() == 2 && ks.size() == 2 && Bq != Bk)
    throw ShapeError(op_message(kOp, "documents: query document ids " + shape_str(qs) + " and key document ids " +
                                         shape_str(ks) + " have different batch sizes"));
  if (q_pos.size() != T)
    throw ShapeError(op_message(kOp, "documents: q_pos has " + positions_str(q_pos.size()) +
                                         ", the query document ids " + shape_str(qs) + " have T = " + std::to_string(T)));
  if (k_pos.size() != S)
    throw ShapeError(op_message(kOp, "documents: k_pos has " + positions_str(k_pos.size()) +
                                         ", the key document ids " + shape_str(ks) + " have S = " + std::to_string(S)));
  const std::size_t B = std::max(Bq, Bk);
  vis_detail::Documents d;
  d.causal = causal;
  d.q_pos = q_pos;
  d.k_pos = k_pos;
  // Both id arrays spread to B rows, so a rule row needs no broadcasting logic.
  d.q_doc.resize(B * T);
  d.k_doc.resize(B * S);
  for (std::size_t b = 0; b < B; ++b) {
    std::copy_n(q_doc.data.begin() + static_cast<std::ptrdiff_t>((Bq == 1 ? 0 : b) * T), T, d.q_doc.begin() + b * T);
    std::copy_n(k_doc.data.begin() + static_cast<std::ptrdiff_t>((Bk == 1 ? 0 : b) * S), S, d.k_doc.begin() + b * S);
  }
  // Per row: the visible keys are those of the query's document (with k_pos <= q_pos when
  // causal). Keys of each document are listed in index order; with ascending k_pos the
  // causal ones are a prefix of that list (binary search), otherwise the list is scanned.
  const bool k_sorted = std::is_sorted(k_pos.begin(), k_pos.end());
  d.rows = vis_detail::RowRanges(B * T);
  for (std::size_t b = 0; b < B; ++b) {
    std::map<std::int64_t, std::vector<std::size_t>> keys_of;
    for (std::size_t j = 0; j < S; ++j) keys_of[d.k_doc[b * S + j]].push_back(j);
    for (std::size_t i = 0; i < T; ++i) {
      const std::size_t row = b * T + i;
      const auto it = keys_of.find(d.q_doc[row]);
      if (it == keys_of.end()) continue;  // no key of this document: empty row
      const std::vector<std::size_t>& js = it->second;
      std::size_t lo = S, hi = 0, count = 0;
      if (!causal || k_sorted) {
        count = js.size();
        if (causal)
          count = static_cast<std::size_t>(
              std::upper_bound(js.begin(), js.end(), q_pos[i], [&](Position q, std::size_t j) { return q < k_pos[j]; }) -
              js.begin());
        if (count > 0) {
          lo = js.front();
          hi = js[count - 1] + 1;
        }
      } else {
        for (const std::size_t j : js)
          if (k_pos[j] <= q_pos[i]) {
            lo = std::min(lo, j);
            hi = j + 1;
            ++count;
          }
      }
      d.rows.set(row, lo, hi, count);
    }
  }
  return Visibility(std::make_shared<VisRule>(Shape{B, 1, T, S}, std::move(d)));
}

Visibility Visibility::alibi(const std::vector<double>& slopes, const std::vector<Position>& q_pos,
                             const std::vector<Position>& k_pos) {
  if (slopes.empty()) throw ValueError(op_message(kOp, "alibi: needs one slope per head, got none"));
  for (std::size_t h = 0; h < slopes.size(); ++h)
    if (!(std::isfinite(slopes[h]) && slopes[h] >= 0.0))
      throw ValueError(op_message(kOp, "alibi: slope of head " + std::to_string(h) + " is " +
                                           std::to_string(slopes[h]) + "; slopes must be finite and >= 0"));
  for (const auto* ps : {&q_pos, &k_pos})
    for (const Position p : *ps)
      if (p < 0)
        throw ValueError(op_message(kOp, std::string("alibi: ") + (ps == &q_pos ? "q_pos" : "k_pos") +
                                             " has the position " + std::to_string(p) + "; positions must be >= 0"));
  return Visibility(std::make_shared<VisRule>(Shape{1, slopes.size(), q_pos.size(), k_pos.size()},
                                             vis_detail::Alibi{slopes, q_pos, k_pos}));
}

std::vector<double> alibi_slopes(std::size_t H) {
  if (H == 0) throw ValueError(op_message(kOp, "alibi_slopes: H must be positive, got 0"));
  // slopes of n heads, n a power of two: 2^(-8 (h+1) / n)
  const auto pow2_slopes = [](std::size_t n) {
    std::vector<double> s(n);
    for (std::size_t h = 0; h < n; ++h) s[h] = std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n));
    return s;
  };
  std::size_t n = 1;
  while (n * 2 <= H) n *= 2;
  std::vector<double> s = pow2_slopes(n);
  if (n == H) return s;
  const std::vector<double> extra = pow2_slopes(2 * n);
  for (std::size_t k = 0; s.size() < H; k += 2) s.push_back(extra[k]);
  return s;
}

// ---- available (SPEC 8): streaming sources
Visibility Visibility::available(const IndexArray& arrival, const IndexArray& query_time) {
  const std::string op = "available(arrival, query_time)";
  const Shape &as = arrival.shape, &ts = query_time.shape;
  if (as.size() != 1 && as.size() != 2)
    throw ShapeError(op_message(kOp, op + ": arrival must be [S] or [B, S], has shape " + shape_str(as)));
  if (ts.size() != 1 && ts.size() != 2)
    throw ShapeError(op_message(kOp, op + ": query_time must be [T] or [B, T], has shape " + shape_str(ts)));
  const std::size_t S = as.back(), T = ts.back();
  const std::size_t Ba = as.size() == 2 ? as[0] : 1, Bt = ts.size() == 2 ? ts[0] : 1;
  if (as.size() == 2 && ts.size() == 2 && Ba != Bt)
    throw ShapeError(op_message(kOp, op + ": arrival " + shape_str(as) + " and query_time " + shape_str(ts) +
                                         " have different batch sizes"));
  for (std::size_t k = 0; k < arrival.size(); ++k)
    if (arrival.data[k] < 0)
      throw ValueError(op_message(kOp, op + ": arrival times must be >= 0, got " + std::to_string(arrival.data[k]) +
                                           " at index (" + index_list(unravel_index(k, as)) + ")"));
  for (std::size_t k = 0; k < query_time.size(); ++k)
    if (query_time.data[k] < 0)
      throw ValueError(op_message(kOp, op + ": query times must be >= 0, got " + std::to_string(query_time.data[k]) +
                                           " at index (" + index_list(unravel_index(k, ts)) + ")"));
  const std::size_t B = std::max(Ba, Bt);
  vis_detail::Available r;
  r.arrival.resize(B * S);
  r.query_time.resize(B * T);
  for (std::size_t b = 0; b < B; ++b) {
    std::copy_n(arrival.data.begin() + static_cast<std::ptrdiff_t>((Ba == 1 ? 0 : b) * S), S, r.arrival.begin() + b * S);
    std::copy_n(query_time.data.begin() + static_cast<std::ptrdiff_t>((Bt == 1 ? 0 : b) * T), T,
                r.query_time.begin() + b * T);
  }
  // Per row the bounding range of the visible keys; with arrival times ascending in the
  // source position (the usual stream) the visible keys are a prefix, found by binary search.
  r.rows = vis_detail::RowRanges(B * T);
  for (std::size_t b = 0; b < B; ++b) {
    const auto first = r.arrival.begin() + static_cast<std::ptrdiff_t>(b * S);
    const bool sorted = std::is_sorted(first, first + static_cast<std::ptrdiff_t>(S));
    for (std::size_t i = 0; i < T; ++i) {
      const std::size_t row = b * T + i;
      const std::int64_t t = r.query_time[row];
      std::size_t lo = S, hi = 0, count = 0;
      if (sorted) {
        count = static_cast<std::size_t>(std::upper_bound(first, first + static_cast<std::ptrdiff_t>(S), t) - first);
        if (count > 0) {
          lo = 0;
          hi = count;
        }
      } else {
        for (std::size_t j = 0; j < S; ++j)
          if (r.arrival[b * S + j] <= t) {
            lo = std::min(lo, j);
            hi = j + 1;
            ++count;
          }
      }
      r.rows.set(row, lo, hi, count);
    }
  }
  return Visibility(std::make_shared<VisRule>(Shape{B, 1, T, S}, std::move(r)));
}

Visibility Visibility::operator&(const Visibility& o) const {
  if (!unconstrained() && !o.unconstrained())
    broadcast_shapes(kOp, "left visibility", shape(), "right visibility", o.shape());
  Visibility v;
  v.rules_ = rules_;
  v.rules_.insert(v.rules_.end(), o.rules_.begin(), o.rules_.end());
  if (!v.rules_.empty()) v.cache_ = std::make_shared<vis_detail::VisCache>();
  return v;
}

Shape Visibility::shape() const {
  if (rules_.empty()) return {1, 1, 1, 1};
  Shape s = rules_[0]->shape;
  for (std::size_t k = 1; k < rules_.size(); ++k) s = broadcast_shapes(kOp, "visibility", s, "rule", rules_[k]->shape);
  return s;
}

VisibilityPlan Visibility::plan(const std::string& op, const Shape& BHTS) const {
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
  VisibilityPlan p;
  p.rules_ = rules_;
  p.BHTS_ = BHTS;
  return p;
}

bool VisibilityPlan::range(std::size_t b, std::size_t h, std::size_t i, std::size_t& lo, std::size_t& hi) const {
  lo = 0;
  hi = BHTS_[3];
  bool exact = true;
  for (const auto& r : rules_) exact = r->narrow(b, h, i, lo, hi) && r->hard() && exact;
  if (hi < lo) hi = lo;
  return exact;
}

bool VisibilityPlan::head_independent() const {
  for (const auto& r : rules_)
    if (r->shape[1] != 1) return false;
  return true;
}

bool VisibilityPlan::has_soft() const {
  for (const auto& r : rules_)
    if (!r->hard()) return true;
  return false;
}

namespace {
template <class T>
void apply_rules(const std::vector<std::shared_ptr<const VisRule>>& rules, std::size_t b, std::size_t h,
                 std::size_t i, std::size_t lo, std::size_t hi, T* row) {
  for (const auto& r : rules) {
    std::size_t l = 0, u = std::numeric_limits<std::size_t>::max();
    const bool exact = r->narrow(b, h, i, l, u);
    // Keys of [lo, hi) outside this rule's range are forbidden by it.
    for (std::size_t j = lo; j < std::min(hi, l); ++j) row[j - lo] = -std::numeric_limits<T>::infinity();
    for (std::size_t j = std::max(lo, u); j < hi; ++j) row[j - lo] = -std::numeric_limits<T>::infinity();
    const std::size_t a = std::max(lo, l), e = std::min(hi, u);
    if (a < e && (!exact || !r->hard())) r->apply(b, h, i, a, e, row + (a - lo));
  }
}
}  // namespace

void VisibilityPlan::apply(std::size_t b, std::size_t h, std::size_t i, std::size_t lo, std::size_t hi,
                           float* row) const {
  apply_rules(rules_, b, h, i, lo, hi, row);
}
void VisibilityPlan::apply(std::size_t b, std::size_t h, std::size_t i, std::size_t lo, std::size_t hi,
                           double* row) const {
  apply_rules(rules_, b, h, i, lo, hi, row);
}

Array Visibility::bias(DType dtype) const {
  const Shape s = shape();
  if (rules_.empty()) return Array::zeros(s, dtype);
  std::lock_guard<std::mutex> lock(cache_->mutex);
  Array& slot = dtype == DType::float32 ? cache_->bias32 : cache_->bias64;
  if (slot.defined()) return slot;
  const VisibilityPlan p = plan(kOp, s);
  Array out = Array::zeros(s, dtype);
  detail::dispatch(dtype, [&](auto t) {
    using T = decltype(t);
    T* o = out.data<T>();
    for (std::size_t b = 0; b < s[0]; ++b)
      for (std::size_t h = 0; h < s[1]; ++h)
        for (std::size_t i = 0; i < s[2]; ++i) p.apply(b, h, i, 0, s[3], o + ((b * s[1] + h) * s[2] + i) * s[3]);
  });
  slot = out;
  return out;
}

std::vector<unsigned char> Visibility::expand_allowed(const std::string& op, const Shape& BHTS) const {
  const VisibilityPlan p = plan(op, BHTS);
  std::vector<unsigned char> out(numel(BHTS), 1);
  if (rules_.empty()) return out;
  const std::size_t S = BHTS[3];
  std::vector<double> row(S);
  for (std::size_t b = 0; b < BHTS[0]; ++b)
    for (std::size_t h = 0; h < BHTS[1]; ++h)
      for (std::size_t i = 0; i < BHTS[2]; ++i) {
        std::fill(row.begin(), row.end(), 0.0);
        p.apply(b, h, i, 0, S, row.data());
        unsigned char* o = out.data() + ((b * BHTS[1] + h) * BHTS[2] + i) * S;
        for (std::size_t j = 0; j < S; ++j) o[j] = row[j] != -std::numeric_limits<double>::infinity();
      }
  return out;
}

BoolArray valid_queries_from_lengths(const std::vector<Position>& lengths, Position T_) {
  const std::size_t T = non_negative(T_, "valid_queries_from_lengths: T");
  BoolArray v = BoolArray::filled({lengths.size(), T}, false);
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    const std::size_t len = non_negative(lengths[b], "valid_queries_from_lengths: length of sample " + std::to_string(b));
    if (len > T)
      throw ShapeError(op_message("visibility", "query length " + std::to_string(len) + " of sample " +
                                                    std::to_string(b) + " exceeds T (" + std::to_string(T) + ")"));
    for (std::size_t i = 0; i < len; ++i) v.data[b * T + i] = 1;
  }
  return v;
}

}  // namespace xg::nn
