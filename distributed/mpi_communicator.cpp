// The MPI communicator (Open MPI; any MPI-3 library should do). Compiled only when the build
// has XGRAD_WITH_MPI; the only file of xgrad that includes <mpi.h>. Uses the C API (the C++
// bindings were removed from MPI-3).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <vector>

#include <xgrad/core/error.hpp>
#include <xgrad/distributed/communicator.hpp>

namespace xg::dist {

namespace {

// MPI counts are int: large buffers go in pieces.
constexpr std::size_t kMaxCount = std::size_t(1) << 30;

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw Error(op_message("mpi", std::string(call) + " failed: " + (len > 0 ? std::string(text, len) : "error " + std::to_string(rc))));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    default: return MPI_SUM;  // mean: the sum, then divided
  }
}

template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <> MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

template <class T> void divide(T* data, std::size_t n, int size) {
  const T s = static_cast<T>(size);
  for (std::size_t i = 0; i < n; ++i) data[i] /= s;
}

template <class T> class MpiPending : public Pending {
 public:
  MpiPending(MPI_Comm comm, T* data, std::size_t n, ReduceOp op, int size) : data_(data), n_(n), op_(op), size_(size) {
    for (std::size_t at = 0; at < n; at += kMaxCount) {
      requests_.push_back(MPI_REQUEST_NULL);
      check(MPI_Iallreduce(MPI_IN_PLACE, data + at, static_cast<int>(std::min(kMaxCount, n - at)), mpi_type<T>(),
                           mpi_op(op), comm, &requests_.back()),
            "MPI_Iallreduce");
    }
  }
  ~MpiPending() override {
    if (!done_) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }
  void wait() override {
    if (done_) return;
    check(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (flag) finish();
    return done_;
  }

 private:
  void finish() {
    done_ = true;
    if (op_ == ReduceOp::mean) divide(data_, n_, size_);
  }
  T* data_;
  std::size_t n_;
  ReduceOp op_;
  int size_;
  std::vector<MPI_Request> requests_;
  bool done_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator() {
    int finalized = 0, initialized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
      throw ValueError(op_message("dist", "MPI was already finalized in this process (one MPI communicator per process)"));
    MPI_Initialized(&initialized);
    if (!initialized) {
      // Only the thread that created the communicator calls MPI (xgrad's pool threads never do).
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      owns_mpi_ = true;
    }
    // A communicator of our own (no clash with other MPI users in the process) whose errors
    // come back as codes: they become xg::Error, reported by the rank that saw them.
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    MPI_Comm node;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    int local_rank = 0;
    check(MPI_Comm_size(node, &local_size_), "MPI_Comm_size");
    check(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank");
    MPI_Comm_free(&node);
    int leader = local_rank == 0 ? 1 : 0;
    check(MPI_Allreduce(MPI_IN_PLACE, &leader, 1, MPI_INT, MPI_SUM, comm_), "MPI_Allreduce");
    nodes_ = leader;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    library_ = std::string(version, static_cast<std::size_t>(std::max(0, len)));
    library_ = library_.substr(0, library_.find_first_of(",\n"));
  }

  ~MpiCommunicator() override {
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_size() const override { return local_size_; }
  std::string description() const override {
    return library_ + ", " + std::to_string(size_) + (size_ == 1 ? " rank" : " ranks") + " on " + std::to_string(nodes_) +
           (nodes_ == 1 ? " node" : " nodes");
  }

  void all_reduce(float* data, std::size_t n, ReduceOp op) override { reduce(data, n, op); }
  void all_reduce(double* data, std::size_t n, ReduceOp op) override { reduce(data, n, op); }
  std::unique_ptr<Pending> start_all_reduce(float* data, std::size_t n, ReduceOp op) override {
    return std::make_unique<MpiPending<float>>(comm_, data, n, op, size_);
  }
  std::unique_ptr<Pending> start_all_reduce(double* data, std::size_t n, ReduceOp op) override {
    return std::make_unique<MpiPending<double>>(comm_, data, n, op, size_);
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    if (root < 0 || root >= size_)
      throw ValueError(op_message("broadcast", "root " + std::to_string(root) + " outside [0, " + std::to_string(size_) + ")"));
    char* p = static_cast<char*>(data);
    for (std::size_t at = 0; at < bytes; at += kMaxCount)
      check(MPI_Bcast(p + at, static_cast<int>(std::min(kMaxCount, bytes - at)), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; in case it does
  }

 private:
  template <class T> void reduce(T* data, std::size_t n, ReduceOp op) {
    for (std::size_t at = 0; at < n; at += kMaxCount)
      check(MPI_Allreduce(MPI_IN_PLACE, data + at, static_cast<int>(std::min(kMaxCount, n - at)), mpi_type<T>(),
                          mpi_op(op), comm_),
            "MPI_Allreduce");
    if (op == ReduceOp::mean) divide(data, n, size_);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_size_ = 1, nodes_ = 1;
  bool owns_mpi_ = false;
  std::string library_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi() { return std::make_unique<MpiCommunicator>(); }

}  // namespace xg::dist
