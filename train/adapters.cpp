// LoRA adapters and frozen weights in training runs (train/adapters.hpp).
#include <xgrad/train/adapters.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <regex>

#include <xgrad/core/error.hpp>
#include <xgrad/io/number.hpp>
#include <xgrad/nn/lora.hpp>

namespace xg::train {

namespace {

const char* const kRank = "lora.rank";
const char* const kAlpha = "lora.alpha";
const char* const kTargets = "lora.targets";
const char* const kFrozen = "frozen";

[[noreturn]] void refuse(const std::string& message) { throw UsageError(op_message("train", message)); }

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

nn::Architecture arch_of(const std::string& arch) {
  return arch == "llama" ? nn::Architecture::llama : nn::Architecture::gpt;
}

// The adapter on projection `name` of `block`, or null.
const nn::Adapter* adapter_of(const nn::DecoderLayer& block, const std::string& name) {
  using P = nn::MultiHeadAttention::Projection;
  if (name == "q") return block.attn.adapter(P::q);
  if (name == "k") return block.attn.adapter(P::k);
  if (name == "v") return block.attn.adapter(P::v);
  if (name == "o") return block.attn.adapter(P::o);
  if (const nn::SwiGLUFeedForward* f = nn::swiglu_ffn(block)) {
    if (name == "gate") return f->gate.adapter();
    if (name == "up") return f->up.adapter();
    if (name == "down") return f->down.adapter();
  }
  if (const nn::FeedForward* f = nn::gelu_ffn(block)) {
    if (name == "fc1") return f->fc1.adapter();
    if (name == "fc2") return f->fc2.adapter();
  }
  return nullptr;
}

// The widths (d_in, d_out) of projection `name` in a model of configuration `c` (resolved).
std::pair<std::uint64_t, std::uint64_t> widths(const std::string& name, const nn::TransformerConfig& c) {
  const std::uint64_t d = c.d_model, d_h = c.H_q ? c.d_model / c.H_q : 0, q = c.H_q * d_h, kv = c.H_kv * d_h,
                      f = c.d_ff;
  if (name == "q") return {d, q};
  if (name == "k" || name == "v") return {d, kv};
  if (name == "o") return {q, d};
  if (name == "gate" || name == "up" || name == "fc1") return {d, f};
  return {f, d};  // down, fc2
}

}  // namespace

void check_adapter_options(const TrainOptions& o, const std::set<std::string>& given) {
  if (given.count("lora_rank") && o.lora_rank == 0)
    refuse("--lora-rank 0: must be positive (leave --lora-rank out for no adapters)");
  if (o.lora_rank == 0) {
    const TrainOptions defaults;
    if (given.count("lora_alpha") || o.lora_alpha != defaults.lora_alpha)
      refuse("--lora-alpha needs --lora-rank: without it the run has no adapters");
    if (given.count("lora_targets") || o.lora_targets != defaults.lora_targets)
      refuse("--lora-targets needs --lora-rank: without it the run has no adapters");
  }
  if (o.lora_rank > 0) {
    if (o.task == "reverse") refuse("--lora-rank: the reverse task's encoder-decoder cannot hold adapters (decoder-only tasks)");
    try {
      nn::lora_targets(o.lora_targets, arch_of(o.arch));
    } catch (const ValueError& e) {
      std::string what = e.what();
      const std::string tag = "[lora] ";
      if (what.rfind(tag, 0) == 0) what = what.substr(tag.size());
      refuse("--lora-targets " + (o.lora_targets.empty() ? std::string("''") : o.lora_targets) + ": " + what);
    }
  }
  // A model with adapters is a base model plus its adapters: folded in first, it starts any run.
  if (!o.init_from.empty() && has_adapters(io::safetensors::load_header(o.init_from).metadata))
    refuse("--init-from " + o.init_from + " has LoRA adapters; fold them in first (xgrad merge --checkpoint " +
           o.init_from + " --out merged.safetensors) and start from the merged model");
  if (given.count("freeze")) {
    if (o.freeze.empty()) refuse("--freeze '': give a regular expression that matches parameter names");
    try {
      std::regex re(o.freeze);
    } catch (const std::regex_error& e) {
      refuse("--freeze '" + o.freeze + "' is not a regular expression (" + e.what() + ")");
    }
  }
}

AdapterSummary apply_adapters(nn::Module& model, const TrainOptions& o, Generator& gen) {
  AdapterSummary s;
  if (o.lora_rank > 0) {
    auto* gpt = dynamic_cast<nn::GPT*>(&model);
    if (!gpt) refuse("--lora-rank: the " + o.task + " task's model cannot hold adapters (decoder-only tasks)");
    nn::LoRAConfig cfg;
    cfg.rank = o.lora_rank;
    cfg.alpha = o.lora_alpha;
    cfg.freeze_base = true;
    try {
      s.adapters = nn::add_lora(*gpt, o.lora_targets, cfg, gen);
    } catch (const ValueError& e) {  // a rank that does not fit a projection
      std::string what = e.what();
      const std::string tag = "[lora] ";
      if (what.rfind(tag, 0) == 0) what = what.substr(tag.size());
      refuse("--lora-rank " + std::to_string(o.lora_rank) + ": " + what);
    }
  }
  if (!o.freeze.empty()) {
    const auto before = model.named_trainable_parameters().size();
    std::regex re(o.freeze);
    std::size_t matched = 0;
    for (const auto& [name, p] : model.named_parameters()) matched += std::regex_search(name, re) ? 1 : 0;
    if (matched == 0)
      refuse("--freeze '" + o.freeze + "' matches no parameter of the model (names like '" +
             model.named_parameters().front().first + "'; xgrad inspect lists them)");
    if (model.named_trainable_parameters().size() > 0) {
      std::size_t left = 0;
      for (const auto& [name, p] : model.named_trainable_parameters()) left += std::regex_search(name, re) ? 0 : 1;
      if (left == 0)
        refuse("--freeze '" + o.freeze + "' freezes every " + (o.lora_rank > 0 ? "trainable " : "") +
               "parameter of the model: nothing would train");
    }
    model.set_requires_grad([&](const std::string& n) { return std::regex_search(n, re); }, false);
    s.frozen = before - model.named_trainable_parameters().size();
  }
  s.trainable_scalars = model.trainable_parameter_count();
  s.total_scalars = model.parameter_count();
  if (o.lora_rank > 0) s.frozen = model.named_parameters().size() - model.named_trainable_parameters().size();
  return s;
}

std::string describe_adapters(const AdapterSummary& s, const TrainOptions& o) {
  if (s.adapters == 0 && s.frozen == 0) return "";
  std::string line;
  if (s.adapters > 0)
    line = "LoRA rank " + std::to_string(o.lora_rank) + " (alpha " + number_text(o.lora_alpha) + ") on " +
           joined(nn::lora_targets(o.lora_targets, arch_of(o.arch))) + ": " + std::to_string(s.adapters) +
           " adapters; ";
  if (!o.freeze.empty()) line += "--freeze '" + o.freeze + "'; ";
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.2f%%",
                s.total_scalars ? 100.0 * static_cast<double>(s.trainable_scalars) / static_cast<double>(s.total_scalars) : 0.0);
  return line + std::to_string(s.trainable_scalars) + " of " + std::to_string(s.total_scalars) +
         " parameters trainable (" + pct + "), " + std::to_string(s.total_scalars - s.trainable_scalars) + " frozen\n";
}

io::safetensors::Metadata adapter_metadata(const nn::Module& model) {
  io::safetensors::Metadata m;
  const std::size_t frozen = model.parameter_count() - model.trainable_parameter_count();
  if (frozen > 0) m[kFrozen] = std::to_string(frozen);
  const auto* gpt = dynamic_cast<const nn::GPT*>(&model);
  if (!gpt || gpt->blocks.empty() || nn::count_adapters(*gpt) == 0) return m;
  std::vector<std::string> targets;
  const nn::LoRA* lora = nullptr;
  for (const std::string& name : nn::lora_targets("all", gpt->config().arch))
    if (const nn::Adapter* a = adapter_of(*gpt->blocks.front(), name)) {
      targets.push_back(name);
      lora = dynamic_cast<const nn::LoRA*>(a);
      if (!lora) throw ValueError(op_message("checkpoint", "adapter on " + name + " is not a LoRA; cannot save it"));
    }
  m[kRank] = std::to_string(lora->rank());
  m[kAlpha] = io::exact_text(lora->alpha());
  m[kTargets] = joined(targets);
  return m;
}

bool has_adapters(const io::safetensors::Metadata& meta) { return meta.count(kRank) > 0; }

namespace {

struct SavedLoRA {
  std::size_t rank = 0;
  double alpha = 0;
  std::vector<std::string> targets;
};

SavedLoRA read_saved(const io::safetensors::Metadata& meta, nn::Architecture arch, const std::string& path) {
  SavedLoRA s;
  for (const char* k : {kAlpha, kTargets})
    if (!meta.count(k))
      throw FormatError("[checkpoint] " + path + ": metadata has lora.rank but lacks '" + std::string(k) + "'");
  const std::int64_t r = io::parse_int(meta.at(kRank), "[checkpoint] " + path + ": metadata 'lora.rank'");
  if (r < 1 || r > 65536)
    throw FormatError("[checkpoint] " + path + ": metadata 'lora.rank' is " + meta.at(kRank) + ", not in [1, 65536]");
  s.rank = static_cast<std::size_t>(r);
  s.alpha = io::parse_double(meta.at(kAlpha), "[checkpoint] " + path + ": metadata 'lora.alpha'");
  if (!(s.alpha > 0) || !std::isfinite(s.alpha))
    throw FormatError("[checkpoint] " + path + ": metadata 'lora.alpha' is " + meta.at(kAlpha) +
                      ", not positive and finite");
  try {
    s.targets = nn::lora_targets(meta.at(kTargets), arch);
  } catch (const ValueError& e) {
    throw FormatError("[checkpoint] " + path + ": metadata 'lora.targets': " + e.what());
  }
  return s;
}

}  // namespace

std::uint64_t adapter_parameter_count(const io::safetensors::Metadata& meta, const nn::TransformerConfig& c,
                                      const std::string& path) {
  if (!has_adapters(meta)) return 0;
  const SavedLoRA s = read_saved(meta, c.arch, path);
  std::uint64_t per_block = 0;
  for (const std::string& t : s.targets) {
    const auto [d_in, d_out] = widths(t, c);
    if (s.rank > std::min(d_in, d_out))
      throw FormatError("[checkpoint] " + path + ": metadata 'lora.rank' " + std::to_string(s.rank) +
                        " is larger than projection " + t + " (" + std::to_string(d_in) + " -> " +
                        std::to_string(d_out) + ")");
    per_block += s.rank * (d_in + d_out);
  }
  return per_block * c.layers;
}

void add_saved_adapters(const io::safetensors::Metadata& meta, nn::GPT& model, const std::string& path) {
  if (!has_adapters(meta)) return;
  const SavedLoRA s = read_saved(meta, model.config().arch, path);
  nn::LoRAConfig cfg;
  cfg.rank = s.rank;
  cfg.alpha = s.alpha;
  cfg.freeze_base = false;
  Generator gen(0);  // the checkpoint's values replace A
  try {
    nn::add_lora(model, joined(s.targets), cfg, gen);
  } catch (const ValueError& e) {
    throw FormatError("[checkpoint] " + path + ": its adapters do not fit the model: " + e.what());
  }
}

void load_frozen_parameters(nn::Module& model, const std::string& model_path) {
  std::vector<std::pair<std::string, Tensor>> frozen;
  for (const auto& [name, p] : model.named_parameters())
    if (!p.requires_grad()) frozen.emplace_back(name, p);
  if (frozen.empty()) return;
  const io::safetensors::File f = io::safetensors::load(model_path);
  for (auto& [name, p] : frozen) {
    const Array* found = nullptr;
    for (const auto& [n, a] : f.tensors)
      if (n == name) found = &a;
    if (!found)
      throw FormatError("[train] " + model_path + ": lacks the frozen parameter '" + name +
                        "' (train_state.safetensors holds only the trainable ones); cannot resume");
    if (found->shape() != p.shape() || found->dtype() != p.dtype())
      throw FormatError("[train] " + model_path + ": frozen parameter '" + name + "' has shape " +
                        shape_str(found->shape()) + ", the model's has " + shape_str(p.shape()));
    const std::size_t bad = found->first_nonfinite();
    if (bad != found->size())
      throw FormatError("[train] " + model_path + ": frozen parameter '" + name + "' element " + std::to_string(bad) +
                        " is not finite");
    p.set_value(*found);
  }
}

std::uint64_t frozen_parameter_count(const io::safetensors::Metadata& meta, std::uint64_t total,
                                     const std::string& path) {
  const auto it = meta.find(kFrozen);
  if (it == meta.end()) return 0;
  const std::int64_t n = io::parse_int(it->second, "[checkpoint] " + path + ": metadata 'frozen'");
  if (n < 0 || static_cast<std::uint64_t>(n) > total)
    throw FormatError("[checkpoint] " + path + ": metadata 'frozen' is " + it->second + ", not a count in [0, " +
                      std::to_string(total) + "]");
  return static_cast<std::uint64_t>(n);
}

io::safetensors::Metadata without_adapter_metadata(io::safetensors::Metadata meta) {
  for (const char* k : {kRank, kAlpha, kTargets, kFrozen}) meta.erase(k);
  return meta;
}

}  // namespace xg::train
