// Data-parallel training on a Communicator (docs/distributed.md): which rows of a global
// batch a rank computes, the gradient all-reduce in flat buckets, parameter broadcast and
// the cross-rank parameter checksum, and failures that every rank sees at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/dist/communicator.hpp>
#include <xgrad/nn/optim.hpp>

namespace xg::dist {

// Rows [begin, end) of a global batch of `global` rows for `rank` of `size`: contiguous
// equal blocks in rank order. UsageError when size does not divide global (the flag is
// named by the caller's message).
struct Shard {
  std::size_t begin = 0, end = 0;
  std::size_t rows() const { return end - begin; }
};
Shard shard_of(std::size_t global, int rank, int size);

// --- failures ------------------------------------------------------------------------------
//
// A failure that every rank knows about at the same point (a bad option, a file rank 0 could
// not read, a non-finite global loss) ends the job cleanly: one rank reports it and every
// rank exits with the same status. A failure on one rank alone (a failed write, an MPI
// error, a crash) cannot be waited for: that rank reports it and aborts the job.
//
// CollectiveError carries the failure to the top of each rank: on the reporting rank,
// rethrow() throws the original exception; the others exit quietly with exit_code().
class CollectiveError : public std::exception {
 public:
  CollectiveError(std::exception_ptr original, int exit_code, bool reporter, std::string summary)
      : original_(std::move(original)), exit_code_(exit_code), reporter_(reporter), summary_(std::move(summary)) {}
  const char* what() const noexcept override { return summary_.c_str(); }
  int exit_code() const { return exit_code_; }
  bool reporter() const { return reporter_; }
  [[noreturn]] void rethrow() const { std::rethrow_exception(original_); }

 private:
  std::exception_ptr original_;
  int exit_code_;
  bool reporter_;
  std::string summary_;
};

// The exit status xgrad gives an exception: 2 for UsageError, 1 for anything else.
int exit_code_of(const std::exception_ptr& e);
std::string message_of(const std::exception_ptr& e);

// Runs f on every rank, then every rank learns whether any rank's f threw. If one did,
// every rank throws CollectiveError; the lowest failing rank is the reporter, with its own
// exception. f may call collectives only if every rank is sure to reach them.
void together(Communicator& comm, const std::function<void()>& f);

// For a failure every rank detects at the same point with the same data: rank 0 reports e.
template <class E> [[noreturn]] void fail_together(const Communicator& comm, const E& e) {
  if (comm.size() == 1) throw e;
  throw CollectiveError(std::make_exception_ptr(e), exit_code_of(std::make_exception_ptr(e)), comm.rank() == 0, e.what());
}

// --- parameters ----------------------------------------------------------------------------

// root's parameter values to every rank (shapes and dtypes must agree).
void broadcast_parameters(Communicator& comm, const nn::NamedTensors& params, int root = 0);
// A 64-bit hash of every parameter's bytes, in order.
std::uint64_t parameter_checksum(const nn::NamedTensors& params);
// Collective: every rank's checksum against rank 0's. If any differs, every rank fails
// together with a ValueError naming `when` and the ranks whose parameters differ.
void check_parameters_agree(Communicator& comm, const nn::NamedTensors& params, const std::string& when);

// --- gradients -----------------------------------------------------------------------------
//
// Sums every parameter's gradient over the ranks. The parameters are packed into flat
// buckets of about bucket_bytes each (in reverse registration order: the order backward
// finishes them), one all-reduce per bucket. A parameter that has no gradient on any rank
// keeps none (the optimizer skips it, as in one process); one that has a gradient on some
// ranks gets the sum, the others contributing zeros.
//
// Overlap (overlap = true): call begin() before backward and pass hook() to it
// (BackwardOptions::on_leaf_grad); each bucket's all-reduce starts as soon as backward has
// finished all of its gradients, and reduce() waits for the rest. Without overlap,
// reduce() does everything after backward.
class GradientReducer {
 public:
  struct Options {
    std::size_t bucket_bytes = std::size_t(1) << 20;
    bool overlap = false;
  };
  GradientReducer(Communicator& comm, nn::NamedTensors params, Options opts);
  GradientReducer(Communicator& comm, nn::NamedTensors params) : GradientReducer(comm, std::move(params), Options{}) {}
  ~GradientReducer();

  void begin();
  // For BackwardOptions::on_leaf_grad: called with a leaf and its final gradient of this pass.
  std::function<void(const Tensor&, const Array&)> hook();
  void reduce();

  std::size_t buckets() const;
  std::size_t bytes() const;  // gradient bytes all-reduced per step
  // Seconds spent inside reduce() (packing, all-reduce, waiting, unpacking), last call and total.
  double last_seconds() const { return last_seconds_; }
  double total_seconds() const { return total_seconds_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double last_seconds_ = 0, total_seconds_ = 0;
};

}  // namespace xg::dist
