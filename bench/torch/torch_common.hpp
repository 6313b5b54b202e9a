// What the libtorch reference programs share: the extra --blas-threads flag, the thread
// setup, the masks as libtorch bool tensors, and the composed attention (matmul, masked_fill,
// softmax, matmul) that xgrad's benchmarks are compared with.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>

#include "bench/common.hpp"

namespace bench::torchref {

struct ThreadFlags {
  std::optional<int> blas_threads;  // unset: OpenBLAS's own default (one per core)
};
void add_flags(CLI::App& app, ThreadFlags& f);

// Runs body; a libtorch error (c10::Error) is rethrown with its message only, without the
// C++ backtrace libtorch appends, so that it prints as one line.
void without_backtrace(const std::function<void()>& body);

// bench::run_program for a reference program: its flags plus --blas-threads, then
// run(f, thread_flags) with libtorch errors on one line.
template <class Flags, class Run>
int run_program(const std::string& program, const std::string& description, int argc, char** argv, Flags& f, Run run) {
  ThreadFlags tf;
  return bench::run_program(
      program, description, argc, argv,
      [&](CLI::App& app) {
        bench::add_flags(app, f);
        add_flags(app, tf);
      },
      [&] { without_backtrace([&] { run(f, tf); }); });
}

// torch::set_num_threads(threads) (ATen's intra-op OpenMP pool) and, if given, OpenBLAS's
// own thread count, which torch::set_num_threads does not change. Prints what was set.
void set_threads(int threads, const ThreadFlags& f);

// Forbidden keys for an attention flags' --mask, true = hidden: [T, T] for causal and
// documents, [B, 1, 1, T] for padding; undefined for none.
torch::Tensor hidden_mask(const AttentionFlags& f);

// O = softmax((Q scale) K^T, masked) V for Q [B, H, T, dh], K, V [B, H_kv, S, dh]. GQA without
// copying K and V: the query heads of one kv head are stacked along the rows
// ([B, H_kv, r T, dh]), as xgrad's composed path does. hidden broadcasts to [B, H, T, S].
torch::Tensor composed_attention(const torch::Tensor& Q, const torch::Tensor& K, const torch::Tensor& V,
                                 const torch::Tensor& hidden);

// at::_scaled_dot_product_attention, libtorch 1.13's internal attention entry point (the
// public scaled_dot_product_attention arrives in 2.0); K and V repeated to H heads for GQA.
torch::Tensor library_attention(const torch::Tensor& Q, const torch::Tensor& K, const torch::Tensor& V,
                                const torch::Tensor& hidden);

}  // namespace bench::torchref
