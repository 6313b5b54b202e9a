// Visibility (SPEC 3): polarity made explicit, absolute-position causal masks, key padding,
// documents, intersection, and the conversion to the internal "allowed" convention.
#include <limits>

#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xg::nn;
using namespace xgt;

namespace {
const double kInf = std::numeric_limits<double>::infinity();

// allowed[i][j] of a [1, 1, T, S] visibility, as 0/1 rows.
std::vector<std::vector<int>> table(const Visibility& v, std::size_t T, std::size_t S) {
  const auto a = v.expand_allowed("test", {1, 1, T, S});
  std::vector<std::vector<int>> t(T, std::vector<int>(S));
  for (std::size_t i = 0; i < T; ++i)
    for (std::size_t j = 0; j < S; ++j) t[i][j] = a[i * S + j];
  return t;
}
using Table = std::vector<std::vector<int>>;
}  // namespace

TEST_CASE("visibility: the same bool array read as allowed and as forbidden gives complements (SPEC 3.3)",
          "[nn][visibility]") {
  const BoolArray m({2, 3}, {1, 0, 1, 0, 1, 1});
  const Table allowed = table(Visibility::allowed(m), 2, 3);
  const Table forbidden = table(Visibility::forbidden(m), 2, 3);
  const Table expect_allowed{{1, 0, 1}, {0, 1, 1}};
  const Table expect_forbidden{{0, 1, 0}, {1, 0, 0}};
  CHECK(allowed == expect_allowed);
  CHECK(forbidden == expect_forbidden);
}

TEST_CASE("visibility: additive masks: -inf forbids and finite values are soft biases (SPEC 3.2)", "[nn][visibility]") {
  const Array M = Array::of({{0.0, -kInf, -2.0}});
  const Visibility v = Visibility::additive(M);
  const Table expect{{1, 0, 1}};
  CHECK(table(v, 1, 3) == expect);  // -2 is still allowed
  const Array b = v.bias(DType::float64);
  CHECK(b.at({0, 0, 0, 0}) == 0.0);
  CHECK(b.at({0, 0, 0, 1}) == -kInf);
  CHECK(b.at({0, 0, 0, 2}) == -2.0);
  CHECK_THROWS_WITH(Visibility::additive(Array::of({{0.0, NAN}})), Catch::Contains("[visibility]"));
  CHECK_THROWS_AS(Visibility::additive(Array::full({1, 1}, kInf, DType::float64)), ValueError);
}

TEST_CASE("visibility: causal by absolute positions for T == S and bottom-right T < S (5.12 and SPEC 3.6)",
          "[nn][visibility][spec]") {
  const Table square{{1, 0, 0}, {1, 1, 0}, {1, 1, 1}};
  CHECK(table(Visibility::causal(3, 3), 3, 3) == square);
  // Keys at 0..3, one query at 3: it sees all four keys.
  const Table one{{1, 1, 1, 1}};
  CHECK(table(Visibility::causal({3}, {0, 1, 2, 3}), 1, 4) == one);
  CHECK(table(Visibility::causal(1, 4), 1, 4) == one);
  // Two new queries over a cached prefix of 3: bottom-right aligned, never top-left.
  const Table suffix{{1, 1, 1, 1, 0}, {1, 1, 1, 1, 1}};
  CHECK(table(Visibility::causal(2, 5), 2, 5) == suffix);
  CHECK(table(Visibility::causal({3, 4}, {0, 1, 2, 3, 4}), 2, 5) == suffix);
  CHECK_THROWS_WITH(Visibility::causal(4, 3), Catch::Contains("T (4) exceeds S (3)"));
}

TEST_CASE("visibility: key padding broadcasts to every head and query row (SPEC 3.5)", "[nn][visibility]") {
  const Visibility v = Visibility::key_lengths({2, 3}, 4);
  CHECK(v.shape() == Shape{2, 1, 1, 4});
  const auto a = v.expand_allowed("test", {2, 3, 2, 4});  // B=2, H=3, T=2, S=4
  for (std::size_t h = 0; h < 3; ++h)
    for (std::size_t i = 0; i < 2; ++i)
      for (std::size_t j = 0; j < 4; ++j) {
        CHECK(a[((0 * 3 + h) * 2 + i) * 4 + j] == (j < 2));
        CHECK(a[((1 * 3 + h) * 2 + i) * 4 + j] == (j < 3));
      }
  const BoolArray pad({2, 4}, {0, 0, 1, 1, 0, 0, 0, 1});
  const BoolArray valid({2, 4}, {1, 1, 0, 0, 1, 1, 1, 0});
  CHECK(Visibility::padded_keys(pad).expand_allowed("t", {2, 1, 1, 4}) == v.expand_allowed("t", {2, 1, 1, 4}));
  CHECK(Visibility::valid_keys(valid).expand_allowed("t", {2, 1, 1, 4}) == v.expand_allowed("t", {2, 1, 1, 4}));
  CHECK_THROWS_AS(Visibility::key_lengths({5}, 4), ShapeError);
}

TEST_CASE("visibility: padding keys does not silence padded queries / invalid queries do (SPEC 3.5 and SPEC 3.8)",
          "[nn][visibility][attention]") {
  Generator g(211);
  const Tensor Q(rnd({1, 1, 3, 2}, g)), K(rnd({1, 1, 3, 2}, g)), V(rnd({1, 1, 3, 2}, g, 0.5, 1.0));
  const Visibility pad = Visibility::key_lengths({2}, 3);  // position 2 is padding
  const Array O = attention(Q, K, V, pad).value();
  CHECK(std::fabs(O.at({0, 0, 2, 0})) > 0.1);  // the padded query still reads the valid keys
  SdpaOptions o;
  o.query_valid = valid_queries_from_lengths({2}, 3);
  const Array O2 = attention(Q, K, V, pad, o).value();
  CHECK(O2.at({0, 0, 2, 0}) == 0.0);
  CHECK(O2.at({0, 0, 2, 1}) == 0.0);
}

TEST_CASE("visibility: documents are block-diagonal and causal inside each document (SPEC 3.7)", "[nn][visibility]") {
  const Table expect{{1, 0, 0, 0, 0}, {1, 1, 0, 0, 0}, {0, 0, 1, 0, 0}, {0, 0, 1, 1, 0}, {0, 0, 1, 1, 1}};
  CHECK(table(Visibility::documents(IndexArray{7, 7, 9, 9, 9}), 5, 5) == expect);
  const Visibility per_sample = Visibility::documents(IndexArray({2, 3}, {0, 0, 0, 0, 1, 1}));
  const auto a = per_sample.expand_allowed("t", {2, 1, 3, 3});
  CHECK(a[(0 * 3 + 2) * 3 + 0] == 1);  // sample 0: one document, plain causal
  CHECK(a[(1 * 3 + 1) * 3 + 0] == 0);  // sample 1: query 1 starts a new document
  CHECK(a[(1 * 3 + 2) * 3 + 1] == 1);
}

TEST_CASE("visibility: constraints combine by intersection / soft biases add (SPEC 3.4)", "[nn][visibility]") {
  const Visibility v = Visibility::causal(3, 3) & Visibility::key_lengths({2}, 3);
  const Table expect{{1, 0, 0}, {1, 1, 0}, {1, 1, 0}};
  CHECK(table(v, 3, 3) == expect);
  const Visibility soft = Visibility::additive(Array::of({{-1.0, 0.0, -kInf}})) &
                          Visibility::additive(Array::of({{-0.5, -kInf, 0.0}}));
  const Array b = soft.bias(DType::float64);
  CHECK(b.at({0, 0, 0, 0}) == -1.5);
  CHECK(b.at({0, 0, 0, 1}) == -kInf);
  CHECK(b.at({0, 0, 0, 2}) == -kInf);
  CHECK(Visibility::all().unconstrained());
  CHECK(table(Visibility::all() & Visibility::causal(2, 2), 2, 2) == table(Visibility::causal(2, 2), 2, 2));
}

TEST_CASE("visibility: a mask that does not fit the scores names both shapes", "[nn][visibility][errors]") {
  const Tensor Q(Array::zeros({1, 1, 2, 4}, DType::float64)), K(Array::zeros({1, 1, 3, 4}, DType::float64));
  CHECK_THROWS_WITH(attention(Q, K, K, Visibility::causal(3, 3)),
                    Catch::Contains("[attention]") && Catch::Contains("(1, 1, 3, 3)") && Catch::Contains("(1, 1, 2, 3)"));
  CHECK_THROWS_WITH(Visibility::allowed(BoolArray::filled({3}, true)), Catch::Contains("[T, S], [B, T, S] or [B, H, T, S]"));
}

TEST_CASE("visibility: B x T x S masks apply to every head", "[nn][visibility]") {
  // Sample 0 allows the diagonal, sample 1 its complement; the head axis is implied.
  const BoolArray m({2, 2, 2}, {1, 0, 0, 1, 0, 1, 1, 0});
  for (const bool as_allowed : {true, false}) {
    const Visibility v = as_allowed ? Visibility::allowed(m) : Visibility::forbidden(m);
    CHECK(v.shape() == Shape{2, 1, 2, 2});
    const auto a = v.expand_allowed("test", {2, 3, 2, 2});  // B 2, H 3
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t h = 0; h < 3; ++h)
        for (std::size_t i = 0; i < 2; ++i)
          for (std::size_t j = 0; j < 2; ++j) {
            const bool given = m.data[(b * 2 + i) * 2 + j] != 0;
            CHECK(a[((b * 3 + h) * 2 + i) * 2 + j] == (as_allowed ? given : !given));
          }
  }
  const Array bias = Array::from_vector({2, 1, 2}, {0.0, -1.5, -std::numeric_limits<double>::infinity(), 0.0},
                                        DType::float64);
  const Array b4 = Visibility::additive(bias).bias(DType::float64);
  CHECK(b4.shape() == Shape{2, 1, 1, 2});
  CHECK(b4.at({0, 0, 0, 1}) == -1.5);
  CHECK(b4.at({1, 0, 0, 0}) == -kInf);
  CHECK_THROWS_WITH(Visibility::allowed(BoolArray::filled({2}, true)), Catch::Contains("[T, S], [B, T, S] or [B, H, T, S]"));
}

namespace {
// The document rule from its definition: key j visible to query i iff same document and,
// when causal, k_pos[j] <= q_pos[i].
Table documents_by_definition(const std::vector<std::int64_t>& q_doc, const std::vector<std::int64_t>& k_doc,
                              const std::vector<std::int64_t>& q_pos, const std::vector<std::int64_t>& k_pos,
                              bool causal) {
  Table t(q_doc.size(), std::vector<int>(k_doc.size()));
  for (std::size_t i = 0; i < q_doc.size(); ++i)
    for (std::size_t j = 0; j < k_doc.size(); ++j)
      t[i][j] = k_doc[j] == q_doc[i] && (!causal || k_pos[j] <= q_pos[i]);
  return t;
}
}  // namespace

TEST_CASE("visibility: documents with their own query ids and positions (T != S) both causal and bidirectional",
          "[nn][visibility]") {
  // A packed prefix of 6 keys (documents 0, 0, 1, 1, 1, 2) and a suffix of 3 queries at
  // positions 6..8 that continue document 2, then start document 3: the cached-prefix case.
  const std::vector<std::int64_t> k_doc{0, 0, 1, 1, 1, 2, 2, 3, 3}, k_pos{0, 1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::int64_t> q_doc{2, 3, 3}, q_pos{6, 7, 8};
  for (const bool causal : {true, false}) {
    const Visibility v = Visibility::documents(IndexArray({3}, q_doc), IndexArray({9}, k_doc), q_pos, k_pos, causal);
    CHECK(table(v, 3, 9) == documents_by_definition(q_doc, k_doc, q_pos, k_pos, causal));
  }
  // Equals the last rows of the square mask over all 9 positions.
  const Table full = table(Visibility::documents(IndexArray({9}, k_doc)), 9, 9);
  const Table suffix = table(Visibility::documents(IndexArray({3}, q_doc), IndexArray({9}, k_doc), q_pos, k_pos), 3, 9);
  CHECK(suffix == Table(full.begin() + 6, full.end()));
  // Bidirectional square form: whole blocks.
  const Table bidi = table(Visibility::documents(IndexArray({4}, {5, 5, 7, 7}), /*causal=*/false), 4, 4);
  const Table blocks{{1, 1, 0, 0}, {1, 1, 0, 0}, {0, 0, 1, 1}, {0, 0, 1, 1}};
  CHECK(bidi == blocks);
  // Keys in any order (a non-contiguous document, unsorted positions) and per-sample ids.
  const std::vector<std::int64_t> kd2{4, 9, 4, 4}, kp2{3, 0, 1, 2}, qd2{4, 9}, qp2{2, 1};
  CHECK(table(Visibility::documents(IndexArray({2}, qd2), IndexArray({4}, kd2), qp2, kp2), 2, 4) ==
        documents_by_definition(qd2, kd2, qp2, kp2, true));
  const Visibility batched =
      Visibility::documents(IndexArray({2, 2}, {0, 1, 1, 1}), IndexArray({3}, {0, 1, 1}), {1, 2}, {0, 1, 2});
  CHECK(batched.shape() == Shape{2, 1, 2, 3});
  const auto a = batched.expand_allowed("test", {2, 1, 2, 3});
  CHECK(std::vector<unsigned char>(a.begin(), a.begin() + 6) == std::vector<unsigned char>{1, 0, 0, 0, 1, 1});
  CHECK(std::vector<unsigned char>(a.begin() + 6, a.end()) == std::vector<unsigned char>{0, 1, 0, 0, 1, 1});
}

TEST_CASE("visibility: document rules with disagreeing sizes and negative positions or lengths are named errors",
          "[nn][visibility][errors]") {
  CHECK_THROWS_WITH(Visibility::documents(IndexArray({2}, {0, 0}), IndexArray({3}, {0, 0, 0}), {0, 1, 2}, {0, 1, 2}),
                    Catch::Contains("documents: q_pos has 3 entries") && Catch::Contains("T = 2"));
  CHECK_THROWS_WITH(Visibility::documents(IndexArray({2}, {0, 0}), IndexArray({3}, {0, 0, 0}), {0, 1}, {0, 1}),
                    Catch::Contains("documents: k_pos has 2 entries") && Catch::Contains("S = 3"));
  CHECK_THROWS_WITH(Visibility::documents(IndexArray({2, 1}, {0, 0}), IndexArray({3, 1}, {0, 0, 0}), {0}, {0}),
                    Catch::Contains("different batch sizes"));
  CHECK_THROWS_AS(Visibility::documents(IndexArray({1, 1, 1}, {0}), false), ShapeError);
  CHECK_THROWS_WITH(Visibility::key_lengths({2, -1}, 4), Catch::Contains("length of sample 1 must be >= 0, got -1"));
  CHECK_THROWS_AS(Visibility::causal(-1, 3), ValueError);
  CHECK_THROWS_AS(valid_queries_from_lengths({1}, -2), ValueError);
}

TEST_CASE("visibility: documents on the fused and composed attention paths agree for a cached suffix",
          "[nn][visibility][attention]") {
  Generator g(5);
  const std::vector<std::int64_t> k_doc{0, 0, 1, 1, 1, 2, 2, 3, 3}, q_doc{2, 3, 3};
  const Visibility v = Visibility::documents(IndexArray({3}, q_doc), IndexArray({9}, k_doc), {6, 7, 8},
                                             {0, 1, 2, 3, 4, 5, 6, 7, 8});
  const Array Q = random_normal({1, 2, 3, 4}, g), K = random_normal({1, 2, 9, 4}, g), V = random_normal({1, 2, 9, 4}, g);
  SdpaOptions fused, composed;
  fused.impl = SdpaImpl::fused;
  composed.impl = SdpaImpl::composed;
  const Array a = attention(Tensor(Q), Tensor(K), Tensor(V), v, fused).value();
  const Array b = attention(Tensor(Q), Tensor(K), Tensor(V), v, composed).value();
  CHECK(max_abs_diff(a, b) < 1e-12);
}

TEST_CASE("visibility plan: head_independent says whether any rule depends on the head", "[visibility]") {
  const std::int64_t T = 5;
  const Shape BHTS{2, 3, 5, 5};
  CHECK(Visibility::all().plan("test", BHTS).head_independent());
  CHECK(Visibility::causal(T, T).plan("test", BHTS).head_independent());
  CHECK((Visibility::causal(T, T) & Visibility::key_lengths({5, 3}, T)).plan("test", BHTS).head_independent());
  CHECK(Visibility::sliding_window(T, T, 2).plan("test", BHTS).head_independent());
  const std::vector<Position> pos{0, 1, 2, 3, 4};
  // ALiBi's slopes are per head; so is a [B, H, T, S] mask with H > 1 (a [B, 1, T, S] one is not).
  const Visibility alibi = Visibility::alibi({0.5, 0.25, 0.125}, pos, pos);
  CHECK_FALSE(alibi.plan("test", BHTS).head_independent());
  CHECK_FALSE((Visibility::causal(T, T) & alibi).plan("test", BHTS).head_independent());
  const BoolArray per_head = BoolArray::filled({2, 3, 5, 5}, true), per_batch = BoolArray::filled({2, 1, 5, 5}, true);
  CHECK_FALSE(Visibility::allowed(per_head).plan("test", BHTS).head_independent());
  CHECK(Visibility::allowed(per_batch).plan("test", BHTS).head_independent());
}
