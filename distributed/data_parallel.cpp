#include <xgrad/distributed/data_parallel.hpp>

#include <chrono>
#include <cstring>
#include <new>
#include <unordered_map>

#include <xgrad/core/detail/calibration.hpp>
#include <xgrad/core/error.hpp>

namespace xg::dist {

namespace {

using Clock = std::chrono::steady_clock;

std::size_t dtype_bytes(DType d) { return d == DType::float32 ? sizeof(float) : sizeof(double); }

}  // namespace

Shard shard_of(std::size_t global, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw ValueError(op_message("shard", "rank " + std::to_string(rank) + " of " + std::to_string(size)));
  const std::size_t n = static_cast<std::size_t>(size);
  if (global % n != 0)
    throw UsageError(op_message("shard", "a global batch of " + std::to_string(global) + " rows does not divide into " +
                                             std::to_string(size) + " equal shards"));
  const std::size_t rows = global / n;
  return {rows * static_cast<std::size_t>(rank), rows * static_cast<std::size_t>(rank + 1)};
}

int exit_code_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const UsageError&) {
    return 2;
  } catch (...) {
    return 1;
  }
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const CollectiveError& c) {
    return c.what();
  } catch (const std::bad_alloc&) {
    return "out of memory";
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

void together(Communicator& comm, const std::function<void()>& f) {
  std::exception_ptr failure;
  try {
    f();
  } catch (...) {
    failure = std::current_exception();
  }
  if (comm.size() == 1) {
    if (failure) std::rethrow_exception(failure);
    return;
  }
  // The lowest failing rank reports; everyone learns its exit status.
  const int n = comm.size();
  const double first = comm.all_reduce(failure ? static_cast<double>(comm.rank()) : static_cast<double>(n), ReduceOp::min);
  if (first >= n) return;
  const int reporter = static_cast<int>(first);
  std::int32_t code = failure ? exit_code_of(failure) : 1;
  comm.broadcast(&code, sizeof code, reporter);
  if (comm.rank() == reporter)
    throw CollectiveError(failure, code, true, message_of(failure));
  throw CollectiveError(nullptr, code, false, "rank " + std::to_string(reporter) + " failed");
}

void agree_on_kernel_choices(Communicator& comm, const std::function<void()>& choose) {
  if (comm.size() == 1) {
    choose();
    return;
  }
  std::string ratios;
  together(comm, [&] {
    if (comm.rank() != 0) return;
    choose();
    ratios = detail::calibrations_text();
  });
  comm.broadcast(ratios, 0);
  together(comm, [&] {
    if (comm.rank() == 0) return;
    detail::adopt_calibrations(ratios);
    choose();
  });
}

// ---------------------------------------------------------------------------------------------

namespace {

// Names, dtypes and shapes, to check that every rank has the same parameters.
std::string layout_of(const nn::NamedTensors& params) {
  std::string s;
  for (const auto& [name, p] : params) s += name + ":" + dtype_name(p.dtype()) + shape_str(p.shape()) + ";";
  return s;
}

}  // namespace

void broadcast_parameters(Communicator& comm, const nn::NamedTensors& params, int root) {
  if (comm.size() == 1) return;
  const std::string mine = layout_of(params);
  std::string roots = mine;
  comm.broadcast(roots, root);
  if (comm.all_reduce(roots == mine ? 0.0 : 1.0, ReduceOp::max) != 0.0)
    fail_together(comm, ValueError(op_message("broadcast_parameters", "the ranks' models differ (rank " +
                                                                         std::to_string(root) + ": " + roots + ")")));
  for (const auto& [name, p] : params) {
    Array v = p.value().clone();
    comm.broadcast(v.dtype() == DType::float32 ? static_cast<void*>(v.data<float>()) : static_cast<void*>(v.data<double>()),
                   v.size() * dtype_bytes(v.dtype()), root);
    if (comm.rank() != root) {
      Tensor t = p;
      t.set_value(v);
    }
  }
}

std::uint64_t parameter_checksum(const nn::NamedTensors& params) {
  // FNV-1a over 8-byte words, each word mixed first (so a one-bit change moves every bit).
  std::uint64_t h = 1469598103934665603ull;
  auto add = [&h](std::uint64_t w) {
    w ^= w >> 33;
    w *= 0xff51afd7ed558ccdull;
    w ^= w >> 33;
    h = (h ^ w) * 1099511628211ull;
  };
  for (const auto& [name, p] : params) {
    const Array& v = p.value();
    const std::size_t bytes = v.size() * dtype_bytes(v.dtype());
    const unsigned char* b = v.dtype() == DType::float32 ? reinterpret_cast<const unsigned char*>(v.data<float>())
                                                          : reinterpret_cast<const unsigned char*>(v.data<double>());
    add(bytes);
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, b + i, 8);
      add(w);
    }
    if (i < bytes) {
      std::uint64_t w = 0;
      std::memcpy(&w, b + i, bytes - i);
      add(w);
    }
  }
  return h;
}

void check_parameters_agree(Communicator& comm, const nn::NamedTensors& params, const std::string& when) {
  if (comm.size() == 1) return;
  const std::uint64_t mine = parameter_checksum(params);
  std::uint64_t root = mine;
  comm.broadcast(&root, sizeof root, 0);
  std::vector<double> differs(static_cast<std::size_t>(comm.size()), 0.0);
  differs[static_cast<std::size_t>(comm.rank())] = mine == root ? 0.0 : 1.0;
  comm.all_reduce(differs.data(), differs.size(), ReduceOp::max);
  std::string ranks;
  for (std::size_t r = 0; r < differs.size(); ++r)
    if (differs[r] != 0.0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!ranks.empty())
    fail_together(comm, ValueError(op_message("dist", "the parameters of rank(s) " + ranks + " differ from rank 0's " +
                                                          when + " (checksums differ): the ranks have diverged")));
}

// ---------------------------------------------------------------------------------------------

struct GradientReducer::Impl {
  struct Slot {
    Tensor param;
    std::size_t bucket = 0, offset = 0;  // offset in elements within the bucket
  };
  struct Bucket {
    DType dtype = DType::float32;
    std::size_t elements = 0;
    std::vector<std::uint64_t> storage;  // 8-byte aligned for either dtype
    std::vector<std::size_t> slots;
    std::size_t waiting = 0;  // overlap: gradients not yet in
    std::unique_ptr<Pending> pending;
    void* data() { return storage.data(); }
  };

  Communicator& comm;
  Options opts;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::unordered_map<const void*, std::size_t> slot_of;  // TensorImpl* -> slot
  std::vector<double> present;                            // per slot: 1 if this rank has its gradient
  std::vector<bool> copied;                               // overlap: gradient already packed
  std::size_t next_start = 0;                             // overlap: buckets are started in order
  double hook_seconds = 0;

  Impl(Communicator& c, nn::NamedTensors params, Options o) : comm(c), opts(o) {
    // Reverse registration order: backward finishes the last layers first.
    for (std::size_t k = params.size(); k-- > 0;) slots.push_back({params[k].second, 0, 0});
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const Tensor& p = slots[i].param;
      const std::size_t bytes = dtype_bytes(p.dtype());
      if (buckets.empty() || buckets.back().dtype != p.dtype() || buckets.back().elements * bytes >= opts.bucket_bytes) {
        buckets.emplace_back();
        buckets.back().dtype = p.dtype();
      }
      Bucket& b = buckets.back();
      slots[i].bucket = buckets.size() - 1;
      slots[i].offset = b.elements;
      b.elements += p.size();
      b.slots.push_back(i);
      slot_of[p.impl().get()] = i;
    }
    for (Bucket& b : buckets) b.storage.resize((b.elements * dtype_bytes(b.dtype) + 7) / 8);
    present.assign(slots.size(), 0.0);
    copied.assign(slots.size(), false);
  }

  void pack(std::size_t i, const Array* g) {
    const Slot& s = slots[i];
    Bucket& b = buckets[s.bucket];
    const std::size_t bytes = dtype_bytes(b.dtype);
    char* dst = static_cast<char*>(b.data()) + s.offset * bytes;
    const std::size_t n = s.param.size() * bytes;
    if (g && g->defined()) {
      if (g->dtype() != b.dtype || g->size() != s.param.size())
        throw InternalError(op_message("gradient_reducer", "a gradient does not match its parameter"));
      std::memcpy(dst, b.dtype == DType::float32 ? static_cast<const void*>(g->data<float>())
                                                 : static_cast<const void*>(g->data<double>()),
                  n);
      present[i] = 1.0;
    } else {
      std::memset(dst, 0, n);
      present[i] = 0.0;
    }
    copied[i] = true;
  }

  std::unique_ptr<Pending> start(Bucket& b) {
    return b.dtype == DType::float32
               ? comm.start_all_reduce(static_cast<float*>(b.data()), b.elements, ReduceOp::sum)
               : comm.start_all_reduce(static_cast<double*>(b.data()), b.elements, ReduceOp::sum);
  }

  // Starts, in bucket order, every bucket whose gradients are all in.
  void start_ready() {
    while (next_start < buckets.size() && buckets[next_start].waiting == 0) {
      buckets[next_start].pending = start(buckets[next_start]);
      ++next_start;
    }
  }

  void begin() {
    std::fill(present.begin(), present.end(), 0.0);
    std::fill(copied.begin(), copied.end(), false);
    for (Bucket& b : buckets) {
      b.waiting = b.slots.size();
      b.pending.reset();
    }
    next_start = 0;
    hook_seconds = 0;
  }

  void on_grad(const Tensor& leaf, const Array& g) {
    const auto t0 = Clock::now();
    auto it = slot_of.find(leaf.impl().get());
    if (it == slot_of.end() || copied[it->second]) return;  // not one of ours
    pack(it->second, &g);
    --buckets[slots[it->second].bucket].waiting;
    start_ready();
    for (std::size_t k = 0; k < next_start; ++k)  // let MPI move the started ones along
      if (buckets[k].pending) buckets[k].pending->test();
    hook_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  void reduce() {
    for (std::size_t i = 0; i < slots.size(); ++i)
      if (!copied[i]) {
        pack(i, &slots[i].param.grad());
        --buckets[slots[i].bucket].waiting;
      }
    if (opts.overlap) {
      start_ready();
      for (Bucket& b : buckets) b.pending->wait();
    } else {
      for (Bucket& b : buckets) {
        if (b.dtype == DType::float32)
          comm.all_reduce(static_cast<float*>(b.data()), b.elements, ReduceOp::sum);
        else
          comm.all_reduce(static_cast<double*>(b.data()), b.elements, ReduceOp::sum);
      }
    }
    comm.all_reduce(present.data(), present.size(), ReduceOp::max);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      Slot& s = slots[i];
      if (present[i] == 0.0) {
        s.param.zero_grad();
        continue;
      }
      const Bucket& b = buckets[s.bucket];
      Array g = Array::empty(s.param.shape(), b.dtype);
      const std::size_t bytes = dtype_bytes(b.dtype);
      std::memcpy(b.dtype == DType::float32 ? static_cast<void*>(g.data<float>()) : static_cast<void*>(g.data<double>()),
                  reinterpret_cast<const char*>(b.storage.data()) + s.offset * bytes, s.param.size() * bytes);
      s.param.set_grad(g);
    }
  }
};

GradientReducer::GradientReducer(Communicator& comm, nn::NamedTensors params, Options opts)
    : impl_(std::make_unique<Impl>(comm, std::move(params), opts)) {
  if (opts.bucket_bytes == 0) throw ValueError(op_message("gradient_reducer", "bucket_bytes must be > 0"));
  impl_->begin();
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::begin() { impl_->begin(); }

std::function<void(const Tensor&, const Array&)> GradientReducer::hook() {
  if (impl_->comm.size() == 1 || !impl_->opts.overlap) return nullptr;
  Impl* impl = impl_.get();
  return [impl](const Tensor& leaf, const Array& g) { impl->on_grad(leaf, g); };
}

void GradientReducer::reduce() {
  if (impl_->comm.size() == 1) return;  // one process: the gradients are already the sum
  const auto t0 = Clock::now();
  impl_->reduce();
  last_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count() + impl_->hook_seconds;
  total_seconds_ += last_seconds_;
  impl_->begin();
}

std::size_t GradientReducer::buckets() const { return impl_->buckets.size(); }

std::size_t GradientReducer::bytes() const {
  std::size_t n = 0;
  for (const auto& b : impl_->buckets) n += b.elements * dtype_bytes(b.dtype);
  return n;
}

}  // namespace xg::dist
