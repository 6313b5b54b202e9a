// dump_optim: the xgrad half of the optimizer cross-check (tests/torch/optim_crosscheck.py).
//
// From a fixed seed it draws float64 parameters (a [3, 4] matrix and a [5] vector) and 20
// steps of gradients, runs each optimizer below for 20 steps with those gradients, and
// writes ONE JSON file (path = argv[1]) holding, per run, the hyperparameters, the initial
// parameters, every step's gradients and learning rate, and xgrad's parameters after every
// step. The learning rate follows nn::warmup_cosine (warmup 3, total 20); the python side
// checks those values against the schedule's closed form and feeds them to torch.
//
// Runs: adamw (weight decay 0.1, amsgrad off), adam (L2 weight decay 0.05), sgd_momentum
// (momentum 0.9, weight decay 0.01), sgd (plain).
// JSON: an array is {"shape": [...], "data": [...]} row-major, doubles as %.17g.
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/json_text.hpp"
#include <xgrad/xgrad.hpp>

namespace {

using namespace xgt::json_text;
using namespace xg;

constexpr int kSteps = 20;
constexpr std::int64_t kWarmup = 3, kTotal = 20;
constexpr double kLrMax = 0.05, kLrMin = 0.005;

struct Data {
  std::vector<Array> init;                // per parameter
  std::vector<std::vector<Array>> grads;  // [step][parameter]
};

Data draw(std::uint64_t seed) {
  Generator g(seed);
  Data d;
  const std::vector<Shape> shapes = {{3, 4}, {5}};
  for (const Shape& s : shapes) d.init.push_back(random_normal(s, g, DType::float64));
  for (int t = 0; t < kSteps; ++t) {
    std::vector<Array> step;
    for (const Shape& s : shapes) step.push_back(random_normal(s, g, DType::float64, 0.0, t % 3 == 0 ? 2.0 : 0.5));
    d.grads.push_back(step);
  }
  return d;
}

std::string run(const std::string& name, const Data& d) {
  std::vector<Tensor> ps;
  nn::NamedTensors named;
  for (std::size_t k = 0; k < d.init.size(); ++k) {
    ps.emplace_back(d.init[k].clone(), true);
    named.emplace_back("p" + std::to_string(k), ps.back());
  }
  std::unique_ptr<nn::Optimizer> opt;
  std::string hyper;
  if (name == "adamw") {
    opt = std::make_unique<nn::AdamW>(named, kLrMax, 0.1, 0.9, 0.999, 1e-8);
    hyper = "\"betas\":[0.9,0.999],\"eps\":1e-8,\"weight_decay\":0.1";
  } else if (name == "adam") {
    opt = std::make_unique<nn::Adam>(named, kLrMax, 0.8, 0.99, 1e-6, 0.05);
    hyper = "\"betas\":[0.8,0.99],\"eps\":1e-6,\"weight_decay\":0.05";
  } else if (name == "sgd_momentum") {
    opt = std::make_unique<nn::SGD>(named, kLrMax, 0.9, 0.01);
    hyper = "\"momentum\":0.9,\"weight_decay\":0.01";
  } else {
    opt = std::make_unique<nn::SGD>(named, kLrMax);
    hyper = "\"momentum\":0,\"weight_decay\":0";
  }
  std::string lrs = "[", grads = "[", after = "[";
  for (int t = 0; t < kSteps; ++t) {
    opt->lr = nn::warmup_cosine(t, kWarmup, kTotal, kLrMax, kLrMin);
    lrs += (t ? "," : "") + jnum(opt->lr);
    opt->zero_grad();
    grads += t ? ",[" : "[";
    for (std::size_t k = 0; k < ps.size(); ++k) {
      ps[k].set_grad(d.grads[t][k].clone());
      grads += (k ? "," : "") + jarray(d.grads[t][k]);
    }
    grads += "]";
    opt->step();
    after += t ? ",[" : "[";
    for (std::size_t k = 0; k < ps.size(); ++k) after += (k ? "," : "") + jarray(ps[k].value());
    after += "]";
  }
  std::string init = "[";
  for (std::size_t k = 0; k < d.init.size(); ++k) init += (k ? "," : "") + jarray(d.init[k]);
  return "{\"name\":" + jstr(name) + "," + hyper + ",\"kind\":" + jstr(opt->kind()) + ",\"init\":" + init +
         "],\"lr\":" + lrs + "],\"grads\":" + grads + "],\"after\":" + after + "]}";
}

}  // namespace

int main(int argc, char** argv) {
  // run_crosscheck.sh also passes the attention implementation ("automatic"); no attention here.
  if (argc != 2 && !(argc == 3 && std::string(argv[2]) == "automatic")) {
    std::fprintf(stderr, "usage: dump_optim OUT.json [automatic]\n");
    return 2;
  }
  try {
    const Data d = draw(20261201);
    std::string out = "{\"schedule\":{\"warmup\":" + std::to_string(kWarmup) + ",\"total\":" + std::to_string(kTotal) +
                      ",\"lr_max\":" + jnum(kLrMax) + ",\"lr_min\":" + jnum(kLrMin) + "},\"runs\":[";
    const char* names[] = {"adamw", "adam", "sgd_momentum", "sgd"};
    for (int i = 0; i < 4; ++i) out += (i ? "," : "") + run(names[i], d);
    out += "]}\n";
    std::FILE* f = std::fopen(argv[1], "w");
    if (!f) {
      std::fprintf(stderr, "dump_optim: cannot write %s\n", argv[1]);
      return 1;
    }
    std::fputs(out.c_str(), f);
    std::fclose(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_optim: %s\n", e.what());
    return 1;
  }
  return 0;
}
