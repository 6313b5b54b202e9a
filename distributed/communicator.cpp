#include <xgrad/distributed/communicator.hpp>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include <xgrad/core/error.hpp>

namespace xg::dist {

#ifdef XGRAD_WITH_MPI
std::unique_ptr<Communicator> make_mpi();  // distributed/mpi_communicator.cpp
#endif

namespace {

class LocalPending : public Pending {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class LocalCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_size() const override { return 1; }
  std::string description() const override { return "local (1 process)"; }
  void all_reduce(float*, std::size_t, ReduceOp) override {}  // sum, mean, max, min of one value: itself
  void all_reduce(double*, std::size_t, ReduceOp) override {}
  std::unique_ptr<Pending> start_all_reduce(float*, std::size_t, ReduceOp) override {
    return std::make_unique<LocalPending>();
  }
  std::unique_ptr<Pending> start_all_reduce(double*, std::size_t, ReduceOp) override {
    return std::make_unique<LocalPending>();
  }
  void broadcast(void*, std::size_t, int root) override {
    if (root != 0) throw ValueError(op_message("broadcast", "root " + std::to_string(root) + " outside a world of 1"));
  }
  void barrier() override {}
  [[noreturn]] void abort(int exit_code) override { std::_Exit(exit_code); }
};

// An environment variable as an integer; -1 when absent or not a number.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || errno == ERANGE || n < 0 || n > (1L << 30)) return -1;
  return static_cast<int>(n);
}

}  // namespace

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

void Communicator::all_reduce(Array& a, ReduceOp op) {
  if (!a.defined()) throw ValueError(op_message("all_reduce", "the array is undefined"));
  if (a.dtype() == DType::float32)
    all_reduce(a.data<float>(), a.size(), op);
  else
    all_reduce(a.data<double>(), a.size(), op);
}

double Communicator::all_reduce(double value, ReduceOp op) {
  all_reduce(&value, 1, op);
  return value;
}

void Communicator::broadcast(Array& a, int root) {
  if (!a.defined()) throw ValueError(op_message("broadcast", "the array is undefined"));
  // Every rank checks that the shapes and dtypes agree before any data moves.
  std::string layout = std::string(dtype_name(a.dtype())) + " " + shape_str(a.shape());
  std::string root_layout = layout;
  broadcast(root_layout, root);
  const double differs = all_reduce(root_layout == layout ? 0.0 : 1.0, ReduceOp::max);
  if (differs != 0.0)
    throw ValueError(op_message("broadcast", "the array is " + layout + " on rank " + std::to_string(rank()) +
                                                 (root_layout == layout ? " (another rank differs)" : "") + ", " +
                                                 root_layout + " on the root rank " + std::to_string(root)));
  const std::size_t bytes = a.size() * (a.dtype() == DType::float32 ? sizeof(float) : sizeof(double));
  if (a.dtype() == DType::float32)
    broadcast(a.data<float>(), bytes, root);
  else
    broadcast(a.data<double>(), bytes, root);
}

void Communicator::broadcast(std::string& s, int root) {
  std::uint64_t n = s.size();
  broadcast(&n, sizeof n, root);
  s.resize(static_cast<std::size_t>(n));
  // In pieces of at most 1 GiB (MPI counts are int).
  const std::size_t piece = std::size_t(1) << 30;
  for (std::size_t at = 0; at < s.size(); at += piece) broadcast(&s[at], std::min(piece, s.size() - at), root);
}

std::unique_ptr<Communicator> make_local() { return std::make_unique<LocalCommunicator>(); }

bool built_with_mpi() {
#ifdef XGRAD_WITH_MPI
  return true;
#else
  return false;
#endif
}

LaunchInfo detect_launch() {
  LaunchInfo l;
  const char* force = std::getenv("XGRAD_MPI");
  const std::string forced = force ? force : "";
  if (!forced.empty() && forced != "0" && forced != "1")
    throw ValueError(op_message("XGRAD_MPI", "unknown value '" + forced + "' (0: one process, 1: MPI)"));
  struct Source {
    const char* rank;
    const char* size;
    const char* name;
  };
  const Source sources[] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI (OMPI_COMM_WORLD_*)"},
                            {"PMIX_RANK", nullptr, "PMIx (PMIX_RANK)"},
                            {"PMI_RANK", "PMI_SIZE", "PMI (PMI_RANK, PMI_SIZE)"},
                            {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "Slurm (SLURM_PROCID, SLURM_STEP_NUM_TASKS)"}};
  for (const Source& s : sources) {
    const int r = env_int(s.rank);
    if (r < 0) continue;
    l.rank = r;
    l.size = s.size ? env_int(s.size) : -1;
    l.launcher = s.name;
    // Slurm sets its variables for every task of a job step, MPI program or not: one task
    // alone is a plain process (a batch script running xgrad once).
    l.use_mpi = std::string(s.name).rfind("Slurm", 0) != 0 || l.size > 1;
    break;
  }
  if (forced == "0") {
    l = LaunchInfo{};
    l.launcher = "XGRAD_MPI=0";
  } else if (forced == "1") {
    l.use_mpi = true;
    if (l.launcher.empty()) l.launcher = "XGRAD_MPI=1";
  }
  return l;
}

std::unique_ptr<Communicator> launch() {
  const LaunchInfo l = detect_launch();
  if (!l.use_mpi) return make_local();
#ifdef XGRAD_WITH_MPI
  return make_mpi();
#else
  if (l.size == 1) return make_local();  // one rank: the local communicator is that world
  throw ValueError(op_message("dist", "started by " + l.launcher + " as rank " + std::to_string(l.rank) +
                                          (l.size > 0 ? " of " + std::to_string(l.size) : "") +
                                          ", but this xgrad was built without MPI (XGRAD_WITH_MPI=OFF: install "
                                          "libopenmpi-dev and reconfigure); each rank would train alone"));
#endif
}

}  // namespace xg::dist
