// Attention forward + backward through nn::scaled_dot_product_attention (issue 8,
// "Benchmarks"): float32 Q [B, H, T, dh], K and V [B, H_kv, T, dh], loss sum(O * G) for a
// fixed random G. Reports the time, the peak RSS and the RSS growth over the inputs (peak
// minus the RSS right after the inputs were allocated), which the fused path's memory
// target is stated in.
#include <CLI/CLI.hpp>

#include "bench/common.hpp"
#include "bench/xgrad_pool.hpp"
#include <xgrad/core/detail/blas.hpp>
#include <xgrad/core/matmul_dtype.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/core/tape.hpp>
#include <xgrad/core/tensor.hpp>
#include <xgrad/nn/sdpa.hpp>
#include <xgrad/nn/visibility.hpp>
#include <xgrad/ops/elementwise.hpp>
#include <xgrad/ops/reduce.hpp>

using namespace xg;

namespace {

nn::Visibility visibility(const bench::AttentionFlags& f) {
  if (f.mask == "causal") return nn::Visibility::causal(f.seq, f.seq);
  if (f.mask == "padding") {
    const auto lengths = bench::padding_lengths(f.batch, f.seq);
    return nn::Visibility::key_lengths(std::vector<nn::Position>(lengths.begin(), lengths.end()),
                                       static_cast<nn::Position>(f.seq));
  }
  if (f.mask == "documents") return nn::Visibility::documents(IndexArray({f.seq}, bench::document_ids(f.seq, f.seed)));
  return nn::Visibility::all();
}

nn::SdpaImpl impl(const std::string& name) {
  if (name == "composed") return nn::SdpaImpl::composed;
  if (name == "fused") return nn::SdpaImpl::fused;
  return nn::SdpaImpl::automatic;
}

void run(const bench::AttentionFlags& f, const std::string& dtype) {
  bench::validate(f);
  set_num_threads(f.threads);
  bench::print_header("bench_attention", "xgrad", f);
  // --dtype bfloat16: float32 tensors, products with bfloat16 inputs (core/matmul_dtype.hpp)
  const MatmulDtypeScope matmul_dtype_scope(dtype == "bfloat16" ? MatmulDtype::bfloat16 : MatmulDtype::float32);
  bench::print_line("matmul dtype: " + matmul_dtype_name(effective_matmul_dtype()) +
                    (dtype == "bfloat16" && effective_matmul_dtype() != MatmulDtype::bfloat16
                         ? " (bfloat16 asked for: " + bfloat16_matmul_unavailable_reason() + ")"
                         : ""));

  Generator gen(f.seed);
  Tensor Q = randn({f.batch, f.heads, f.seq, f.dh}, gen, DType::float32, true);
  Tensor K = randn({f.batch, f.kv(), f.seq, f.dh}, gen, DType::float32, true);
  Tensor V = randn({f.batch, f.kv(), f.seq, f.dh}, gen, DType::float32, true);
  const Tensor G = randn({f.batch, f.heads, f.seq, f.dh}, gen, DType::float32);
  const double rss_inputs = bench::current_rss_mib();

  const nn::Visibility vis = visibility(f);
  nn::SdpaOptions opts;
  opts.impl = impl(f.impl);
  const auto fwd_bwd = [&] {
    Q.zero_grad();
    K.zero_grad();
    V.zero_grad();
    ops::sum(nn::attention(Q, K, V, vis, opts) * G).backward();
  };
  // The peak before the timed repetitions and again after them (bench/peak.hpp, peak_around).
  const bench::Peak peak_before = bench::measure_peak(f.threads, 0.05, bench::xgrad_pool(),
                                                      blas::sgemm_isa() == "avx2" ? "avx2" : "");
  const std::vector<double> ms = bench::time_reps(f.warmup, f.reps, fwd_bwd);
  // FLOPs (docs/performance.md): forward 4 B H T^2 d_h and backward 10 B H T^2 d_h over the
  // visible pairs; causal counts half the pairs: 7 B H T^2 d_h, no mask 14 B H T^2 d_h.
  if (f.mask == "causal" || f.mask == "none") {
    const double flop = (f.mask == "causal" ? 7.0 : 14.0) * double(f.batch) * double(f.heads) * double(f.seq) *
                        double(f.seq) * double(f.dh);
    bench::print_peak_share_around(peak_before, flop * 1e-9 / (bench::summarize(ms).median * 1e-3),
                                   bench::xgrad_pool());
  } else {
    bench::print_line("% of peak: FLOP formula only for --mask causal and none");
  }
  // The last repetition's O and gradients, bit for bit (to compare builds, thread counts and
  // ISAs: the fused path's bits depend on neither the thread count nor the ISA).
  const auto hash = [](const Array& a) {
    std::uint64_t h = bench::kFnvStart;
    bench::fnv(h, a.data<float>(), a.size() * sizeof(float));
    return std::to_string(h);
  };
  std::string O_hash;
  {
    NoGradGuard no_grad;
    O_hash = hash(nn::attention(Q, K, V, vis, opts).value());
  }
  bench::print_line("outputs: hash O " + O_hash + ", dQ " + hash(Q.grad()) + ", dK " + hash(K.grad()) + ", dV " +
                    hash(V.grad()) + " (FNV-1a of the float32 bits)");
  bench::report_attention(ms, rss_inputs);
}

}  // namespace

int main(int argc, char** argv) {
  bench::AttentionFlags f;
  std::string dtype = "float32";
  return bench::run_program(
      "bench_attention", "Scaled dot-product attention forward + backward, xgrad", argc, argv,
      [&](CLI::App& app) {
        bench::add_flags(app, f);
        app.add_option("--dtype", dtype,
                       "product inputs: float32, or bfloat16 (float32 tensors and sums; the fused path's tiles on "
                       "AMX where measured faster)")
            ->check(CLI::IsMember({"float32", "bfloat16"}))
            ->capture_default_str();
      },
      [&] { run(f, dtype); });
}
