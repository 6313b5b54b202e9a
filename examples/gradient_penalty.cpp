// Derivatives of derivatives in training (docs/higher-order.md): a tiny attention classifier
// trained with a gradient penalty, then Hutchinson's estimate of its Hessian's diagonal.
//   build/bin/gradient_penalty [--steps N] [--seed S] [--lambda L]
//
// Task: sequences of 6 tokens from a vocabulary of 8; the class is 1 when token 0 occurs in the
// sequence (half the sequences have it), with 10% of the labels flipped (so the loss stays away
// from 0 and the curvature is not vanishingly small). Model: embeddings E [B, T, d] -> one bidirectional
// self-attention layer (GQA: 2 query heads, 1 key/value head, RoPE) with a residual -> mean over
// the positions -> a linear classifier; softmax cross-entropy.
// Objective: the loss alone for the first third of the steps, then loss + lambda * penalty, penalty = B ||d loss / d E||^2 (the mean over the batch
// of each sequence's squared input gradient ||d loss_i / d E_i||^2, as loss is the mean of the
// loss_i), from the gradient with respect to the input embeddings as a recorded Tensor (grad()
// with create_graph): training differentiates through a gradient. Prints the loss falling, and the penalty (which grows while the model learns on
// the loss alone) falling once it is in the objective, then, for the trained parameters, the
// Hutchinson estimate of the Hessian's diagonal (xg::hutchinson_diagonal) beside the exact
// diagonal of the classifier's bias (from Hessian-vector products with unit vectors).
// A bad flag is one line on stderr and exit status 2; exit 1 if the loss (first 10 steps against
// the last 10) or the penalty (the 10 steps before it was on against the last 10) did not fall.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "flags.hpp"

using namespace xg;

namespace {

constexpr std::size_t kVocab = 8, kT = 6, kBatch = 32, kD = 16;

struct Args {
  long steps = 300;
  std::uint64_t seed = 1;
  double lambda = 1.0;
};

using examples::a_number;
using examples::digits_only;

int parse(int argc, char** argv, Args& a) {
  CLI::App app{"gradient_penalty: train a tiny attention classifier with a gradient penalty (create_graph)"};
  app.add_option("--steps", a.steps, "training steps (the first third without the penalty), 60 to 100000")
      ->capture_default_str()
      ->check(CLI::Validator(digits_only, "UINT"))
      ->check(CLI::Range(60L, 100000L));
  app.add_option("--seed", a.seed, "seed of the initialisation and the data")
      ->capture_default_str()
      ->check(CLI::Validator(digits_only, "UINT"));
  app.add_option("--lambda", a.lambda, "weight of the gradient penalty, 0 to 100")
      ->capture_default_str()
      ->check(CLI::Validator(a_number, "NUMBER"))
      ->check(CLI::Range(0.0, 100.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "gradient_penalty: " << e.what() << " (see 'gradient_penalty --help')\n";
    return 2;
  }
  return -1;
}

struct Batch {
  IndexArray tokens;  // [B, T]
  IndexArray labels;  // [B]
};

// Half the sequences contain token 0 (label 1), half do not (label 0); 10% of the labels flipped.
Batch make_batch(Generator& gen) {
  std::vector<std::int64_t> tokens(kBatch * kT), labels(kBatch);
  for (std::size_t b = 0; b < kBatch; ++b) {
    const bool has = gen.below(2) == 1;
    for (std::size_t t = 0; t < kT; ++t) tokens[b * kT + t] = std::int64_t(1 + gen.below(kVocab - 1));
    if (has) tokens[b * kT + gen.below(kT)] = 0;
    labels[b] = (has != (gen.below(10) == 0)) ? 1 : 0;
  }
  return {IndexArray({kBatch, kT}, tokens), IndexArray({kBatch}, labels)};
}

class Classifier : public nn::Module {
 public:
  explicit Classifier(Generator& gen)
      : embed(kVocab, kD, gen, default_dtype(), 0.5), attn(config(), gen), head(kD, 2, gen) {
    register_module("embed", embed);
    register_module("attn", attn);
    register_module("head", head);
  }
  // The embeddings E [B, T, d] of the tokens: the input the penalty differentiates against.
  Tensor embeddings(const IndexArray& tokens) const { return embed(tokens); }
  // logits [B, 2] from E.
  Tensor logits(const Tensor& E) {
    const Tensor h = E + attn(E, nn::Visibility::all());
    return head(ops::mean(h, {1}));
  }

  nn::Embedding embed;
  nn::MultiHeadAttention attn;
  nn::Linear head;

 private:
  static nn::AttentionConfig config() {
    nn::AttentionConfig c;
    c.d_model = kD;
    c.H_q = 2;
    c.H_kv = 1;
    c.rope = ops::RopeConfig{};
    return c;
  }
};

double mean_of(const std::vector<double>& v, std::size_t from, std::size_t to) {
  double s = 0;
  for (std::size_t i = from; i < to; ++i) s += v[i];
  return s / double(to - from);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const int rc = parse(argc, argv, args); rc >= 0) return rc;
  set_default_dtype(DType::float64);
  Generator init(args.seed), data(args.seed + 1);
  Classifier model(init);
  const auto params = model.named_parameters();
  nn::AdamW opt(params, 3e-3, 0.0);
  std::printf("gradient_penalty: %zu parameters, %ld steps, lambda %g\n", model.parameter_count(), args.steps,
              args.lambda);

  BackwardOptions graph;
  graph.create_graph = true;
  std::vector<double> losses, penalties;
  for (long step = 0; step < args.steps; ++step) {
    Tape tape;
    const Batch batch = make_batch(data);
    const Tensor E = model.embeddings(batch.tokens);
    const Tensor loss = ops::cross_entropy(model.logits(E), batch.labels);
    // d loss / d E, recorded: the penalty below is differentiable in every parameter.
    const Tensor dE = grad(loss, {E}, Tensor(), graph)[0];
    const Tensor penalty = ops::sum(dE * dE) * double(kBatch);
    // The first third of the steps train on the loss alone (the penalty is only measured).
    const bool penalised = step >= args.steps / 3;
    const Tensor objective = penalised ? loss + penalty * args.lambda : loss;
    opt.zero_grad();
    objective.backward();
    opt.step();
    losses.push_back(loss.item());
    penalties.push_back(penalty.item());
    if (step % 20 == 0 || step + 1 == args.steps)
      std::printf("step %4ld  loss %.4f  penalty %.6f%s\n", step, losses.back(), penalties.back(),
                  penalised ? "" : "  (not in the objective yet)");
  }
  const std::size_t n = losses.size(), w = 10, on = std::size_t(args.steps / 3);
  const double loss0 = mean_of(losses, 0, w), loss1 = mean_of(losses, n - w, n);
  const double pen0 = mean_of(penalties, on - w, on), pen1 = mean_of(penalties, n - w, n);
  const bool fell = loss1 < loss0 && pen1 < pen0;
  std::printf("loss: first %zu steps %.4f, last %zu steps %.4f (%s)\n", w, loss0, w, loss1,
              loss1 < loss0 ? "fell" : "did not fall");
  std::printf("penalty: last %zu steps before it was on %.6f, last %zu steps %.6f (%s)\n", w, pen0, w, pen1,
              pen1 < pen0 ? "fell" : "did not fall");

  // Curvature of the trained model on one batch: Hutchinson's estimate of diag(H) for every
  // parameter, and the exact diagonal for the classifier's bias (2 values) from hvp.
  const Batch batch = make_batch(data);
  const LossFn f = [&] { return ops::cross_entropy(model.logits(model.embeddings(batch.tokens)), batch.labels); };
  std::vector<Tensor> leaves;
  for (const auto& np : params) leaves.push_back(np.second);
  Generator probes(args.seed + 2);
  const std::size_t samples = 200;
  const std::vector<Array> diag = hutchinson_diagonal(f, leaves, samples, probes);
  std::printf("Hutchinson estimate of the Hessian diagonal (%zu Rademacher samples), mean per parameter:\n", samples);
  for (std::size_t k = 0; k < params.size(); ++k) {
    double s = 0;
    for (std::size_t i = 0; i < diag[k].size(); ++i) s += diag[k].flat(i);
    std::printf("  %-12s %+.6e\n", params[k].first.c_str(), s / double(diag[k].size()));
  }
  std::size_t bias_index = params.size();
  for (std::size_t k = 0; k < params.size(); ++k)
    if (params[k].first == "head.b") bias_index = k;
  if (bias_index == params.size()) {
    std::fprintf(stderr, "gradient_penalty: no parameter head.b\n");
    return 1;
  }
  for (std::size_t i = 0; i < 2; ++i) {
    std::vector<Array> e;
    for (const Tensor& p : leaves) e.push_back(Array::zeros(p.shape(), p.dtype()));
    e[bias_index].set_flat(i, 1.0);
    const double exact = hvp(f, leaves, e)[bias_index].flat(i);
    std::printf("  head.b[%zu]: exact H_ii %+.6e, Hutchinson %+.6e\n", i, exact, diag[bias_index].flat(i));
  }
  return fell ? 0 : 1;
}
