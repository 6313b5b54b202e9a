// MHA -> GQA/MQA conversion (nn/kv_head_pooling.hpp, train/convert.hpp): the mean-pooling of key and
// value heads element by element on hand-made weights, queries and outputs untouched, the
// group mapping g(h) = floor(h / r) agreeing with how the layer shares key/value heads,
// identity at G = H_kv, every attention layer of both models, the converted checkpoint
// loading and generating, errors naming H_q and G, and --init-from uptraining.
#include <filesystem>
#include <sstream>

#include "tests/support/helpers.hpp"
#include "tests/support/tiny_runs.hpp"
#include <xgrad/nn/kv_head_pooling.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/convert.hpp>
#include <xgrad/nn/generate.hpp>
#include <xgrad/train/trainer.hpp>

using namespace xg;
using namespace xgt;
namespace fs = std::filesystem;

namespace {

// A 4-head self-attention layer (d_model 3, d_h 2, MHA) whose W_QKV[i][c] = 100 i + c and
// b_QKV[c] = c / 2: columns 0..7 are Q, 8..15 the K heads (head h: 8 + 2h, 9 + 2h), 16..23
// the V heads (16 + 2h, 17 + 2h).
nn::MultiHeadAttention hand_made_layer() {
  nn::AttentionConfig c;
  c.d_model = 3;
  c.H_q = 4;
  c.d_head = 2;
  c.dtype = DType::float64;
  std::vector<double> w, b, wo, bo;
  for (int i = 0; i < 3; ++i)
    for (int col = 0; col < 24; ++col) w.push_back(100.0 * i + col);
  for (int col = 0; col < 24; ++col) b.push_back(col / 2.0);
  for (int i = 0; i < 8 * 3; ++i) wo.push_back(0.25 * i - 1);
  bo = {0.5, -0.5, 1.5};
  return nn::MultiHeadAttention(c, {{"W_QKV", Array::from_vector({3, 24}, w, DType::float64)},
                                    {"b_QKV", Array::from_vector({24}, b, DType::float64)},
                                    {"W_O", Array::from_vector({8, 3}, wo, DType::float64)},
                                    {"b_O", Array::from_vector({3}, bo, DType::float64)}});
}

const Array& named(const std::vector<std::pair<std::string, Array>>& w, const std::string& name) {
  for (const auto& [n, a] : w)
    if (n == name) return a;
  FAIL("no weight " << name);
  throw 0;
}

void require_equal(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a.flat(i) == b.flat(i));
}

// The tiny sort run (tests/support/tiny_runs.hpp) with 4 heads (MHA), batch 16 and 50 held-out
// problems, trained a few steps, saved in `out`.
train::TrainOptions small_sort(const fs::path& out, std::int64_t steps) {
  train::TrainOptions o = xgt::tiny_sort_run(out, steps);
  o.batch = 16;
  o.heads = 4;
  o.heldout = 50;
  return o;
}

}  // namespace

TEST_CASE("convert: K and V heads are mean-pooled by g(h) = floor(h / r) element by element", "[convert]") {
  const nn::MultiHeadAttention layer = hand_made_layer();
  SECTION("G = 2: new head g is the mean of old heads 2g and 2g + 1") {
    const auto w = nn::pooled_kv_weights(layer, 2);
    const Array& W = named(w, "W_QKV");
    REQUIRE(W.shape() == Shape{3, 16});  // (H_q + 2 G) d_h = (4 + 4) 2
    // Row 0 by hand: K head 0 = mean(cols 8, 10 | 9, 11), K head 1 = mean(12, 14 | 13, 15),
    // V head 0 = mean(16, 18 | 17, 19), V head 1 = mean(20, 22 | 21, 23).
    const double row0[16] = {0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 13, 14, 17, 18, 21, 22};
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t c = 0; c < 16; ++c) REQUIRE(W.at({i, c}) == 100.0 * i + row0[c]);
    const Array& b = named(w, "b_QKV");
    REQUIRE(b.shape() == Shape{16});
    for (std::size_t c = 0; c < 16; ++c) REQUIRE(b.at({c}) == row0[c] / 2.0);
  }
  SECTION("G = 1 (MQA): the one head is the mean of all four") {
    const auto w = nn::pooled_kv_weights(layer, 1);
    const Array& W = named(w, "W_QKV");
    REQUIRE(W.shape() == Shape{3, 12});
    // K = mean(8, 10, 12, 14 | 9, 11, 13, 15), V = mean(16, 18, 20, 22 | 17, 19, 21, 23).
    const double row0[12] = {0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 19, 20};
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t c = 0; c < 12; ++c) REQUIRE(W.at({i, c}) == 100.0 * i + row0[c]);
    const Array& b = named(w, "b_QKV");
    for (std::size_t c = 0; c < 12; ++c) REQUIRE(b.at({c}) == row0[c] / 2.0);
  }
  SECTION("queries and the output projection are untouched") {
    for (std::size_t G : {1, 2, 4}) {
      const auto w = nn::pooled_kv_weights(layer, G);
      for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t c = 0; c < 8; ++c) REQUIRE(named(w, "W_QKV").at({i, c}) == layer.W_QKV.value().at({i, c}));
      require_equal(named(w, "W_O"), layer.W_O.value());
      require_equal(named(w, "b_O"), layer.b_O.value());
    }
  }
  SECTION("G = H_kv is the identity") {
    const auto w = nn::pooled_kv_weights(layer, 4);
    require_equal(named(w, "W_QKV"), layer.W_QKV.value());
    require_equal(named(w, "b_QKV"), layer.b_QKV.value());
  }
}

TEST_CASE("convert: the group mapping is the one the GQA layer uses (equal heads in a group -> same output)",
          "[convert]") {
  // An MHA layer whose K and V heads 0 == 1 and 2 == 3: pooling to G = 2 changes no head any
  // query sees, so the GQA layer built from the pooled weights computes the same output. A
  // mapping other than floor(h / r) (e.g. h mod G) would mix heads 0 and 2.
  Generator gen(7);
  nn::AttentionConfig c;
  c.d_model = 8;
  c.H_q = 4;
  c.dtype = DType::float64;
  nn::MultiHeadAttention mha(c, gen);
  Array W = mha.W_QKV.value().clone(), b = Array::from_vector({24}, rnd({24}, gen).to_vector(), DType::float64);
  const std::size_t d_h = 2, q = 8;
  for (std::size_t part = 0; part < 2; ++part)
    for (std::size_t h : {1, 3})
      for (std::size_t j = 0; j < d_h; ++j) {
        const std::size_t dst = q + part * 4 * d_h + h * d_h + j, src = dst - d_h;
        for (std::size_t i = 0; i < 8; ++i) W.set_flat(i * 24 + dst, W.flat(i * 24 + src));
        b.set_flat(dst, b.flat(src));
      }
  nn::MultiHeadAttention equal_groups(c, {{"W_QKV", W}, {"b_QKV", b}, {"W_O", mha.W_O.value()}, {"b_O", mha.b_O.value()}});
  nn::AttentionConfig g2 = c;
  g2.H_kv = 2;
  nn::MultiHeadAttention gqa(g2, nn::pooled_kv_weights(equal_groups, 2));
  const Tensor X(rnd({2, 5, 8}, gen));
  require_close(gqa(X, nn::Visibility::causal(5, 5)).value(), equal_groups(X, nn::Visibility::causal(5, 5)).value(), 1e-12);
  // And with distinct heads the pooled layer differs: the test can fail.
  nn::MultiHeadAttention pooled_mha(g2, nn::pooled_kv_weights(mha, 2));
  const Array d = pooled_mha(X, nn::Visibility::causal(5, 5)).value(), e = mha(X, nn::Visibility::causal(5, 5)).value();
  double diff = 0;
  for (std::size_t i = 0; i < d.size(); ++i) diff = std::max(diff, std::abs(d.flat(i) - e.flat(i)));
  REQUIRE(diff > 1e-6);
}

TEST_CASE("convert: bad G is a ValueError naming H_q H_kv and G", "[convert]") {
  const nn::MultiHeadAttention layer = hand_made_layer();
  auto message = [&](std::size_t G) {
    try {
      (void)nn::pooled_kv_weights(layer, G);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string three = message(3);
  CHECK(three.find("G = 3") != std::string::npos);
  CHECK(three.find("H_q = 4") != std::string::npos);
  CHECK(three.find("H_kv = 4") != std::string::npos);
  CHECK(message(0).find("G = 0") != std::string::npos);
  CHECK(message(5).find("G = 5") != std::string::npos);
  REQUIRE_THROWS_AS(nn::pool_kv_columns(Array::zeros({3, 23}, DType::float64), 8, 4, 2, 2), ValueError);
}

TEST_CASE("convert: whole models and every attention layer / a GQA model converted to G = H_kv is identical",
          "[convert]") {
  Generator gen(3);
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 9;
  c.d_model = 16;
  c.H_q = 4;
  c.H_kv = 2;
  c.layers = 2;
  c.dtype = DType::float64;
  SECTION("GPT") {
    nn::GPT gpt(c, gen);
    const auto same = nn::with_kv_heads(gpt, 2);
    const auto a = gpt.named_parameters(), b = same->named_parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      REQUIRE(a[i].first == b[i].first);
      require_equal(a[i].second.value(), b[i].second.value());
    }
    const auto mqa = nn::with_kv_heads(gpt, 1);
    REQUIRE(mqa->config().H_kv == 1);
    for (std::size_t l = 0; l < 2; ++l) {
      const Array& old = gpt.blocks[l]->attn.W_QKV.value();
      const Array& now = mqa->blocks[l]->attn.W_QKV.value();
      REQUIRE(now.shape() == Shape{16, (4 + 2) * 4});
      // K column j of the MQA head: mean of the two GQA K heads (columns 16 + j and 20 + j).
      for (std::size_t i = 0; i < 16; ++i)
        for (std::size_t j = 0; j < 4; ++j) REQUIRE(now.at({i, 16 + j}) == (old.at({i, 16 + j}) + old.at({i, 20 + j})) / 2);
    }
    const IndexArray tokens({1, 4}, {1, 2, 3, 4});
    REQUIRE(mqa->logits(tokens).shape() == Shape{1, 4, 11});
  }
  SECTION("EncoderDecoder: encoder, decoder self- and cross-attention") {
    nn::EncoderDecoder ed(c, gen);
    const auto mqa = nn::with_kv_heads(ed, 1);
    REQUIRE(mqa->encoder[0]->attn.config().H_kv == 1);
    REQUIRE(mqa->decoder[1]->attn.config().H_kv == 1);
    REQUIRE(mqa->decoder[1]->cross.config().H_kv == 1);
    const Array& old = ed.decoder[1]->cross.W_KV.value();
    const Array& now = mqa->decoder[1]->cross.W_KV.value();
    REQUIRE(now.shape() == Shape{16, 8});
    for (std::size_t i = 0; i < 16; ++i)
      for (std::size_t j = 0; j < 4; ++j) {
        REQUIRE(now.at({i, j}) == (old.at({i, j}) + old.at({i, 4 + j})) / 2);              // K
        REQUIRE(now.at({i, 4 + j}) == (old.at({i, 8 + j}) + old.at({i, 12 + j})) / 2);     // V
      }
    require_equal(mqa->decoder[1]->cross.W_Q.value(), ed.decoder[1]->cross.W_Q.value());
    require_equal(mqa->ln_f.gamma.value(), ed.ln_f.gamma.value());
  }
}

TEST_CASE("convert: a trained checkpoint converts/loads/generates and uptrains with --init-from", "[convert]") {
  const fs::path dir = temp_dir("convert");
  std::ostringstream log;
  const train::TrainResult base = train::run_training(small_sort(dir / "run", 30), log);
  const std::string in = (dir / "run" / "model.safetensors").string();

  train::ConvertOptions co;
  co.in = in;
  co.out = (dir / "g2.safetensors").string();
  co.kv_heads = 2;
  co.heldout = 50;
  const train::ConvertReport r = train::convert_checkpoint(co);
  CHECK(r.H_q == 4);
  CHECK(r.H_kv_from == 4);
  CHECK(r.H_kv_to == 2);
  CHECK(r.sequences == 50);
  CHECK(r.positions == 50 * 4);
  CHECK(r.params_to < r.params_from);
  CHECK(r.max_abs_dlogit > 0);
  CHECK(r.mean_abs_dlogit <= r.max_abs_dlogit);
  CHECK(r.kl >= 0);
  // The original's held-out exact match is the one the training run reported.
  CHECK(r.original.exact_match == Approx(base.metric));
  CHECK(r.converted.exact_match >= 0.0);

  train::LoadedModel m = train::load_model(co.out);
  CHECK(m.info.config.H_kv == 2);
  CHECK(m.info.task == "sort");
  const nn::Generation g = nn::generate(*m.gpt, {{1, 2, 3, 4, 10}}, 4);
  CHECK(g.tokens[0].size() == 4);
  const io::safetensors::File f = io::safetensors::load(co.out);
  CHECK(f.metadata.at("converted_from_H_kv") == "4");
  CHECK(f.metadata.count("step") == 0);

  SECTION("G that does not divide H_kv is a usage error naming H_q and G; OUT is not written") {
    co.out = (dir / "g3.safetensors").string();
    co.kv_heads = 3;
    try {
      (void)train::convert_checkpoint(co);
      FAIL("no error");
    } catch (const UsageError& e) {
      const std::string m = e.what();
      CHECK(m.find("--kv-heads 3") != std::string::npos);
      CHECK(m.find("H_q = 4") != std::string::npos);
      CHECK(m.find("G = 3") != std::string::npos);
    }
    CHECK(!fs::exists(co.out));
    co.kv_heads = 0;
    REQUIRE_THROWS_AS(train::convert_checkpoint(co), UsageError);
    co.kv_heads = 8;
    REQUIRE_THROWS_AS(train::convert_checkpoint(co), UsageError);
  }
  SECTION("GQA -> MQA from the converted file") {
    co.in = (dir / "g2.safetensors").string();
    co.out = (dir / "g1.safetensors").string();
    co.kv_heads = 1;
    const train::ConvertReport r1 = train::convert_checkpoint(co);
    CHECK(r1.H_kv_from == 2);
    CHECK(train::load_model(co.out).info.config.H_kv == 1);
  }
  SECTION("--init-from: a new run with the converted model's configuration and weights") {
    train::TrainOptions o = small_sort(dir / "up", 5);
    o.heads = 8;  // replaced by the checkpoint's
    o.init_from = co.out;
    REQUIRE_THROWS_AS(train::apply_init_from(o, {"heads"}), UsageError);
    train::apply_init_from(o, {});
    CHECK(o.heads == 4);
    CHECK(o.kv_heads == 2);
    CHECK(o.n_digits == 4);
    std::ostringstream up;
    const train::TrainResult r2 = train::run_training(o, up);
    const std::string text = up.str();
    CHECK(text.find("heads 4/2 (q/kv)") != std::string::npos);
    std::ostringstream before;
    before << "heldout_exact_match " << r.converted.exact_match << " before training";
    CHECK(text.find("initialised from " + co.out + ": " + before.str()) != std::string::npos);
    CHECK(r2.steps_done == 5);
    CHECK(train::load_model((dir / "up" / "model.safetensors").string()).info.config.H_kv == 2);
  }
  SECTION("--init-from a checkpoint that is not this run's model is refused") {
    train::TrainOptions o = small_sort(dir / "bad", 2);
    o.init_from = co.out;  // H_kv 2, but the options say 4 (MHA)
    std::ostringstream sink;
    try {
      (void)train::run_training(o, sink);
      FAIL("no error");
    } catch (const UsageError& e) {
      CHECK(std::string(e.what()).find("H_kv 2 vs 4") != std::string::npos);
    }
  }
  fs::remove_all(dir);
}
