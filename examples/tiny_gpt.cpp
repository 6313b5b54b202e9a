// A small GPT trained with the library directly (no CLI): learn to sort 6 digits.
//   build/bin/tiny_gpt [--steps N] [--seed S] [--min-accuracy A]   (exit 1 below A)
// Shows the pieces a user composes: a task's batches, nn::GPT, a Tape per step, backward,
// gradient clipping, AdamW with a warmup + cosine schedule, and greedy generation with the
// KV cache. Prints the loss as it goes and a few held-out predictions at the end. A bad flag
// is one line on stderr and exit status 2, as for the xgrad program.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "flags.hpp"
#include <xgrad/nn/generate.hpp>
#include <xgrad/train/tasks.hpp>

using namespace xg;

namespace {

struct Args {
  long steps = 400;
  std::uint64_t seed = 1;
  double min_accuracy = 0.0;
};

using examples::a_number;
using examples::digits_only;

// Parses the flags; returns -1 to go on, or the exit status (0 after --help, 2 for a bad flag).
int parse(int argc, char** argv, Args& a) {
  CLI::App app{"tiny_gpt: train a small GPT to sort 6 digits with the xgrad library directly"};
  app.add_option("--steps", a.steps, "training steps, 1 to 1000000")
      ->capture_default_str()
      ->check(CLI::Validator(digits_only, "UINT"))
      ->check(CLI::Range(1L, 1000000L));
  app.add_option("--seed", a.seed, "seed of the initialisation, the data and the held-out set")
      ->capture_default_str()
      ->check(CLI::Validator(digits_only, "UINT"));
  app.add_option("--min-accuracy", a.min_accuracy, "exit 1 when the held-out exact match is below this (0 to 1)")
      ->capture_default_str()
      ->check(CLI::Validator(a_number, "NUMBER"))
      ->check(CLI::Range(0.0, 1.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "tiny_gpt: " << e.what() << " (see 'tiny_gpt --help')\n";
    return 2;
  }
  return -1;
}

// Fraction of held-out problems whose whole sorted answer is generated correctly.
double exact_match(nn::GPT& model, const train::SortTask& task, const std::vector<std::vector<std::int64_t>>& problems,
                   bool print) {
  std::vector<std::vector<std::int64_t>> prompts;
  for (const auto& d : problems) prompts.push_back(task.prompt(d));
  model.eval();
  const nn::Generation g = nn::generate(model, prompts, task.n());  // greedy, KV cache
  model.train();
  std::size_t right = 0;
  for (std::size_t i = 0; i < problems.size(); ++i) {
    const bool ok = g.tokens[i] == task.answer(problems[i]);
    right += ok;
    if (print && i < 3)
      std::printf("  %s -> %s %s\n", task.vocab().decode(prompts[i]).c_str(), task.vocab().decode(g.tokens[i]).c_str(),
                  ok ? "(right)" : "(wrong)");
  }
  return static_cast<double>(right) / static_cast<double>(problems.size());
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (const int rc = parse(argc, argv, args); rc >= 0) return rc;
  train::SortTask task(6);
  const auto heldout = task.heldout(200, args.seed + 1000);
  task.exclude(heldout);  // never train on a held-out problem

  nn::TransformerConfig cfg;
  cfg.V_vocab = task.vocab().size();
  cfg.context = task.context();
  cfg.d_model = 48;
  cfg.H_q = 4;
  cfg.H_kv = 2;  // grouped-query attention: 2 query heads per key/value head
  cfg.layers = 2;
  Generator init(args.seed), data(args.seed + 1);
  nn::GPT model(cfg, init);
  std::printf("tiny_gpt: %zu parameters, %ld steps\n", model.parameter_count(), args.steps);

  const auto params = model.named_parameters();
  nn::AdamW opt(params, 3e-3, 0.01);
  for (long step = 0; step < args.steps; ++step) {
    Tape tape;  // one tape per step: everything recorded below is freed by backward
    const train::LMBatch batch = task.batch(32, data);
    Tensor loss = model.loss(batch.tokens, batch.targets, train::kIgnore);
    loss.backward();
    nn::clip_grad_norm(params, 1.0);
    opt.lr = nn::warmup_cosine(step, 50, args.steps, 3e-3, 3e-4);
    opt.step();
    opt.zero_grad();
    if (step % 50 == 0 || step + 1 == args.steps) std::printf("step %4ld  loss %.4f\n", step + 1, loss.item());
  }
  const double acc = exact_match(model, task, heldout, true);
  std::printf("held-out exact match %.3f\n", acc);
  return acc >= args.min_accuracy ? 0 : 1;
}
