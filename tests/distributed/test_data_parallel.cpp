// Data-parallel training, the parts that need no second process (docs/distributed.md): batch
// shards, the local communicator, launch detection, shard-invariant dropout, the sharded
// loss adding up to the whole batch's, the backward hook that starts all-reduces early, and
// parameter checksums. tests/distributed/ runs the same machinery over Open MPI.
#include <cstdlib>
#include <map>
#include <optional>

#include "tests/support/helpers.hpp"
#include <xgrad/distributed/communicator.hpp>
#include <xgrad/distributed/data_parallel.hpp>
#include <xgrad/nn/detail/flash_attention.hpp>
#include <xgrad/train/tasks.hpp>

using namespace xg;
using namespace xgt;

namespace {

// Sets environment variables for the scope and restores the previous values.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
      set(k, v);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) set(k, v);
  }

 private:
  static void set(const std::string& k, const std::optional<std::string>& v) {
    if (v)
      ::setenv(k.c_str(), v->c_str(), 1);
    else
      ::unsetenv(k.c_str());
  }
  std::map<std::string, std::optional<std::string>> saved_;
};

// Every launcher variable detect_launch reads, unset.
std::map<std::string, std::optional<std::string>> no_launcher() {
  std::map<std::string, std::optional<std::string>> m;
  for (const char* k : {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
                        "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "XGRAD_MPI"})
    m[k] = std::nullopt;
  return m;
}

IndexArray rows(const IndexArray& a, std::size_t begin, std::size_t end) {
  const std::size_t row = a.size() / a.shape[0];
  Shape s = a.shape;
  s[0] = end - begin;
  return IndexArray(s, std::vector<std::int64_t>(a.data.begin() + static_cast<long>(begin * row),
                                                 a.data.begin() + static_cast<long>(end * row)));
}

std::size_t counted(const IndexArray& t) {
  std::size_t n = 0;
  for (auto v : t.data) n += v != -100;
  return n;
}

// Gradients of every parameter, by name.
std::map<std::string, Array> grads_of(const nn::Module& m) {
  std::map<std::string, Array> g;
  for (const auto& [name, p] : m.named_parameters()) g[name] = p.grad().clone();
  return g;
}

}  // namespace

TEST_CASE("dist: shards are equal contiguous blocks / an indivisible batch is refused", "[dist]") {
  CHECK(dist::shard_of(8, 0, 1).begin == 0);
  CHECK(dist::shard_of(8, 0, 1).end == 8);
  CHECK(dist::shard_of(8, 1, 2).begin == 4);
  CHECK(dist::shard_of(8, 1, 2).end == 8);
  CHECK(dist::shard_of(12, 2, 3).begin == 8);
  CHECK(dist::shard_of(12, 2, 3).rows() == 4);
  CHECK_THROWS_AS(dist::shard_of(7, 0, 2), UsageError);
  CHECK_THROWS_WITH(dist::shard_of(7, 0, 2), Catch::Contains("7") && Catch::Contains("2 equal shards"));
  CHECK_THROWS_AS(dist::shard_of(8, 2, 2), ValueError);
  CHECK_THROWS_AS(dist::shard_of(8, 0, 0), ValueError);
}

TEST_CASE("dist: the local communicator is a world of one", "[dist]") {
  auto comm = dist::make_local();
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(comm->local_size() == 1);
  std::vector<double> d{1.5, -2.0};
  std::vector<float> f{3.0f};
  for (auto op : {dist::ReduceOp::sum, dist::ReduceOp::mean, dist::ReduceOp::max, dist::ReduceOp::min}) {
    comm->all_reduce(d.data(), d.size(), op);
    comm->all_reduce(f.data(), f.size(), op);
  }
  CHECK(d == std::vector<double>{1.5, -2.0});
  CHECK(f == std::vector<float>{3.0f});
  auto pending = comm->start_all_reduce(d.data(), d.size(), dist::ReduceOp::sum);
  CHECK(pending->test());
  pending->wait();
  std::string s = "abc";
  comm->broadcast(s, 0);
  CHECK(s == "abc");
  Array a = Array::of({1.0, 2.0});
  comm->broadcast(a, 0);
  CHECK(a.to_vector() == std::vector<double>{1.0, 2.0});
  CHECK_THROWS_WITH(comm->broadcast(s, 1), Catch::Contains("[broadcast] root 1"));
  Array undefined;
  CHECK_THROWS_AS(comm->all_reduce(undefined, dist::ReduceOp::sum), ValueError);
  comm->barrier();
}

TEST_CASE("dist: launch detection reads the launchers' variables", "[dist]") {
  {
    ScopedEnv env(no_launcher());
    const auto l = dist::detect_launch();
    CHECK_FALSE(l.use_mpi);
    CHECK(l.rank == 0);
    CHECK(dist::launch()->size() == 1);  // a plain process: the local communicator
  }
  {
    auto vars = no_launcher();
    vars["OMPI_COMM_WORLD_RANK"] = "1";
    vars["OMPI_COMM_WORLD_SIZE"] = "4";
    ScopedEnv env(vars);
    const auto l = dist::detect_launch();
    CHECK(l.use_mpi);
    CHECK(l.rank == 1);
    CHECK(l.size == 4);
    CHECK(l.launcher.find("Open MPI") != std::string::npos);
  }
  {
    auto vars = no_launcher();
    vars["SLURM_PROCID"] = "0";
    vars["SLURM_STEP_NUM_TASKS"] = "1";
    ScopedEnv env(vars);
    CHECK_FALSE(dist::detect_launch().use_mpi);  // one Slurm task alone is a plain process
  }
  {
    auto vars = no_launcher();
    vars["SLURM_PROCID"] = "0";
    ::setenv("SLURM_NTASKS", "8", 1);  // a batch script of an 8-task job: still one process
    ScopedEnv env(vars);
    CHECK_FALSE(dist::detect_launch().use_mpi);
    ::unsetenv("SLURM_NTASKS");
  }
  {
    auto vars = no_launcher();
    vars["SLURM_PROCID"] = "3";
    vars["SLURM_STEP_NUM_TASKS"] = "8";
    ScopedEnv env(vars);
    CHECK(dist::detect_launch().use_mpi);
    CHECK(dist::detect_launch().rank == 3);
  }
  {
    auto vars = no_launcher();
    vars["PMI_RANK"] = "2";
    vars["PMI_SIZE"] = "3";
    vars["XGRAD_MPI"] = "0";
    ScopedEnv env(vars);
    CHECK_FALSE(dist::detect_launch().use_mpi);  // XGRAD_MPI=0 wins
    CHECK(dist::detect_launch().rank == 0);
  }
  for (const char* bad : {"yes", "2", "true"}) {  // neither 0 nor 1: refused, naming the variable and the value
    auto vars = no_launcher();
    vars["XGRAD_MPI"] = bad;
    ScopedEnv env(vars);
    CHECK_THROWS_WITH(dist::detect_launch(), Catch::Contains("[XGRAD_MPI] unknown value '" + std::string(bad) +
                                                             "' (0: one process, 1: MPI)"));
  }
  {
    auto vars = no_launcher();
    vars["PMIX_RANK"] = "not a number";
    ScopedEnv env(vars);
    CHECK_FALSE(dist::detect_launch().use_mpi);
  }
  if (!dist::built_with_mpi()) {
    auto vars = no_launcher();
    vars["OMPI_COMM_WORLD_RANK"] = "0";
    vars["OMPI_COMM_WORLD_SIZE"] = "2";
    ScopedEnv env(vars);
    CHECK_THROWS_WITH(dist::launch(), Catch::Contains("built without MPI") && Catch::Contains("rank 0 of 2"));
  }
}

TEST_CASE("dist: together and fail_together in one process rethrow the original error", "[dist]") {
  auto comm = dist::make_local();
  CHECK_THROWS_AS(dist::together(*comm, [] { throw UsageError("[x] bad flag"); }), UsageError);
  CHECK_NOTHROW(dist::together(*comm, [] {}));
  CHECK_THROWS_AS(dist::fail_together(*comm, FormatError("[x] bad file")), FormatError);
  CHECK(dist::exit_code_of(std::make_exception_ptr(UsageError("u"))) == 2);
  CHECK(dist::exit_code_of(std::make_exception_ptr(FormatError("f"))) == 1);
  CHECK(dist::message_of(std::make_exception_ptr(FormatError("[f] message"))) == "[f] message");
}

TEST_CASE("dist: a dropout mask drawn for a shard is the shard's rows of the whole batch's", "[dist][dropout]") {
  Generator g(41);
  const Generator start = g;
  const Array whole = ops::dropout_mask({6, 3, 5}, 0.4, g, DType::float64);
  for (std::size_t begin : {0, 2, 4}) {
    Generator shard_gen = start;
    ops::DropoutRowOffset offset(begin);
    CHECK(ops::dropout_row_offset() == begin);
    const Array part = ops::dropout_mask({2, 3, 5}, 0.4, shard_gen, DType::float64);
    for (std::size_t i = 0; i < part.size(); ++i) CHECK(part.flat(i) == whole.flat(begin * 15 + i));
    CHECK(shard_gen.next_u64() == Generator(g).next_u64());  // the same draws: generators stay in step
  }
  CHECK(ops::dropout_row_offset() == 0);  // restored
  // Element by element, the mask is the documented hash.
  Generator again = start;
  const std::uint64_t seed = again.next_u64();
  for (std::size_t i = 0; i < whole.size(); ++i) CHECK((whole.flat(i) != 0.0) == ops::dropout_keep(seed, i, 0.4));
  // Attention-weight dropout: the same for both attention paths.
  const Array a_whole = nn::attention_dropout_mask({4, 2, 3, 3}, 0.3, 99, DType::float64);
  const Array a_part = nn::attention_dropout_mask({2, 2, 3, 3}, 0.3, 99, DType::float64, 2);
  for (std::size_t i = 0; i < a_part.size(); ++i) CHECK(a_part.flat(i) == a_whole.flat(2 * 18 + i));
}

TEST_CASE("dist: attention dropout in a shard matches the whole batch on the fused and composed paths", "[dist][dropout][attention]") {
  Generator g(43);
  const Array Q = rnd({4, 2, 5, 4}, g), K = rnd({4, 2, 5, 4}, g), V = rnd({4, 2, 5, 4}, g);
  for (nn::SdpaImpl impl : {nn::SdpaImpl::fused, nn::SdpaImpl::composed}) {
    nn::SdpaOptions o;
    o.dropout_p = 0.3;
    o.training = true;
    o.impl = impl;
    Generator d_whole(7);
    o.generator = &d_whole;
    const Array whole =
        nn::scaled_dot_product_attention(Tensor(Q), Tensor(K), Tensor(V), nn::Visibility::causal(5, 5), o).output.value();
    auto slice = [](const Array& a, std::size_t b0) {
      std::vector<double> v = a.to_vector();
      const std::size_t row = a.size() / a.shape()[0];
      return Array::from_vector({2, 2, 5, 4}, std::vector<double>(v.begin() + static_cast<long>(b0 * row),
                                                                   v.begin() + static_cast<long>((b0 + 2) * row)),
                                DType::float64);
    };
    Generator d_shard(7);
    o.generator = &d_shard;
    ops::DropoutRowOffset offset(2);
    const Array part = nn::scaled_dot_product_attention(Tensor(slice(Q, 2)), Tensor(slice(K, 2)), Tensor(slice(V, 2)),
                                                        nn::Visibility::causal(5, 5), o)
                           .output.value();
    require_close(part, slice(whole, 2), 1e-14);
  }
}

TEST_CASE("dist: weighted shard losses add up to the whole batch's loss and gradient (float64 with dropout)",
          "[dist][training]") {
  // GPT with ignored targets spread unevenly over the rows, so shard means differ from the
  // global mean unless weighted by target counts.
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 6;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = 1;
  c.dropout = 0.2;
  c.dtype = DType::float64;
  Generator init(3);
  nn::GPT gpt(c, init);
  Generator data(5);
  std::vector<std::int64_t> tok(4 * 6), tgt(4 * 6);
  for (auto& t : tok) t = static_cast<std::int64_t>(data.below(11));
  for (std::size_t i = 0; i < tgt.size(); ++i) tgt[i] = i % 6 < 1 + i / 6 ? -100 : static_cast<std::int64_t>(data.below(11));
  const IndexArray tokens({4, 6}, tok), targets({4, 6}, tgt);

  Generator d_whole(9);
  Tensor whole = gpt.loss(tokens, targets, -100, &d_whole);
  whole.backward();
  const auto g_whole = grads_of(gpt);
  gpt.zero_grad();

  double sum = 0;
  for (std::size_t b0 : {0, 2}) {
    Generator d_shard(9);  // every rank's dropout generator is in the same state
    ops::DropoutRowOffset offset(b0);
    const IndexArray t_rows = rows(targets, b0, b0 + 2);
    const double w = static_cast<double>(counted(t_rows)) / static_cast<double>(counted(targets));
    CHECK(w != 0.5);  // the weighting matters here
    Tensor part = gpt.loss(rows(tokens, b0, b0 + 2), t_rows, -100, &d_shard);
    sum += part.item() * w;
    part.backward(Array::full(part.shape(), w, DType::float64));  // the gradients accumulate: the all-reduce's sum
  }
  CHECK(sum == Approx(whole.item()).margin(1e-13));
  for (const auto& [name, g] : grads_of(gpt)) {
    INFO(name);
    require_close(g, g_whole.at(name), 1e-13);
  }
}

TEST_CASE("dist: the encoder-decoder's sharded loss adds up too (variable lengths and dropout)", "[dist][training]") {
  nn::TransformerConfig c;
  c.V_vocab = 13;
  c.context = 7;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = 1;
  c.dropout = 0.2;
  c.dtype = DType::float64;
  Generator init(4);
  nn::EncoderDecoder model(c, init);
  train::ReverseTask task(2, 6);
  Generator data(6);
  const train::Seq2SeqBatch b = task.batch(4, data);
  Generator d_whole(11);
  Tensor whole = model.loss(b.src, b.src_lengths, b.tgt_in, b.tgt_out, -100, &d_whole);
  whole.backward();
  const auto g_whole = grads_of(model);
  model.zero_grad();
  double sum = 0;
  for (std::size_t b0 : {0, 2}) {
    Generator d_shard(11);
    ops::DropoutRowOffset offset(b0);
    const IndexArray out_rows = rows(b.tgt_out, b0, b0 + 2);
    const double w = static_cast<double>(counted(out_rows)) / static_cast<double>(counted(b.tgt_out));
    const std::vector<std::size_t> lengths(b.src_lengths.begin() + static_cast<long>(b0),
                                           b.src_lengths.begin() + static_cast<long>(b0 + 2));
    Tensor part = model.loss(rows(b.src, b0, b0 + 2), lengths, rows(b.tgt_in, b0, b0 + 2), out_rows, -100, &d_shard);
    sum += part.item() * w;
    part.backward(Array::full(part.shape(), w, DType::float64));
  }
  CHECK(sum == Approx(whole.item()).margin(1e-13));
  for (const auto& [name, g] : grads_of(model)) {
    INFO(name);
    require_close(g, g_whole.at(name), 1e-13);
  }
}

TEST_CASE("tape: on_leaf_grad sees each leaf's complete gradient once (latest-used leaves first)", "[tape][dist]") {
  Tensor a(Array::of({1.0, 2.0}), true), b(Array::of({3.0, -1.0}), true), unused(Array::of({5.0}), true);
  // a is used first (and again later), b only at the end: b's gradient is complete first.
  Tensor h = a * a;
  Tensor y = ops::sum(h * b + a);
  std::vector<std::pair<const void*, Array>> calls;
  BackwardOptions opts;
  opts.on_leaf_grad = [&](const Tensor& leaf, const Array& g) { calls.emplace_back(leaf.impl().get(), g.clone()); };
  backward(y, Array(), opts);
  REQUIRE(calls.size() == 2);  // `unused` is never reached
  CHECK(calls[0].first == b.impl().get());
  CHECK(calls[1].first == a.impl().get());
  require_close(calls[0].second, b.grad(), 0);
  require_close(calls[1].second, a.grad(), 0);
  CHECK(a.grad().to_vector() == std::vector<double>{2 * 1 * 3 + 1, 2 * 2 * -1 + 1});
  // grad() never calls it.
  calls.clear();
  Tensor z = ops::sum(a * b);
  (void)grad(z, {a}, Array(), opts);
  CHECK(calls.empty());
}

TEST_CASE("dist: gradient buckets/checksums/parameter broadcast in one process", "[dist]") {
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 6;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = 2;
  c.dtype = DType::float32;  // the buckets below are sized in float32 bytes
  Generator init(3);
  nn::GPT gpt(c, init);
  const auto params = gpt.named_parameters();
  auto comm = dist::make_local();
  dist::GradientReducer::Options o;
  o.bucket_bytes = 1024;
  dist::GradientReducer small(*comm, params, o);
  dist::GradientReducer one(*comm, params);
  CHECK(one.buckets() == 1);
  CHECK(small.buckets() > 3);
  CHECK(small.bytes() == gpt.parameter_count() * sizeof(float));
  CHECK(one.bytes() == small.bytes());
  // One process: reduce() leaves the gradients as they are.
  IndexArray tokens({2, 6}, std::vector<std::int64_t>(12, 3)), targets({2, 6}, std::vector<std::int64_t>(12, 4));
  gpt.loss(tokens, targets).backward();
  const auto before = grads_of(gpt);
  small.reduce();
  for (const auto& [name, g] : grads_of(gpt)) require_close(g, before.at(name), 0);
  CHECK_THROWS_AS(dist::GradientReducer(*comm, params, dist::GradientReducer::Options{0, false}), ValueError);

  const std::uint64_t sum = dist::parameter_checksum(params);
  CHECK(sum == dist::parameter_checksum(gpt.named_parameters()));
  Tensor p = params[3].second;
  Array v = p.value().clone();
  v.set_flat(0, v.flat(0) + 1e-6);
  p.set_value(v);
  CHECK(sum != dist::parameter_checksum(params));
  CHECK_NOTHROW(dist::check_parameters_agree(*comm, params, "now"));
  CHECK_NOTHROW(dist::broadcast_parameters(*comm, params, 0));
}
