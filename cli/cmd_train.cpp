// `xgrad train`: trains a built-in task from scratch (or resumes a run). With no arguments
// it is the main job: the sort task, reaching >= 99% held-out exact match in a few minutes.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>

#include "cli/commands.hpp"
#include "train/trainer.hpp"

namespace xg::cli {

void add_train(CLI::App& app) {
  auto o = std::make_shared<train::TrainOptions>();
  CLI::App* cmd = app.add_subcommand("train", "Train a tiny transformer on a built-in task (the main job)");
  cmd->add_option("--task", o->task, "sort (decoder-only), reverse (encoder-decoder) or charlm")
      ->check(CLI::IsMember({"sort", "reverse", "charlm"}))
      ->capture_default_str();
  cmd->add_option("--text", o->text, "text file for charlm")->capture_default_str();
  cmd->add_option("--out", o->out, "output directory")->capture_default_str();
  cmd->add_option("--resume", o->resume, "continue the run saved in this output directory");
  cmd->add_option("--steps", o->steps, "training steps (0: task default)")->capture_default_str();
  cmd->add_option("--batch", o->batch, "sequences per step")->capture_default_str();
  cmd->add_option("--lr", o->lr, "peak learning rate (0: task default)")->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", o->weight_decay, "AdamW weight decay")->capture_default_str();
  cmd->add_option("--clip", o->clip, "gradient clipping by global norm")->capture_default_str();
  cmd->add_option("--d-model", o->d_model, "model width")->capture_default_str();
  cmd->add_option("--heads", o->heads, "query heads H_q")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "key/value heads H_kv (0: = heads; 1: MQA)")->capture_default_str();
  cmd->add_option("--layers", o->layers, "transformer layers")->capture_default_str();
  cmd->add_option("--d-ff", o->d_ff, "feed-forward width (0: 4 d_model)")->capture_default_str();
  cmd->add_option("--dropout", o->dropout, "dropout")->capture_default_str();
  cmd->add_option("--context", o->context, "charlm context length")->capture_default_str();
  cmd->add_option("--digits", o->n_digits, "sort: digits per problem")->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed (initialisation, data, dropout)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "xgrad worker threads (0: one per core)")->capture_default_str();
  cmd->add_option("--eval-every", o->eval_every, "evaluate every N steps (0: only at the end)")->capture_default_str();
  cmd->add_option("--checkpoint-every", o->checkpoint_every, "checkpoint every N steps (0: only at the end)")->capture_default_str();
  cmd->add_option("--stop-at", o->stop_at, "stop after this step, as if interrupted (for resume)");
  cmd->add_flag("--no-progress{false}", o->progress, "no live progress line");
  cmd->add_flag("--no-plot{false}", o->plot, "do not draw loss.png");
  cmd->callback([o] { train::run_training(*o, std::cout); });
}

}  // namespace xg::cli
