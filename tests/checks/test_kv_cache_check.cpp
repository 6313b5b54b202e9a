// The KV-cache equivalence checker (checks/kv_cache_check.hpp): it passes the library's
// models and a correct user decoder, catches several kinds of broken cache and says which
// schedule and position, reports bad input as clear errors, and works as a suite row
// (add_kv_cache_check, XG_KVCACHE_CHECK) with a valid JSON report.
#include <nlohmann/json.hpp>
#include <memory>
#include <sstream>

#include <xgrad/checks/kv_cache_check.hpp>
#include <xgrad/checks/suite.hpp>
#include "tests/support/helpers.hpp"

using namespace xg;
using namespace xgt;

namespace {

// How the test decoder's cache is broken.
enum class Bug {
  none,
  position_offset,  // positions start one too late (wrong from the very first call)
  dropped_key,      // after every call the newest key/value is dropped from the cache
  stale_value,      // after the first call, the values written are zeros (never updated)
  decode_path,      // one-token calls ignore the cache (prefill and chunks are right)
};

// Token + position embeddings, one causal GQA layer (nn::MultiHeadAttention with its
// nn::KVCache) with a residual, and a linear head: tokens [B, T] -> [B, T, V].
struct TestDecoder {
  static constexpr std::size_t V = 9, C = 12, d = 8;
  Generator gen{7};
  nn::Embedding tok{V, d, gen, DType::float64, 0.5}, pos{C, d, gen, DType::float64, 0.5};
  nn::MultiHeadAttention attn{config(), gen};
  nn::Linear head{d, V, gen, true, DType::float64, 0.5};
  Bug bug = Bug::none;

  static nn::AttentionConfig config() {
    nn::AttentionConfig c;
    c.d_model = d;
    c.H_q = 2;
    c.H_kv = 1;
    c.dtype = DType::float64;
    return c;
  }
  Tensor embed(const IndexArray& t, std::size_t start) const {
    const std::size_t n = t.shape[1];
    std::vector<std::int64_t> p(n);
    for (std::size_t i = 0; i < n; ++i) p[i] = std::int64_t(start + i);
    return tok(t) + pos(IndexArray({1, n}, p));
  }
  Tensor forward(const IndexArray& t) {
    const std::size_t T = t.shape[1];
    const Tensor x = embed(t, 0);
    return head(x + attn(x, nn::Visibility::causal(nn::Position(T), nn::Position(T))));
  }
  struct State {
    nn::KVCache cache;
    std::size_t next = 0;  // the position of the next token (kept apart, so a dropped key is only that)
  };
  State make_state(std::size_t B) const { return State{attn.make_cache(B, C), 0}; }
  Tensor cached(State& s, const IndexArray& t) {
    const std::size_t n = t.shape[1];
    const Tensor x = embed(t, s.next + (bug == Bug::position_offset ? 1 : 0));
    Tensor y;
    if (bug == Bug::decode_path && n == 1 && s.cache.length() > 0) {
      nn::KVCache fresh = attn.make_cache(x.shape()[0], C);
      y = attn.forward_cached(x, fresh).Y;
      s.cache.append(fresh.keys(), fresh.values());
    } else {
      const bool first = s.cache.length() == 0;
      y = attn.forward_cached(x, s.cache).Y;
      if (bug == Bug::dropped_key) s.cache.truncate(s.cache.length() - 1);
      if (bug == Bug::stale_value && !first) {
        const std::size_t L = s.cache.length();
        const Array K = ops::slice(Tensor(s.cache.keys()), 2, long(L - n), long(L)).value();
        const Array Vv = ops::slice(Tensor(s.cache.values()), 2, long(L - n), long(L)).value();
        s.cache.truncate(L - n);
        s.cache.append(K.clone(), Array::zeros(Vv.shape(), Vv.dtype()));
      }
    }
    s.next += n;
    return head(x + y);
  }
};

KVCacheDecoder decoder_of(const std::shared_ptr<TestDecoder>& m, std::size_t B) {
  return kv_cache_decoder([m](const IndexArray& t) { return m->forward(t); }, [m, B] { return m->make_state(B); },
                          [m](TestDecoder::State& s, const IndexArray& t) { return m->cached(s, t); });
}

IndexArray tokens(std::size_t B, std::size_t T, std::uint64_t seed = 3) {
  Generator g(seed);
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = std::int64_t(g.below(TestDecoder::V));
  return IndexArray({B, T}, ids);
}

const KVComparison& find(const KVCacheReport& r, const std::string& name) {
  for (const KVComparison& c : r.comparisons)
    if (c.name == name) return c;
  FAIL("no comparison named " << name);
  return r.comparisons.front();
}

nn::TransformerConfig tiny(DType dtype) {
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 10;
  c.d_model = 8;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = 2;
  c.d_ff = 16;
  c.dtype = dtype;
  return c.resolved();
}

}  // namespace

TEST_CASE("kv-cache check: default schedules", "[checks][kv_cache]") {
  CHECK(default_kv_schedules(0).empty());
  const auto one = default_kv_schedules(1);
  REQUIRE(one.size() == 1);  // every schedule of one position is the prefill
  CHECK(one[0].name == "prefill");
  CHECK(one[0].chunks == std::vector<std::size_t>{1});
  const auto seven = default_kv_schedules(7);
  REQUIRE(seven.size() == 5);
  CHECK(seven[0].chunks == std::vector<std::size_t>{7});
  CHECK(seven[1].chunks == std::vector<std::size_t>{1, 1, 1, 1, 1, 1, 1});
  CHECK(seven[2].chunks == std::vector<std::size_t>{1, 2, 3, 1});
  CHECK(seven[3].chunks == std::vector<std::size_t>{5, 2});
  CHECK(seven[4].chunks == std::vector<std::size_t>{4, 1, 1, 1});
  const auto two = default_kv_schedules(2);  // {2}, {1, 1}; chunks 1,2,3 -> {1, 1}; decode {1, 1}
  REQUIRE(two.size() == 2);
  CHECK(two[1].name == "token by token");
}

TEST_CASE("kv-cache check: the library's GPT and encoder-decoder pass in both precisions", "[checks][kv_cache]") {
  for (DType dtype : {DType::float64, DType::float32}) {
    Generator g(11);
    auto gpt = std::make_shared<nn::GPT>(tiny(dtype), g);
    const KVCacheReport r = check_kv_cache(
        kv_cache_decoder([gpt](const IndexArray& t) { return gpt->logits(t); }, [gpt] { return gpt->make_caches(2, 10); },
                         [gpt](std::vector<nn::KVCache>& c, const IndexArray& t) { return gpt->logits_cached(t, c); }),
        tokens(2, 10));
    INFO(r.summary());
    CHECK(r.passed);
    CHECK(r.comparisons.size() == 6);  // 5 schedules + prefix isolation
    CHECK(r.output_shape == Shape{2, 10, 11});
    CHECK(r.dtype == dtype);
    CHECK(r.message.empty());
    CHECK(r.tolerance == Approx((dtype == DType::float64 ? 1e-12 : 1e-6) +
                                (dtype == DType::float64 ? 1e-10 : 1e-4) * r.scale));

    auto ed = std::make_shared<nn::EncoderDecoder>(tiny(dtype), g);
    const std::vector<std::size_t> lengths = {4, 2};
    NoGradGuard ng;
    const Tensor memory = ed->encode(tokens(2, 4, 5), lengths);
    const auto kv = std::make_shared<std::vector<std::pair<Tensor, Tensor>>>(ed->memory_kv(memory));
    const KVCacheReport e = require_kv_cache_equivalence(
        kv_cache_decoder([=](const IndexArray& t) { return ed->decode(t, memory, lengths); },
                         [ed] { return ed->make_caches(2, 10); },
                         [=](std::vector<nn::KVCache>& c, const IndexArray& t) {
                           return ed->decode_cached(t, c, *kv, lengths);
                         }),
        tokens(2, 9));
    CHECK(e.passed);
  }
}

TEST_CASE("kv-cache check: a values input of shape B x T x d (the attention layer alone)", "[checks][kv_cache]") {
  Generator g(5);
  nn::MultiHeadAttention m(TestDecoder::config(), g);
  const Array X = rnd({2, 6, 8}, g);
  const KVCacheDecoder dec = kv_cache_decoder(
      [&](const Array& x) { return m(Tensor(x), nn::Visibility::causal(6, 6)); }, [&] { return m.make_cache(2, 6); },
      [&](nn::KVCache& c, const Array& x) { return m.forward_cached(Tensor(x), c).Y; });
  const KVCacheReport r = check_kv_cache(dec, X);
  INFO(r.summary());
  CHECK(r.passed);
  CHECK(r.summary().find("5 schedules and prefix isolation agree") != std::string::npos);
}

TEST_CASE("kv-cache check: a correct user decoder passes / broken caches are caught where they break",
          "[checks][kv_cache]") {
  auto m = std::make_shared<TestDecoder>();
  const IndexArray t = tokens(2, 8);
  CHECK(check_kv_cache(decoder_of(m, 2), t).passed);

  SECTION("wrong position offset: already the prefill, at position 0") {
    m->bug = Bug::position_offset;
    const KVCacheReport r = check_kv_cache(decoder_of(m, 2), t);
    REQUIRE_FALSE(r.passed);
    const KVComparison& c = find(r, "prefill");
    CHECK_FALSE(c.passed);
    CHECK(c.first_bad_position == 0);
    CHECK(c.first_bad_diff > 1e-3);
    CHECK(find(r, "prefix isolation").passed);  // the full forward is fine
    CHECK(r.message.rfind("KV cache: schedule \"prefill\" [8]: position 0 (chunk 0, positions 0..7) differs", 0) == 0);
  }
  SECTION("a dropped key: prefill passes, token by token fails at position 1") {
    m->bug = Bug::dropped_key;
    const KVCacheReport r = check_kv_cache(decoder_of(m, 2), t);
    REQUIRE_FALSE(r.passed);
    CHECK(find(r, "prefill").passed);
    const KVComparison& c = find(r, "token by token");
    CHECK(c.first_bad_position == 1);
    CHECK(c.bad_chunk == 1);
    CHECK(find(r, "prefill then decode").first_bad_position == 5);  // {5, 1, 1, 1}: the first decode step
    CHECK(r.message.find("schedule \"token by token\" [1, 1, 1, 1, 1, 1, 1, 1]: position 1 (chunk 1, positions 1..1)") !=
          std::string::npos);
  }
  SECTION("a stale value: wrong from the first position that reads a value the second call wrote") {
    m->bug = Bug::stale_value;
    const KVCacheReport r = check_kv_cache(decoder_of(m, 2), t);
    REQUIRE_FALSE(r.passed);
    CHECK(find(r, "prefill").passed);
    CHECK(find(r, "token by token").first_bad_position == 2);
    CHECK(find(r, "chunks 1,2,3").first_bad_position == 3);  // {1, 2, 3, 1, 1}: the third call reads 1..2
    CHECK(find(r, "uneven split").passed);                    // {6, 2}: the second call writes nothing read later
  }
  SECTION("correct for prefill and chunks, wrong when decoding one token at a time") {
    m->bug = Bug::decode_path;
    const KVCacheReport r = check_kv_cache(decoder_of(m, 2), t);
    REQUIRE_FALSE(r.passed);
    CHECK(find(r, "prefill").passed);
    CHECK(find(r, "uneven split").passed);
    CHECK(find(r, "token by token").first_bad_position == 1);
    CHECK(find(r, "chunks 1,2,3").first_bad_position == 6);         // {1, 2, 3, 1, 1}: the second 1
    CHECK(find(r, "prefill then decode").first_bad_position == 5);  // {5, 1, 1, 1}
    CHECK_THROWS_AS(require_kv_cache_equivalence(decoder_of(m, 2), t), KVCacheMismatch);
    try {
      require_kv_cache_equivalence(decoder_of(m, 2), t);
    } catch (const KVCacheMismatch& e) {
      CHECK(std::string(e.what()) == e.report().message);
      CHECK_FALSE(e.report().passed);
    }
  }
}

TEST_CASE("kv-cache check: a full forward that sees the future fails prefix isolation", "[checks][kv_cache]") {
  Generator g(9);
  nn::MultiHeadAttention m(TestDecoder::config(), g);
  const Array X = rnd({1, 6, 8}, g);
  // Bidirectional both ways: the prefill agrees, prefix isolation does not.
  auto bidirectional = [&](const Array& x) { return m(Tensor(x), nn::Visibility::all()); };
  const KVCacheDecoder dec = kv_cache_decoder(bidirectional, [] { return 0; },
                                              [&](int&, const Array& x) { return bidirectional(x); });
  KVCacheCheckOptions only_prefill;
  only_prefill.schedules = {{"prefill", {6}}};
  const KVCacheReport r = check_kv_cache(dec, X, only_prefill);
  REQUIRE_FALSE(r.passed);
  CHECK(find(r, "prefill").passed);
  const KVComparison& c = find(r, "prefix isolation");
  CHECK_FALSE(c.passed);
  CHECK(c.first_bad_position == 0);
  CHECK(r.message.find("the full forward is not causal") != std::string::npos);
  only_prefill.prefix_isolation = false;
  CHECK(check_kv_cache(dec, X, only_prefill).passed);  // an encoder, checked without the causal property
}

TEST_CASE("kv-cache check: bad input is a clear error", "[checks][kv_cache][errors]") {
  auto m = std::make_shared<TestDecoder>();
  const KVCacheDecoder good = decoder_of(m, 2);
  // T = 0 and B = 0.
  CHECK_THROWS_WITH(check_kv_cache(good, IndexArray({2, 0}, {})),
                    Catch::Contains("[kv_cache_check]") && Catch::Contains("(2, 0)") &&
                        Catch::Contains("at least one sample and one position"));
  CHECK_THROWS_AS(check_kv_cache(good, IndexArray({0, 3}, {})), ValueError);
  CHECK_THROWS_AS(check_kv_cache(good, DecoderInput()), ValueError);
  // Inputs of the wrong rank.
  CHECK_THROWS_AS(DecoderInput(IndexArray({1, 2, 3})), ShapeError);
  CHECK_THROWS_AS(DecoderInput(Array::zeros({4}, DType::float64)), ShapeError);
  CHECK_THROWS_AS(DecoderInput(Array()), ValueError);
  CHECK_THROWS_WITH(DecoderInput(Array::zeros({2, 3}, DType::float64)).tokens(), Catch::Contains("not token ids"));
  CHECK_THROWS_WITH(DecoderInput(tokens(1, 3)).values(), Catch::Contains("not values"));
  CHECK_THROWS_AS(DecoderInput(tokens(1, 3)).slice(2, 2), ValueError);
  CHECK_THROWS_AS(DecoderInput(tokens(1, 3)).slice(1, 4), ValueError);
  // Bad schedules.
  KVCacheCheckOptions o;
  o.schedules = {{"short", {2, 1}}};
  CHECK_THROWS_WITH(check_kv_cache(good, tokens(2, 4), o),
                    Catch::Contains("schedule \"short\" [2, 1] covers 3 positions, the input has 4"));
  o.schedules = {{"zero", {2, 0, 2}}};
  CHECK_THROWS_WITH(check_kv_cache(good, tokens(2, 4), o), Catch::Contains("has a chunk of 0"));
  // Missing functions, a null state.
  KVCacheDecoder missing = good;
  missing.forward_cached = nullptr;
  CHECK_THROWS_WITH(check_kv_cache(missing, tokens(2, 4)), Catch::Contains("lacks forward_cached"));
  KVCacheDecoder null_state = good;
  null_state.make_state = [] { return std::shared_ptr<void>(); };
  CHECK_THROWS_WITH(check_kv_cache(null_state, tokens(2, 4)), Catch::Contains("make_state returned a null state"));
  // A full forward of the wrong shape.
  KVCacheDecoder short_full = good;
  short_full.forward = [m](const DecoderInput& in) {
    return ops::slice(m->forward(in.tokens()), 1, 0, long(in.length()) - 1);
  };
  CHECK_THROWS_WITH(check_kv_cache(short_full, tokens(2, 4)),
                    Catch::Contains("the full forward on input (2, 4) returned shape (2, 3, 9), expected [2, 4, ...]"));
  // A cached forward that returns only the last position of each chunk.
  KVCacheDecoder last_only = kv_cache_decoder(
      [m](const IndexArray& t) { return m->forward(t); }, [m] { return m->make_state(2); },
      [m](TestDecoder::State& s, const IndexArray& t) {
        const Tensor y = m->cached(s, t);
        return ops::slice(y, 1, long(y.shape()[1]) - 1, long(y.shape()[1]));
      });
  CHECK_THROWS_AS(check_kv_cache(last_only, tokens(2, 4)), ShapeError);
  CHECK_THROWS_WITH(check_kv_cache(last_only, tokens(2, 4)),
                    Catch::Contains("schedule \"prefill\" [4]: the cached forward of chunk 0 (positions 0..3) "
                                    "returned shape (2, 1, 9), expected (2, 4, 9)"));
  // A cached forward in another dtype.
  KVCacheDecoder other_dtype = good;
  other_dtype.forward_cached = [good](void* s, const DecoderInput& in) {
    return Tensor(good.forward_cached(s, in).value().astype(DType::float32));
  };
  CHECK_THROWS_AS(check_kv_cache(other_dtype, tokens(2, 4)), DTypeError);
  // A cached forward that throws: the exception comes through.
  KVCacheDecoder overflow = kv_cache_decoder([m](const IndexArray& t) { return m->forward(t); },
                                             [m] { return TestDecoder::State{m->attn.make_cache(2, 3), 0}; },
                                             [m](TestDecoder::State& s, const IndexArray& t) { return m->cached(s, t); });
  CHECK_THROWS_WITH(check_kv_cache(overflow, tokens(2, 4)), Catch::Contains("overflow"));
  // NaN in the cached output is a mismatch, not a pass.
  KVCacheDecoder nan_out = good;
  nan_out.forward_cached = [good](void* s, const DecoderInput& in) {
    Array y = good.forward_cached(s, in).value().clone();
    y.set_flat(0, std::nan(""));
    return Tensor(y);
  };
  const KVCacheReport r = check_kv_cache(nan_out, tokens(2, 4));
  CHECK_FALSE(r.passed);
  CHECK(r.comparisons[0].first_bad_position == 0);
}

namespace {
std::shared_ptr<TestDecoder> macro_model = std::make_shared<TestDecoder>();
}

XG_KVCACHE_CHECK("macro/kv-cache", "TestDecoder, tokens (2, 5)") {
  return KVCacheCheck{decoder_of(macro_model, 2), tokens(2, 5), {}};
}

TEST_CASE("kv-cache check: suite rows (add_kv_cache_check and XG_KVCACHE_CHECK) and the JSON report",
          "[checks][kv_cache][suite]") {
  auto good = std::make_shared<TestDecoder>();
  auto broken = std::make_shared<TestDecoder>();
  broken->bug = Bug::dropped_key;
  GradcheckSuite s;
  add_kv_cache_check(s, "mine/good", "good cache", [good](CheckContext&) {
    return KVCacheCheck{decoder_of(good, 2), tokens(2, 6), {}};
  });
  add_kv_cache_check(s, "mine/broken", "drops a key", [broken](CheckContext&) {
    return KVCacheCheck{decoder_of(broken, 2), tokens(2, 6), {}};
  });
  add_kv_cache_check(s, "mine/bad-input", "T = 0", [good](CheckContext&) {
    return KVCacheCheck{decoder_of(good, 2), IndexArray({2, 0}, {}), {}};
  });
  CHECK_THROWS_AS(add_kv_cache_check(s, "mine/none", "", nullptr), ValueError);
  REQUIRE(s.size() == 3);
  CHECK(s.checks()[0].kind == "kv-cache");
  RunOptions o;
  std::ostringstream out;
  const SuiteReport rep = run_suite(s, o, out);
  CHECK(rep.passed == 1);
  CHECK(rep.failed == 2);
  CHECK(rep.records[0].result.passed);
  CHECK(rep.records[0].result.mode == "property");
  CHECK(rep.records[1].result.message.find("schedule \"token by token\" [1, 1, 1, 1, 1, 1]: position 1") !=
        std::string::npos);
  CHECK(rep.records[1].result.worst.find("(token by token)") != std::string::npos);
  CHECK(rep.records[2].result.message.find("at least one sample and one position") != std::string::npos);
  CHECK(out.str().find("schedule \"token by token\"") != std::string::npos);  // printed under the table
  const auto j = nlohmann::json::parse(report_json(rep));
  REQUIRE(j["checks"].size() == 3);
  CHECK(j["checks"][0]["kind"] == "kv-cache");
  CHECK(j["checks"][1]["passed"] == false);

  const auto sel = default_gradcheck_suite().select("macro/kv-cache");
  REQUIRE(sel.size() == 1);
  CHECK(sel[0]->kind == "kv-cache");
  RunOptions mo;
  mo.filter = "macro/kv-cache";
  std::ostringstream mout;
  CHECK(run_suite(default_gradcheck_suite(), mo, mout).all_passed());
}
