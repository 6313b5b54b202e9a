/// \file
/// Data-parallel training on a Communicator (docs/distributed.md): which rows of a global
/// batch a rank computes, the gradient all-reduce in flat buckets, parameter broadcast and
/// the cross-rank parameter checksum, and failures that every rank sees at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <xgrad/distributed/communicator.hpp>
#include <xgrad/nn/optim.hpp>

namespace xg::dist {

/// Rows [begin, end) of a global batch that one rank computes (shard_of()).
struct Shard {
  /// The first row and one past the last row of the shard in the global batch. @{
  std::size_t begin = 0, end = 0;
  /// @}
  /// The number of rows, end - begin.
  std::size_t rows() const { return end - begin; }
};
/// Rows [begin, end) of a global batch of `global` rows for `rank` of `size`: contiguous
/// equal blocks in rank order. UsageError when size does not divide global (the flag is
/// named by the caller's message); ValueError when rank is not in [0, size).
Shard shard_of(std::size_t global, int rank, int size);

// --- failures ------------------------------------------------------------------------------
//
// A failure that every rank knows about at the same point (a bad option, a file rank 0 could
// not read, a non-finite global loss) ends the job cleanly: one rank reports it and every
// rank exits with the same status. A failure on one rank alone (a failed write, an MPI
// error, a crash) cannot be waited for: that rank reports it and aborts the job.

/// A failure that every rank of the job knows about at the same point: it carries the failure
/// to the top of each rank, where the reporting rank's rethrow() throws the original
/// exception and the others exit quietly with exit_code(). Thrown by together() and
/// fail_together(); a failure on one rank alone (a failed write, an MPI error, a crash)
/// cannot be waited for: that rank reports it and aborts the job (Communicator::abort).
class CollectiveError : public std::exception {
 public:
  /// The failure `original` (null on ranks that did not see it) with the exit status every
  /// rank uses, whether this rank reports it, and the one-line `summary` that what() returns.
  CollectiveError(std::exception_ptr original, int exit_code, bool reporter, std::string summary)
      : original_(std::move(original)), exit_code_(exit_code), reporter_(reporter), summary_(std::move(summary)) {}
  /// The summary: the original message on the reporter, "rank N failed" on the others.
  const char* what() const noexcept override { return summary_.c_str(); }
  /// The exit status of every rank: 2 when the original was a UsageError, 1 otherwise.
  int exit_code() const { return exit_code_; }
  /// Whether this rank reports the failure (the lowest failing rank, or rank 0).
  bool reporter() const { return reporter_; }
  /// Throws the original exception. Call it on the reporter only: the other ranks hold none.
  [[noreturn]] void rethrow() const { std::rethrow_exception(original_); }

 private:
  std::exception_ptr original_;
  int exit_code_;
  bool reporter_;
  std::string summary_;
};

/// The exit status xgrad gives an exception: 2 for UsageError, 1 for anything else.
int exit_code_of(const std::exception_ptr& e);
/// The exception's message for the one-line report: what(), "out of memory" for
/// std::bad_alloc, "unknown error" for anything that is not a std::exception.
std::string message_of(const std::exception_ptr& e);

/// Runs f on every rank, then every rank learns whether any rank's f threw. If one did,
/// every rank throws CollectiveError; the lowest failing rank is the reporter, with its own
/// exception. f may call collectives only if every rank is sure to reach them. In a world of
/// one process f's exception propagates unchanged.
void together(Communicator& comm, const std::function<void()>& f);

/// Collective: every rank makes the measured kernel choices rank 0 makes. Rank 0 runs `choose`
/// (anything that makes the choices, e.g. the train command's `kernels:` line), whose speed
/// ratios come from the calibration cache or are measured there (docs/performance.md,
/// "Calibration cache"); the other ranks take rank 0's ratios and then run `choose`. Without
/// it each rank measures for itself, and a ratio near its threshold (or a cache written by
/// another build) can put the ranks on different kernels. A throw from `choose` on any rank is
/// every rank's (together()). In a world of one process: `choose` alone.
void agree_on_kernel_choices(Communicator& comm, const std::function<void()>& choose);

/// For a failure every rank detects at the same point with the same data: rank 0 reports e.
/// Throws e itself in a world of one process, otherwise a CollectiveError carrying it.
template <class E> [[noreturn]] void fail_together(const Communicator& comm, const E& e) {
  if (comm.size() == 1) throw e;
  throw CollectiveError(std::make_exception_ptr(e), exit_code_of(std::make_exception_ptr(e)), comm.rank() == 0, e.what());
}

// --- parameters ----------------------------------------------------------------------------

/// Collective: root's parameter values to every rank, in place (set_value on the other ranks).
/// The names, dtypes and shapes must agree on every rank; if not, every rank fails together
/// with a ValueError. Nothing to do in a world of one process.
void broadcast_parameters(Communicator& comm, const nn::NamedTensors& params, int root = 0);
/// A 64-bit hash of every parameter's bytes, in order (local: no communication).
std::uint64_t parameter_checksum(const nn::NamedTensors& params);
/// Collective: every rank's checksum against rank 0's. If any differs, every rank fails
/// together with a ValueError naming `when` and the ranks whose parameters differ.
void check_parameters_agree(Communicator& comm, const nn::NamedTensors& params, const std::string& when);

// --- gradients -----------------------------------------------------------------------------

/// Sums every parameter's gradient over the ranks. The parameters are packed into flat
/// buckets of about bucket_bytes each (in reverse registration order: the order backward
/// finishes them; one dtype per bucket), one all-reduce per bucket. A parameter that has no
/// gradient on any rank keeps none (the optimizer skips it, as in one process); one that has
/// a gradient on some ranks gets the sum, the others contributing zeros.
///
/// Overlap (overlap = true): call begin() before backward and pass hook() to it
/// (BackwardOptions::on_leaf_grad); each bucket's all-reduce starts as soon as backward has
/// finished all of its gradients, and reduce() waits for the rest. Without overlap,
/// reduce() does everything after backward. Every rank must make the same calls.
class GradientReducer {
 public:
  /// How gradients are bucketed and when their all-reduce starts.
  struct Options {
    /// A bucket is closed once it holds at least this many bytes (ValueError if 0); a
    /// parameter larger than that gets a bucket of its own. Default 1 MiB.
    std::size_t bucket_bytes = std::size_t(1) << 20;
    /// Start each bucket's all-reduce during backward through hook() (see the class).
    bool overlap = false;
  };
  /// A reducer of the gradients of `params` (the same list, in the same order, on every rank)
  /// over the ranks of `comm`, which must outlive it. ValueError if opts.bucket_bytes is 0.
  GradientReducer(Communicator& comm, nn::NamedTensors params, Options opts);
  /// The same with the default Options (1 MiB buckets, no overlap).
  GradientReducer(Communicator& comm, nn::NamedTensors params) : GradientReducer(comm, std::move(params), Options{}) {}
  /// Frees the buckets (any all-reduce still running is waited for).
  ~GradientReducer();

  /// Starts a step: forgets the gradients seen so far. Call it before each backward pass
  /// that uses hook(); reduce() also calls it when it is done.
  void begin();
  /// For BackwardOptions::on_leaf_grad: called with a leaf and its final gradient of this
  /// pass, it packs the gradient and starts every bucket that is complete. Empty (no hook)
  /// without overlap or in a world of one process.
  std::function<void(const Tensor&, const Array&)> hook();
  /// Finishes the step: packs the gradients hook() has not seen, all-reduces (or waits for)
  /// every bucket and sets each parameter's gradient to the sum over the ranks. Nothing to
  /// do in a world of one process.
  void reduce();

  /// The number of buckets.
  std::size_t buckets() const;
  /// Gradient bytes all-reduced per step (the buckets' total).
  std::size_t bytes() const;
  /// Seconds spent inside reduce() (packing, all-reduce, waiting, unpacking) and in hook()
  /// during the last step.
  double last_seconds() const { return last_seconds_; }
  /// last_seconds() summed over every step so far.
  double total_seconds() const { return total_seconds_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  double last_seconds_ = 0, total_seconds_ = 0;
};

}  // namespace xg::dist
