#include "bench/common.hpp"
#include "bench/openblas.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <new>
#include <random>
#include <sstream>

namespace bench {

namespace {

// A whole decimal number >= min (sizes and counts; warmups and seeds may be 0). CLI11's
// PositiveNumber would also take 1.5 and print its range as a 300-digit number.
CLI::Validator whole_number(unsigned long long min) {
  return CLI::Validator(
      [min](std::string& v) -> std::string {
        const bool digits = !v.empty() && v.size() <= 19 &&
                            std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits || std::stoull(v) < min)
          return "must be a whole number >= " + std::to_string(min) + ", got '" + v + "'";
        return {};
      },
      "");
}
template <class T>
void size_flag(CLI::App& app, const std::string& name, T& v, const std::string& help) {
  app.add_option(name, v, help)->check(whole_number(1))->type_name("N>=1")->capture_default_str();
}
template <class T>
void count_flag(CLI::App& app, const std::string& name, T& v, const std::string& help) {
  app.add_option(name, v, help)->check(whole_number(0))->type_name("N>=0")->capture_default_str();
}
void kv_heads_flag(CLI::App& app, std::optional<std::size_t>& kv) {
  app.add_option_function<std::size_t>(
         "--kv-heads", [&kv](const std::size_t& v) { kv = v; },
         "key/value heads; < heads is GQA, must divide heads (default: --heads)")
      ->check(whole_number(1))
      ->type_name("N>=1");
}

std::string str(std::size_t v) { return std::to_string(v); }

}  // namespace

void add_flags(CLI::App& app, TrainFlags& f) {
  size_flag(app, "--vocab", f.vocab, "vocabulary size");
  size_flag(app, "--d", f.d, "model width");
  size_flag(app, "--heads", f.heads, "query heads");
  kv_heads_flag(app, f.kv_heads);
  size_flag(app, "--layers", f.layers, "transformer blocks");
  size_flag(app, "--seq", f.seq, "sequence length T");
  size_flag(app, "--batch", f.batch, "sequences per step");
  size_flag(app, "--steps", f.steps, "timed training steps");
  count_flag(app, "--warmup", f.warmup, "untimed steps first");
  size_flag(app, "--threads", f.threads, "worker threads");
  count_flag(app, "--seed", f.seed, "random seed (weights, tokens, targets)");
  app.add_flag("--no-memory-cache", f.no_memory_cache,
               "xgrad only: turn the caching allocator off (set_memory_cache_limit(0)), to measure it");
}

void add_flags(CLI::App& app, AttentionFlags& f) {
  size_flag(app, "--batch", f.batch, "batch B");
  size_flag(app, "--heads", f.heads, "query heads H");
  kv_heads_flag(app, f.kv_heads);
  size_flag(app, "--seq", f.seq, "sequence length T (queries = keys)");
  size_flag(app, "--dh", f.dh, "head width d_h");
  size_flag(app, "--reps", f.reps, "timed repetitions");
  count_flag(app, "--warmup", f.warmup, "untimed repetitions first");
  size_flag(app, "--threads", f.threads, "worker threads");
  count_flag(app, "--seed", f.seed, "random seed (inputs, documents)");
  app.add_option("--impl", f.impl, "attention implementation")
      ->check(CLI::IsMember({"auto", "composed", "fused"}))
      ->capture_default_str();
  app.add_option("--mask", f.mask, "visibility: causal, none, padding (key lengths) or documents")
      ->check(CLI::IsMember({"causal", "none", "padding", "documents"}))
      ->capture_default_str();
}

void add_flags(CLI::App& app, OpOverheadFlags& f) {
  size_flag(app, "--k", f.k, "ops in the chain");
  size_flag(app, "--reps", f.reps, "timed repetitions");
  count_flag(app, "--warmup", f.warmup, "untimed repetitions first");
}

void add_flags(CLI::App& app, MatmulFlags& f) {
  size_flag(app, "--n", f.n, "matrix size n (n x n times n x n)");
  size_flag(app, "--reps", f.reps, "timed repetitions");
  count_flag(app, "--warmup", f.warmup, "untimed repetitions first");
  size_flag(app, "--threads", f.threads, "worker threads");
}

void add_flags(CLI::App& app, GenerateFlags& f) {
  app.add_option("--shape", f.shape,
                 "model shape: stories15M (d 288, 6 layers, 6 heads, T 256, hidden 768) or stories42M (d 512, 8 "
                 "layers, 8 heads, T 1024, hidden 1376); vocab 32000, tied; the flags below override it")
      ->check(CLI::IsMember({"stories15M", "stories42M"}))
      ->capture_default_str();
  const auto opt = [&app](const std::string& name, std::optional<std::size_t>& v, const std::string& help) {
    app.add_option_function<std::size_t>(name, [&v](const std::size_t& x) { v = x; }, help + " (default: the shape's)")
        ->check(whole_number(1))
        ->type_name("N>=1");
  };
  opt("--vocab", f.vocab, "vocabulary size");
  opt("--d", f.d, "model width");
  opt("--heads", f.heads, "query heads");
  opt("--kv-heads", f.kv_heads, "key/value heads; must divide --heads");
  opt("--layers", f.layers, "blocks");
  opt("--seq", f.seq, "context length (KV cache capacity)");
  opt("--hidden", f.hidden, "feed-forward width");
  size_flag(app, "--prompt", f.prompt, "prefill: prompt tokens processed in one call");
  size_flag(app, "--new", f.new_tokens, "decode: tokens generated one at a time after a 1-token prompt");
  size_flag(app, "--reps", f.reps, "timed repetitions");
  count_flag(app, "--warmup", f.warmup, "untimed repetitions first");
  size_flag(app, "--threads", f.threads, "worker threads");
  count_flag(app, "--seed", f.seed, "random seed (weights, prompt)");
  app.add_flag("--untied", f.untied, "a separate classifier instead of the tied token embedding");
  app.add_flag("--no-pack", f.no_pack,
               "leave every parameter in its own block (default: Module::pack_parameters, one block on huge pages)");
}

GenerateFlags::Sizes GenerateFlags::resolve() const {
  const bool s42 = shape == "stories42M";
  Sizes s{vocab.value_or(32000),          d.value_or(s42 ? 512 : 288), heads.value_or(s42 ? 8 : 6), 0,
          layers.value_or(s42 ? 8 : 6), seq.value_or(s42 ? 1024 : 256), hidden.value_or(s42 ? 1376 : 768)};
  s.kv_heads = kv_heads.value_or(s.heads);
  if (s.d % s.heads != 0) throw UsageError("--heads (" + str(s.heads) + ") must divide --d (" + str(s.d) + ")");
  if (s.heads % s.kv_heads != 0)
    throw UsageError("--kv-heads (" + str(s.kv_heads) + ") must divide --heads (" + str(s.heads) + ")");
  if ((s.d / s.heads) % 2 != 0)
    throw UsageError("the head width --d / --heads (" + str(s.d / s.heads) + ") must be even (RoPE rotates pairs)");
  if (prompt > s.seq) throw UsageError("--prompt (" + str(prompt) + ") must be at most --seq (" + str(s.seq) + ")");
  if (new_tokens + 1 > s.seq)
    throw UsageError("--new (" + str(new_tokens) + ") plus the 1-token prompt must fit in --seq (" + str(s.seq) + ")");
  return s;
}

void validate(const TrainFlags& f) {
  if (f.d % f.heads != 0) throw UsageError("--heads (" + str(f.heads) + ") must divide --d (" + str(f.d) + ")");
  if (f.heads % f.kv() != 0)
    throw UsageError("--kv-heads (" + str(f.kv()) + ") must divide --heads (" + str(f.heads) + ")");
}

void validate(const AttentionFlags& f) {
  if (f.heads % f.kv() != 0)
    throw UsageError("--kv-heads (" + str(f.kv()) + ") must divide --heads (" + str(f.heads) + ")");
}

int run_program(const std::string& program, const std::string& description, int argc, char** argv,
                const std::function<void(CLI::App&)>& add, const std::function<void()>& body) {
  CLI::App app{description, program};
  add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << program << ": error: " << e.what() << " (see --help)\n";
    return e.get_exit_code() != 0 ? e.get_exit_code() : 1;
  }
  try {
    body();
  } catch (const std::bad_alloc&) {
    std::cout.flush();
    std::cerr << program << ": error: out of memory (std::bad_alloc)\n";
    return 1;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::cout.flush();
    std::cerr << program << ": error: " << msg << "\n";
    return 1;
  }
  return 0;
}

std::vector<std::size_t> padding_lengths(std::size_t B, std::size_t T) {
  std::vector<std::size_t> lengths(B);
  for (std::size_t b = 0; b < B; ++b) lengths[b] = std::max<std::size_t>(1, T * (b % 2 == 0 ? 3 : 2) / 4);
  return lengths;
}

std::vector<std::int64_t> document_ids(std::size_t T, std::uint64_t seed) {
  // Cut [0, T) at up to 3 distinct random positions in [1, T): mt19937_64 is fully
  // specified, and the modulo keeps the draw the same on every platform.
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> cuts;
  const std::size_t wanted = std::min<std::size_t>(3, T > 0 ? T - 1 : 0);
  while (cuts.size() < wanted) {
    const std::size_t c = 1 + static_cast<std::size_t>(rng() % (T - 1));
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::vector<std::int64_t> ids(T, 0);
  for (std::size_t i = 0; i < T; ++i)
    ids[i] = static_cast<std::int64_t>(std::count_if(cuts.begin(), cuts.end(), [i](std::size_t c) { return c <= i; }));
  return ids;
}

std::vector<double> time_reps(std::size_t warmup, std::size_t reps, const std::function<void()>& fn) {
  for (std::size_t i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  ms.reserve(reps);
  for (std::size_t i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const auto t1 = std::chrono::steady_clock::now();
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return ms;
}

Summary summarize(std::vector<double> s) {
  if (s.empty()) throw std::logic_error("summarize: no samples");
  std::sort(s.begin(), s.end());
  const std::size_t n = s.size();
  const double median = n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  return {s.front(), median, s.back()};
}

std::vector<double> scaled(const std::vector<double>& samples, double s) {
  std::vector<double> out(samples);
  for (double& v : out) v *= s;
  return out;
}

double peak_rss_mib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux: KiB
}

double current_rss_mib() {
  std::ifstream statm("/proc/self/statm");
  std::size_t pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) throw std::runtime_error("cannot read /proc/self/statm");
  return static_cast<double>(pages_resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

void fnv(std::uint64_t& h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
}

void print_line(const std::string& text) { std::cout << text << "\n" << std::flush; }

void print_summary(const std::string& what, const std::vector<double>& samples, const std::string& unit) {
  const Summary s = summarize(samples);
  print_line(what + ": min " + fmt(s.min) + ", median " + fmt(s.median) + ", max " + fmt(s.max) + " " + unit + " (" +
             std::to_string(samples.size()) + " reps)");
}

void print_peak_rss() { print_line("peak RSS: " + fmt(peak_rss_mib(), 1) + " MiB"); }

void print_result(const std::string& name, double value, const std::string& unit) {
  print_line("RESULT " + name + " " + fmt(value, 4) + " " + unit);
}

std::string fmt(double v, int digits) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(digits);
  o << v;
  return o.str();
}

namespace {
std::vector<std::function<std::vector<std::string>()>>& header_line_sources() {
  static std::vector<std::function<std::vector<std::string>()>> sources;
  return sources;
}
}  // namespace

void add_header_lines(const std::function<std::vector<std::string>()>& lines) {
  header_line_sources().push_back(lines);
}

void print_library_lines() {
  print_line("OpenBLAS core: " + openblas_core() + " (" + openblas_config() + ")");
  for (const auto& source : header_line_sources())
    for (const std::string& line : source()) print_line(line);
}

void print_header(const std::string& program, const std::string& library, const TrainFlags& f) {
  print_line(program + " (" + library + "): vocab " + str(f.vocab) + ", d " + str(f.d) + ", heads " + str(f.heads) +
             " (kv " + str(f.kv()) + "), layers " + str(f.layers) + ", T " + str(f.seq) + ", batch " + str(f.batch) +
             ", threads " + std::to_string(f.threads) + ", seed " + std::to_string(f.seed) + ", float32");
  print_library_lines();
}

void print_header(const std::string& program, const std::string& library, const AttentionFlags& f) {
  print_line(program + " (" + library + "): B " + str(f.batch) + ", H " + str(f.heads) + " (kv " + str(f.kv()) +
             "), T " + str(f.seq) + ", dh " + str(f.dh) + ", mask " + f.mask + ", impl " + f.impl + ", threads " +
             std::to_string(f.threads) + ", seed " + std::to_string(f.seed) + ", float32");
  print_library_lines();
}

void print_header(const std::string& program, const std::string& library, const OpOverheadFlags& f) {
  print_line(program + " (" + library + "): k " + str(f.k) +
             " ops on a 1-element float32 tensor, x * c and x + c alternating, forward + backward");
  print_library_lines();
}

void print_header(const std::string& program, const std::string& library, const MatmulFlags& f) {
  print_line(program + " (" + library + "): n " + str(f.n) + ", " + f.dtype + ", threads " + std::to_string(f.threads));
  print_library_lines();
}

void print_header(const std::string& program, const std::string& library, const GenerateFlags& f) {
  const GenerateFlags::Sizes s = f.resolve();
  print_line(program + " (" + library + "): Llama, shape " + f.shape + ": vocab " + str(s.vocab) + ", d " + str(s.d) +
             ", layers " + str(s.layers) + ", heads " + str(s.heads) + " (kv " + str(s.kv_heads) + "), hidden " +
             str(s.hidden) + ", seq " + str(s.seq) + (f.untied ? ", untied" : ", tied") + "; prefill " +
             str(f.prompt) + " tokens, decode " + str(f.new_tokens) + " tokens; threads " +
             std::to_string(f.threads) + ", seed " + std::to_string(f.seed) + ", float32, greedy");
  print_library_lines();
}

void report_train_step(const std::vector<double>& ms, std::size_t steps_run, double last_loss) {
  print_line("loss after " + str(steps_run) + " steps: " + fmt(last_loss, 4));
  print_summary("train step", ms, "ms");
  print_peak_rss();
  print_result("train_step_ms", summarize(ms).median, "ms");
}

void report_attention(const std::vector<double>& ms, double rss_inputs_mib) {
  print_summary("attention fwd+bwd", ms, "ms");
  const double peak = peak_rss_mib();
  print_peak_rss();
  print_line("RSS after inputs: " + fmt(rss_inputs_mib, 1) + " MiB");
  print_line("RSS growth over inputs: " + fmt(peak - rss_inputs_mib, 1) + " MiB");
  print_result("attention_fwd_bwd_ms", summarize(ms).median, "ms");
}

void report_op_overhead(const std::vector<double>& ms, std::size_t k, double grad) {
  const std::vector<double> us_per_op = scaled(ms, 1000.0 / static_cast<double>(k));
  print_line("d chain / d x = " + fmt(grad, 6));
  print_summary("chain fwd+bwd", ms, "ms");
  print_summary("per op fwd+bwd", us_per_op, "us");
  print_peak_rss();
  print_result("op_overhead_us", summarize(us_per_op).median, "us");
}

void report_matmul(const std::string& library, std::size_t n, int threads, const std::vector<double>& ms,
                   const std::vector<double>& raw_ms) {
  const double nd = static_cast<double>(n);
  const double gflop = 2.0 * nd * nd * nd * 1e-9;
  const auto gflops = [gflop](const std::vector<double>& t) {
    std::vector<double> out;
    for (double v : t) out.push_back(gflop / (v * 1e-3));
    return out;
  };
  const std::vector<double> lib_gflops = gflops(ms), raw_gflops = gflops(raw_ms);
  print_summary(library + " matmul", ms, "ms");
  print_summary(library + " matmul", lib_gflops, "GFLOPS");
  print_summary("raw cblas_sgemm (OpenBLAS threads " + std::to_string(threads) + ")", raw_gflops, "GFLOPS");
  const double lib_median = summarize(lib_gflops).median, raw_median = summarize(raw_gflops).median;
  print_line("raw sgemm GFLOPS: " + fmt(raw_median, 2));
  print_line("ratio " + library + " / raw sgemm: " + fmt(lib_median / raw_median, 3));
  print_peak_rss();
  print_result("matmul_gflops", lib_median, "GFLOPS");
}

}  // namespace bench
