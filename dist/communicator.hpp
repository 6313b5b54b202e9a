// The communicator: what data-parallel training needs from the processes it runs on, and
// nothing more (docs/distributed.md). Rank and world size, all-reduce (sum, mean, max, min)
// of float32/float64 buffers, blocking or started now and finished later, broadcast of bytes,
// barrier, abort.
//
// Two implementations: a world of one process (make_local, always there) and Open MPI
// (dist/mpi_communicator.cpp, compiled only when the build has XGRAD_WITH_MPI). Nothing else
// in xgrad calls MPI; the engine (xgrad::xgrad) never depends on it. launch() picks the one
// the process was started for: MPI under mpirun/srun, the local one otherwise.
//
// Every rank must make the same calls in the same order with the same sizes (MPI's rule for
// collectives). All-reduce results are the same on every rank, bit for bit, with Open MPI's
// algorithms (the MPI standard recommends but does not require it; data-parallel training
// checks it with parameter checksums, dist/data_parallel.hpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include <xgrad/core/array.hpp>

namespace xg::dist {

enum class ReduceOp { sum, mean, max, min };
const char* reduce_op_name(ReduceOp op);

// An all-reduce started by Communicator::start_all_reduce. wait() blocks until the buffer
// holds the result; test() reports whether it does (and lets MPI make progress). The buffer
// must stay alive and untouched until then. The destructor waits.
class Pending {
 public:
  virtual ~Pending() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this machine (shared memory), for the default thread count: cores / local_size.
  virtual int local_size() const = 0;
  // "local (1 process)", "Open MPI v4.1.4, 2 ranks on 1 node".
  virtual std::string description() const = 0;

  // In place, element-wise over all ranks; every rank gets the result. mean is the sum
  // divided by size().
  virtual void all_reduce(float* data, std::size_t n, ReduceOp op) = 0;
  virtual void all_reduce(double* data, std::size_t n, ReduceOp op) = 0;
  // The same, started now (MPI_Iallreduce); overlaps with computation until wait().
  virtual std::unique_ptr<Pending> start_all_reduce(float* data, std::size_t n, ReduceOp op) = 0;
  virtual std::unique_ptr<Pending> start_all_reduce(double* data, std::size_t n, ReduceOp op) = 0;
  // root's bytes to every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with this exit status (MPI_Abort). For a failure on one rank,
  // after it has reported the failure; the other ranks cannot be waited for.
  [[noreturn]] virtual void abort(int exit_code) = 0;

  // Conveniences built on the above.
  void all_reduce(Array& a, ReduceOp op);  // a float32/float64 array this rank owns (written in place)
  double all_reduce(double value, ReduceOp op);
  void broadcast(Array& a, int root);        // same shape and dtype on every rank (ValueError otherwise)
  void broadcast(std::string& s, int root);  // any length; the other ranks' strings are replaced
};

// A world of one process: all-reduce and broadcast leave the data as it is.
std::unique_ptr<Communicator> make_local();

// Whether this build has the MPI communicator (CMake option XGRAD_WITH_MPI).
bool built_with_mpi();

// How the environment says this process was started. An MPI launcher sets variables before
// the program runs: Open MPI's mpirun OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_SIZE}; PMIx (srun
// --mpi=pmix, mpirun) PMIX_RANK; PMI-2 (srun --mpi=pmi2, MPICH) PMI_RANK/PMI_SIZE; Slurm
// SLURM_PROCID/SLURM_STEP_NUM_TASKS (a job step of several tasks started by srun; a batch
// script itself is one process). XGRAD_MPI=0 ignores them all; XGRAD_MPI=1 uses MPI even
// without them.
struct LaunchInfo {
  bool use_mpi = false;    // started by an MPI launcher (or XGRAD_MPI=1)
  int rank = 0, size = 1;  // from the environment (size -1 when the launcher does not say)
  std::string launcher;    // which variables said so, for messages
};
LaunchInfo detect_launch();

// The communicator this process was started for: MPI (MPI_Init_thread, once per process;
// MPI_Finalize when the communicator is destroyed) when detect_launch() says so, the local
// one otherwise. ValueError when the process was started as one rank of several but the
// build has no MPI (the ranks would each train alone and overwrite each other's files).
std::unique_ptr<Communicator> launch();

}  // namespace xg::dist
