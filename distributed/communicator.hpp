/// \file
/// The communicator: what data-parallel training needs from the processes it runs on, and
/// nothing more (docs/distributed.md). Rank and world size, all-reduce (sum, mean, max, min)
/// of float32/float64 buffers, blocking or started now and finished later, broadcast of bytes,
/// barrier, abort.
///
/// Two implementations: a world of one process (make_local, always there) and Open MPI
/// (distributed/mpi_communicator.cpp, compiled only when the build has XGRAD_WITH_MPI). Nothing else
/// in xgrad calls MPI; the engine (xgrad::xgrad) never depends on it. launch() picks the one
/// the process was started for: MPI under mpirun/srun, the local one otherwise.
///
/// Every rank must make the same calls in the same order with the same sizes (MPI's rule for
/// collectives). All-reduce results are the same on every rank, bit for bit, with Open MPI's
/// algorithms (the MPI standard recommends but does not require it; data-parallel training
/// checks it with parameter checksums, distributed/data_parallel.hpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <xgrad/core/array.hpp>

/// Distributed (data-parallel) training: the Communicator between the processes of a job and,
/// on top of it, batch sharding, gradient all-reduce, parameter broadcast and checksums, and
/// failures that every rank sees at once (docs/distributed.md).
namespace xg::dist {

/// How an all-reduce combines the ranks' values, element by element.
enum class ReduceOp { sum, mean, max, min };
/// \var ReduceOp::sum
/// The sum over the ranks.
/// \var ReduceOp::mean
/// The sum over the ranks divided by the world size (Communicator::size()).
/// \var ReduceOp::max
/// The largest value over the ranks.
/// \var ReduceOp::min
/// The smallest value over the ranks.

/// The operation's name for messages: "sum", "mean", "max" or "min".
const char* reduce_op_name(ReduceOp op);

/// An all-reduce started by Communicator::start_all_reduce. wait() blocks until the buffer
/// holds the result; test() reports whether it does (and lets MPI make progress). The buffer
/// must stay alive and untouched until then. The destructor waits.
class Pending {
 public:
  /// Waits for the all-reduce to finish if it has not, so the buffer is free afterwards (the
  /// result of a mean is only complete after wait() or a test() that returned true).
  virtual ~Pending() = default;
  /// Blocks until the buffer holds the result; an MPI failure throws xg::Error.
  virtual void wait() = 0;
  /// Whether the buffer holds the result now, without blocking (true from then on); each call
  /// lets MPI move the operation along.
  virtual bool test() = 0;
};

/// The processes of one job (the "world") and the collectives between them. Not copyable:
/// one object owns the connection (for MPI, from MPI_Init_thread to MPI_Finalize), and only
/// the thread that made it calls it. An MPI failure throws xg::Error naming the MPI call.
class Communicator {
 public:
  /// Ends this process's part of the world (the MPI communicator calls MPI_Finalize).
  virtual ~Communicator() = default;
  /// An implementation's base (make_local(), launch()).
  Communicator() = default;
  /// Not copyable: one object per process owns the connection.
  Communicator(const Communicator&) = delete;
  /// Not copyable: one object per process owns the connection.
  Communicator& operator=(const Communicator&) = delete;

  /// This process's rank, 0 .. size() - 1.
  virtual int rank() const = 0;
  /// The number of ranks in the world (1 for make_local()).
  virtual int size() const = 0;
  /// Ranks on this machine (shared memory), for the default thread count: cores / local_size.
  virtual int local_size() const = 0;
  /// "local (1 process)", "Open MPI v4.1.4, 2 ranks on 1 node".
  virtual std::string description() const = 0;

  /// In place, element-wise over all ranks; every rank gets the result. mean is the sum
  /// divided by size(). `data` holds `n` values on every rank.
  virtual void all_reduce(float* data, std::size_t n, ReduceOp op) = 0;
  /// The float64 form of all_reduce(float*, std::size_t, ReduceOp).
  virtual void all_reduce(double* data, std::size_t n, ReduceOp op) = 0;
  /// The same, started now (MPI_Iallreduce); overlaps with computation until the returned
  /// Pending's wait(). `data` must stay alive and untouched until then.
  virtual std::unique_ptr<Pending> start_all_reduce(float* data, std::size_t n, ReduceOp op) = 0;
  /// The float64 form of start_all_reduce(float*, std::size_t, ReduceOp).
  virtual std::unique_ptr<Pending> start_all_reduce(double* data, std::size_t n, ReduceOp op) = 0;
  /// root's `bytes` bytes at `data` to every rank (the others' buffers are overwritten).
  /// ValueError when root is not a rank of the world.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// Returns once every rank has called it.
  virtual void barrier() = 0;
  /// Ends every rank of the job with this exit status (MPI_Abort). For a failure on one rank,
  /// after it has reported the failure; the other ranks cannot be waited for.
  [[noreturn]] virtual void abort(int exit_code) = 0;

  // Conveniences built on the above.
  /// All-reduce of a float32/float64 array this rank owns, written in place (ValueError if
  /// `a` is undefined). Every rank passes an array of the same size and dtype.
  void all_reduce(Array& a, ReduceOp op);
  /// One value all-reduced over the ranks; returns the result (the same on every rank).
  double all_reduce(double value, ReduceOp op);
  /// root's values of `a` to every rank, in place. The shape and dtype must be the same on
  /// every rank: every rank checks that first and throws ValueError naming both layouts.
  void broadcast(Array& a, int root);
  /// root's string to every rank, any length; the other ranks' strings are replaced.
  void broadcast(std::string& s, int root);
};

/// A world of one process: all-reduce and broadcast leave the data as it is.
std::unique_ptr<Communicator> make_local();

/// Whether this build has the MPI communicator (CMake option XGRAD_WITH_MPI).
bool built_with_mpi();

/// How the environment says this process was started. An MPI launcher sets variables before
/// the program runs: Open MPI's mpirun OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_SIZE}; PMIx (srun
/// `--mpi`=pmix, mpirun) PMIX_RANK; PMI-2 (srun `--mpi`=pmi2, MPICH) PMI_RANK/PMI_SIZE; Slurm
/// SLURM_PROCID/SLURM_STEP_NUM_TASKS (a job step of several tasks started by srun; a batch
/// script itself is one process). XGRAD_MPI=0 ignores them all; XGRAD_MPI=1 uses MPI even
/// without them; another value of XGRAD_MPI is a ValueError naming it.
struct LaunchInfo {
  bool use_mpi = false;    ///< Started by an MPI launcher (or XGRAD_MPI=1).
  /// This process's rank and the world size from the environment (size -1 when the launcher
  /// does not say). @{
  int rank = 0, size = 1;
  /// @}
  std::string launcher;    ///< Which variables said so, for messages (e.g. "PMIx (PMIX_RANK)").
};
/// Reads the launcher's variables (above) from the environment; no MPI call.
LaunchInfo detect_launch();

/// The communicator this process was started for: MPI (MPI_Init_thread, once per process;
/// MPI_Finalize when the communicator is destroyed) when detect_launch() says so, the local
/// one otherwise. ValueError when the process was started as one rank of several but the
/// build has no MPI (the ranks would each train alone and overwrite each other's files).
std::unique_ptr<Communicator> launch();

}  // namespace xg::dist
