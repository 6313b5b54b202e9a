// train_module (train/custom_run.hpp): a module of the test's own trains through the run
// folder (its loss falls, log.csv has a row a step, config.json names the run), compare and
// report read the folder, a run stopped and resumed equals the uninterrupted one bit for bit in
// float64 (parameters and every logged loss), a GPT with a registered activation trained this
// way loads back with train::load_model, and bad input is refused.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "tests/support/helpers.hpp"
#include <xgrad/nn/layer_registry.hpp>
#include <xgrad/runs/compare.hpp>
#include <xgrad/runs/report.hpp>
#include <xgrad/runs/run_folder.hpp>
#include <xgrad/train/checkpoint.hpp>
#include <xgrad/train/custom_run.hpp>

using namespace xg;
using namespace xgt;

namespace {

// y = tanh(x W1 + b1) W2, regressing sin of the inputs' sum; dropout after the tanh.
class SmallNet : public nn::Module {
 public:
  explicit SmallNet(Generator& g)
      : W1(register_parameter("W1", random_normal({3, 16}, g, DType::float64, 0.0, 0.5))),
        b1(register_parameter("b1", Array::zeros({16}, DType::float64))),
        W2(register_parameter("W2", random_normal({16, 1}, g, DType::float64, 0.0, 0.5))) {}
  Tensor operator()(const Tensor& x, Generator* dropout) const {
    Tensor h = ops::tanh(ops::matmul(x, W1) + b1);
    if (training() && dropout) h = ops::dropout(h, 0.1, *dropout, true);
    return ops::matmul(h, W2);
  }
  Tensor W1, b1, W2;
};

// A batch of 16 drawn from the run's data generator, and its mean squared error.
Tensor batch_loss(nn::Module& m, train::StepInput& in) {
  auto& net = dynamic_cast<SmallNet&>(m);
  const Array x = random_uniform({16, 3}, in.data, DType::float64, -1, 1);
  Array y = Array::zeros({16, 1}, DType::float64);
  for (std::size_t i = 0; i < 16; ++i)
    y.data<double>()[i] = std::sin(x.data<double>()[3 * i] + x.data<double>()[3 * i + 1] - x.data<double>()[3 * i + 2]);
  const Tensor d = net(Tensor(x), &in.dropout) - Tensor(y);
  return ops::mean(d * d);
}

// A fixed held-out set.
double held_out(nn::Module& m) {
  Generator g(99);
  train::StepInput in{0, g, g};
  return batch_loss(m, in).item();
}

train::RunOptions options(const std::filesystem::path& out) {
  train::RunOptions o;
  o.out = out.string();
  o.steps = 40;
  o.lr = 0.02;
  o.warmup = 4;
  o.eval_every = 10;
  o.name = "regression";
  o.config["hidden"] = "16";
  return o;
}

std::vector<std::string> lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> v;
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// A log row without its wall-clock columns (tokens_per_s, elapsed_s).
std::string without_time(const std::string& row) {
  const std::vector<std::string> f = runs::csv_fields(row);
  std::string s;
  for (std::size_t i = 0; i < f.size(); ++i)
    if (i != 4 && i != 5) s += f[i] + ",";
  return s;
}

}  // namespace

TEST_CASE("train_module: a module of its own trains through a run folder that compare and report read",
          "[custom_run]") {
  const auto dir = temp_dir("custom_run_basic");
  Generator g(1);
  SmallNet net(g);
  const double before = held_out(net);
  const train::ModuleRunResult r = train::train_module(net, batch_loss, options(dir / "run"), held_out);
  REQUIRE(r.losses.size() == 40);
  REQUIRE(r.val_loss.has_value());
  INFO("held-out loss before " << sci(before) << ", after " << sci(*r.val_loss));
  CHECK(*r.val_loss < 0.5 * before);
  // log.csv: a row a step, validation at 10, 20, 30, 40.
  const runs::RunLogData log = runs::read_log((dir / "run" / "log.csv").string());
  REQUIRE(log.rows.size() == 40);
  CHECK(log.rows[9].val_loss.has_value());
  CHECK(!log.rows[10].val_loss.has_value());
  CHECK(log.rows[39].val_loss == r.val_loss);
  CHECK(log.rows[0].loss == r.losses[0]);
  // compare reads the folder: options from config.json, the summary from the log.
  const runs::RunSummary s = runs::read_run((dir / "run").string());
  CHECK(s.options_source == "config.json");
  CHECK(s.options.at("task") == "regression");
  CHECK(s.options.at("hidden") == "16");
  CHECK(s.steps == 40);
  CHECK(s.best_val_loss.has_value());
  CHECK(runs::compare_table({s}).find("regression") != std::string::npos);
  const runs::RunOutput out = runs::read_run_output(s);
  REQUIRE(!out.result_lines.empty());
  CHECK(out.result_lines[0].rfind("RESULT train_loss ", 0) == 0);
  // The report page holds the run.
  const std::string html = train::write_report({(dir / "run").string()}, (dir / "report.html").string());
  const std::string page = read_file(html);
  CHECK(page.find("regression") != std::string::npos);
  CHECK(page.find("<html") != std::string::npos);
  // The models: the last and the best, loadable into the module.
  SmallNet other(g);
  nn::safetensors::load_module((dir / "run" / "model.safetensors").string(), other);
  XGT_CHECK_SAME(other.W2.value(), net.W2.value());
  CHECK(std::filesystem::exists(dir / "run" / "model_best.safetensors"));
}

TEST_CASE("train_module: a run stopped and resumed is the uninterrupted run bit for bit in float64", "[custom_run]") {
  const auto dir = temp_dir("custom_run_resume");
  Generator g1(2), g2(2);
  SmallNet a(g1), b(g2);
  train::RunOptions oa = options(dir / "straight"), ob = options(dir / "resumed");
  oa.checkpoint_every = ob.checkpoint_every = 7;
  train::train_module(a, batch_loss, oa, held_out);
  ob.stop_at = 17;  // between checkpoints: stop_at writes its own
  const train::ModuleRunResult first = train::train_module(b, batch_loss, ob, held_out);
  CHECK(first.steps_done == 17);
  CHECK(!std::filesystem::exists(dir / "resumed" / "result.txt"));
  // A new module (other initial values) continues from the folder alone.
  Generator g3(3);
  SmallNet c(g3);
  ob.stop_at = 0;
  ob.resume = true;
  const train::ModuleRunResult second = train::train_module(c, batch_loss, ob, held_out);
  CHECK(second.losses.size() == 23);
  // One process, the same shapes and thread partition: the same bits.
  XGT_CHECK_SAME(c.W1.value(), a.W1.value());
  XGT_CHECK_SAME(c.b1.value(), a.b1.value());
  XGT_CHECK_SAME(c.W2.value(), a.W2.value());
  const std::vector<std::string> la = lines(dir / "straight" / "log.csv"), lb = lines(dir / "resumed" / "log.csv");
  REQUIRE(la.size() == 41);
  REQUIRE(lb.size() == 41);
  for (std::size_t i = 0; i < la.size(); ++i) {
    INFO("log line " << i);
    CHECK(without_time(la[i]) == without_time(lb[i]));
  }
  CHECK(std::filesystem::exists(dir / "resumed" / "result.txt"));
}

TEST_CASE("train_module: a GPT with a registered activation trains and loads back", "[custom_run][layer_registry]") {
  if (!nn::is_registered(nn::LayerKind::activation, "test_run_softsign"))
    nn::register_activation("test_run_softsign", [](const Tensor& x) { return x / (ops::abs(x) + 1.0); });
  const auto dir = temp_dir("custom_run_gpt");
  train::ModelInfo info;
  info.kind = train::ModelKind::gpt;
  info.task = "llama2c";
  info.config.V_vocab = 7;
  info.config.context = 8;
  info.config.d_model = 8;
  info.config.H_q = 2;
  info.config.layers = 1;
  info.config.dtype = DType::float64;
  info.config.activation = "test_run_softsign";
  for (std::size_t i = 0; i < 7; ++i) info.vocab.tokens.push_back("<" + std::to_string(i) + ">");
  Generator g(4);
  nn::GPT m(info.config, g);
  train::RunOptions o;
  o.out = (dir / "run").string();
  o.steps = 6;
  o.lr = 0.01;
  o.model_metadata = train::model_metadata(info);
  const auto loss = [](nn::Module& mod, train::StepInput& in) {
    std::vector<std::int64_t> ids(2 * 7);
    for (auto& t : ids) t = static_cast<std::int64_t>(in.data.below(7));
    const IndexArray all({2, 7}, ids);
    std::vector<std::int64_t> x, y;  // predict the next token of each row
    for (std::size_t r = 0; r < 2; ++r)
      for (std::size_t t = 0; t < 6; ++t) {
        x.push_back(ids[r * 7 + t]);
        y.push_back(ids[r * 7 + t + 1]);
      }
    (void)all;
    return dynamic_cast<nn::GPT&>(mod).loss(IndexArray({2, 6}, x), IndexArray({2, 6}, y));
  };
  train::train_module(m, loss, o);
  train::LoadedModel lm = train::load_model((dir / "run" / "model.safetensors").string());
  CHECK(lm.info.config.activation == "test_run_softsign");
  m.eval();
  const IndexArray t({1, 4}, std::vector<std::int64_t>{1, 2, 3, 4});
  XGT_CHECK_SAME(lm.gpt->logits(t).value(), m.logits(t).value());
}

TEST_CASE("train_module: bad options and another run's folder and a bad loss are refused", "[custom_run]") {
  const auto dir = temp_dir("custom_run_bad");
  Generator g(5);
  SmallNet net(g);
  train::RunOptions o = options(dir / "run");
  o.warmup = 0;
  o.eval_every = 0;
  o.steps = 0;
  CHECK(error_of<UsageError>([&] { train::train_module(net, batch_loss, o); }).find("steps 0") != std::string::npos);
  o.steps = 3;
  o.config["lr"] = "1";
  CHECK(error_of<UsageError>([&] { train::train_module(net, batch_loss, o); }).find("'lr'") != std::string::npos);
  o.config.erase("lr");
  train::train_module(net, batch_loss, o);
  // The folder holds a run: a new one is refused, resuming with other options too.
  CHECK(error_of<UsageError>([&] { train::train_module(net, batch_loss, o); }).find("another run") !=
        std::string::npos);
  o.resume = true;
  o.lr = 0.5;
  CHECK(error_of<UsageError>([&] { train::train_module(net, batch_loss, o); }).find("lr 0.02") != std::string::npos);
  // A loss that is not a scalar.
  o = options(dir / "vector");
  o.steps = 2;
  o.warmup = 0;
  const auto vector_loss = [](nn::Module& m, train::StepInput&) { return dynamic_cast<SmallNet&>(m).W2 * 1.0; };
  CHECK(error_of<ValueError>([&] { train::train_module(net, vector_loss, o); }).find("must be a scalar") !=
        std::string::npos);
  // Refused at step 1: no file of the run (the next attempt is not "another run").
  CHECK(std::filesystem::is_empty(dir / "vector"));
  CHECK(train::train_module(net, batch_loss, o).steps_done == 2);
}
