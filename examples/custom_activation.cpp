// Your own layer inside a built-in model, trained through the run folder (docs/custom-layers.md):
//   build/bin/custom_activation [TEXT] [--out DIR] [--steps N] [--open]
// Registers squared ReLU, relu(x)^2 (So et al. 2021, "Primer"), as an activation, builds a
// small Llama whose SwiGLU gate uses it instead of SiLU, trains it on the bytes of TEXT (default:
// the GPL-3 text in /usr/share/common-licenses) with train::train_module, which keeps the run in
// DIR as xgrad train does (log.csv, config.json, checkpoints; `xgrad compare DIR` reads it),
// writes DIR/report.html, loads the saved model back and prints where everything is. --open
// opens the report with xdg-open. A bad flag is one line on stderr and exit status 2.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <xgrad/xgrad.hpp>

#include "flags.hpp"
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/custom_run.hpp>

using namespace xg;

namespace {

struct Args {
  std::string text = "/usr/share/common-licenses/GPL-3";
  std::string out = "custom_activation_run";
  long steps = 200;
  long d_model = 64;
  long layers = 2;
  long context = 64;
  bool open = false;
};

int parse(int argc, char** argv, Args& a) {
  CLI::App app{"custom_activation: a registered activation inside a Llama model, trained through a run folder"};
  app.add_option("TEXT", a.text, "the text to train on (its bytes are the tokens)")->capture_default_str();
  app.add_option("--out", a.out, "the run folder (replaced if it holds an earlier run)")->capture_default_str();
  app.add_option("--steps", a.steps, "training steps, 1 to 100000")
      ->capture_default_str()
      ->check(CLI::Validator(examples::digits_only, "UINT"))
      ->check(CLI::Range(1L, 100000L));
  app.add_option("--d-model", a.d_model, "model width, a multiple of 4 in [8, 512]")
      ->capture_default_str()
      ->check(CLI::Validator(examples::digits_only, "UINT"))
      ->check(CLI::Range(8L, 512L));
  app.add_option("--layers", a.layers, "blocks, 1 to 12")
      ->capture_default_str()
      ->check(CLI::Validator(examples::digits_only, "UINT"))
      ->check(CLI::Range(1L, 12L));
  app.add_option("--context", a.context, "tokens per training window, 4 to 512")
      ->capture_default_str()
      ->check(CLI::Validator(examples::digits_only, "UINT"))
      ->check(CLI::Range(4L, 512L));
  app.add_flag("--open", a.open, "open the report with xdg-open when done");
  try {
    app.parse(argc, argv);
    if (a.d_model % 4 != 0) throw CLI::ValidationError("--d-model", "must be a multiple of 4 (4 heads)");
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "custom_activation: " << e.what() << " (see 'custom_activation --help')\n";
    return 2;
  }
  return -1;
}

// Token windows [B, T] and their next tokens, starting at `starts` in `ids`.
std::pair<IndexArray, IndexArray> windows(const std::vector<std::int64_t>& ids, const std::vector<std::size_t>& starts,
                                          std::size_t T) {
  std::vector<std::int64_t> x, y;
  for (const std::size_t s : starts)
    for (std::size_t t = 0; t < T; ++t) {
      x.push_back(ids[s + t]);
      y.push_back(ids[s + t + 1]);
    }
  return {IndexArray({starts.size(), T}, x), IndexArray({starts.size(), T}, y)};
}

int run(const Args& a) {
  // 1. The layer: any function of a tensor that keeps its shape, on the tape (gradients come
  //    from the ops it is made of).
  nn::register_activation("squared_relu", [](const Tensor& x) {
    const Tensor r = ops::relu(x);
    return r * r;
  });

  // 2. The data: the file's bytes, as a charlm vocabulary (its distinct bytes in order).
  std::ifstream in(a.text, std::ios::binary);
  if (!in) {
    std::cerr << "custom_activation: cannot read " << a.text << "\n";
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::size_t T = static_cast<std::size_t>(a.context);
  if (text.size() < 20 * (T + 1)) {
    std::cerr << "custom_activation: " << a.text << " has " << text.size() << " bytes; need at least "
              << 20 * (T + 1) << " for --context " << T << "\n";
    return 1;
  }
  const std::set<unsigned char> distinct(text.begin(), text.end());
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "charlm";
  std::vector<std::int64_t> id_of(256, -1);
  for (const unsigned char c : distinct) {
    id_of[c] = static_cast<std::int64_t>(info.vocab.tokens.size());
    info.vocab.tokens.push_back(std::string(1, static_cast<char>(c)));
  }
  std::vector<std::int64_t> ids;
  for (const char c : text) ids.push_back(id_of[static_cast<unsigned char>(c)]);
  const std::size_t split = ids.size() * 9 / 10;  // the last tenth is held out
  const std::vector<std::int64_t> train_ids(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(split)),
      val_ids(ids.begin() + static_cast<std::ptrdiff_t>(split), ids.end());

  // 3. The model: a Llama whose feed-forward gate is squared ReLU.
  nn::TransformerConfig& c = info.config;
  c.arch = nn::Architecture::llama;
  c.pos = nn::PositionScheme::rope;
  c.V_vocab = info.vocab.size();
  c.context = T;
  c.d_model = static_cast<std::size_t>(a.d_model);
  c.H_q = 4;
  c.layers = static_cast<std::size_t>(a.layers);
  c.multiple_of = 16;
  c.activation = "squared_relu";
  Generator init(1);
  nn::GPT model(c, init);

  // 4. The loss of one step: 8 windows drawn from the run's data generator (saved with each
  //    checkpoint, so that a resumed run draws what the uninterrupted one would).
  const std::size_t B = 8;
  const auto loss = [&](nn::Module& m, train::StepInput& step) {
    std::vector<std::size_t> starts(B);
    for (auto& s : starts) s = static_cast<std::size_t>(step.data.below(train_ids.size() - T - 1));
    const auto [x, y] = windows(train_ids, starts, T);
    return dynamic_cast<nn::GPT&>(m).loss(x, y);
  };
  // Held out: up to 16 fixed windows of the last tenth.
  std::vector<std::size_t> val_starts;
  for (std::size_t s = 0; s + T + 1 <= val_ids.size() && val_starts.size() < 16; s += T) val_starts.push_back(s);
  const auto validate = [&](nn::Module& m) {
    const auto [x, y] = windows(val_ids, val_starts, T);
    return dynamic_cast<nn::GPT&>(m).loss(x, y).item();
  };

  // 5. The run: the same folder as xgrad train's.
  train::RunOptions o;
  o.out = a.out;
  o.steps = a.steps;
  o.lr = 3e-3;
  o.warmup = std::min<long>(10, a.steps);
  o.eval_every = std::max<long>(1, a.steps / 5);
  o.name = "custom_activation";
  o.tokens_per_step = B * T;
  o.config = {{"arch", "llama"}, {"activation", c.activation}, {"d_model", std::to_string(c.d_model)},
              {"layers", std::to_string(c.layers)}, {"context", std::to_string(T)},
              {"text", std::filesystem::absolute(a.text).string()}};
  o.model_metadata = train::model_metadata(info);  // load_model() rebuilds it where squared_relu is registered
  o.overwrite = true;
  o.progress = &std::cout;
  std::cout << "custom_activation: a Llama of " << model.parameter_count() << " parameters (d_model " << c.d_model
            << ", " << c.layers << " layers, SwiGLU gate: squared_relu) on " << a.text << " (" << text.size()
            << " bytes, " << c.V_vocab << " distinct)\n";
  const train::ModuleRunResult r = train::train_module(model, loss, o, validate);

  // 6. The report, and the saved model read back.
  const std::string html = train::write_report({a.out}, (std::filesystem::path(a.out) / "report.html").string(),
                                               "custom_activation");
  train::LoadedModel saved = train::load_model((std::filesystem::path(a.out) / "model.safetensors").string());
  const double reloaded = validate(*saved.gpt);
  std::printf("validation loss %.4f (%.4f bits per byte); the saved model reloads with activation '%s' and gives %.4f\n",
              *r.val_loss, *r.val_loss / std::log(2.0), saved.info.config.activation.c_str(), reloaded);
  std::cout << "run folder: " << a.out << " (xgrad compare " << a.out << " reads it)\nreport: " << html << "\n";
  if (a.open) {
    const std::string cmd = "xdg-open '" + html + "' >/dev/null 2>&1 &";
    if (std::system(cmd.c_str()) != 0) std::cout << "(xdg-open failed: open the report in a browser)\n";
  }
  return reloaded == *r.val_loss ? 0 : 1;  // the same model, the same windows: the same bits
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (const int status = parse(argc, argv, a); status >= 0) return status;
  try {
    return run(a);
  } catch (const UsageError& e) {
    std::cerr << "custom_activation: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "custom_activation: " << e.what() << "\n";
    return 1;
  }
}
