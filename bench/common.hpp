// What the benchmark programs share, xgrad's (bench/*.cpp) and the libtorch reference's
// (bench/torch/*.cpp): the flags of each program, the timing loop, min/median/max, the
// process's memory, the output lines and the one-line error on bad input. Nothing here
// includes xgrad or libtorch, so both sets of programs read the same definitions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace bench {

// Bad flag combinations found after parsing (heads not dividing d, ...): one line, exit 1.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --- flags, the same for the xgrad and the libtorch programs ---

struct TrainFlags {
  std::size_t vocab = 65, d = 64, heads = 4, layers = 2, seq = 64, batch = 16, steps = 50, warmup = 5;
  std::optional<std::size_t> kv_heads;  // default: heads
  int threads = 2;
  std::uint64_t seed = 0;
  bool no_memory_cache = false;  // xgrad only: caching allocator off (to measure what it is worth)
  std::size_t kv() const { return kv_heads ? *kv_heads : heads; }
};

struct AttentionFlags {
  std::size_t batch = 1, heads = 8, seq = 1024, dh = 64, reps = 10, warmup = 2;
  std::optional<std::size_t> kv_heads;  // default: heads
  int threads = 2;
  std::uint64_t seed = 0;
  std::string impl = "auto";    // auto | composed | fused
  std::string mask = "causal";  // causal | none | padding | documents
  std::size_t kv() const { return kv_heads ? *kv_heads : heads; }
};

struct OpOverheadFlags {
  std::size_t k = 1000, reps = 50, warmup = 5;
};

struct MatmulFlags {
  std::size_t n = 1024, reps = 10, warmup = 2;
  int threads = 2;
  std::string dtype = "float32";  // bench_matmul's --dtype (float32 or float64)
};

// bench_generate (xgrad only): a Llama model of a named shape (`shape`: stories15M or
// stories42M, llama2.c's TinyStories models), any size overridable; unset sizes come from
// the shape (resolve()).
struct GenerateFlags {
  std::string shape = "stories15M";
  std::optional<std::size_t> vocab, d, heads, kv_heads, layers, seq, hidden;
  std::size_t prompt = 128, new_tokens = 255, reps = 5, warmup = 1;
  int threads = 1;
  std::uint64_t seed = 0;
  bool untied = false;
  bool no_pack = false;  // bench_generate: leave each parameter in its own block
  // The sizes with the shape's defaults filled in; throws UsageError for an inconsistent set.
  struct Sizes {
    std::size_t vocab, d, heads, kv_heads, layers, seq, hidden;
  };
  Sizes resolve() const;
};

void add_flags(CLI::App& app, TrainFlags& f);
void add_flags(CLI::App& app, AttentionFlags& f);
void add_flags(CLI::App& app, OpOverheadFlags& f);
void add_flags(CLI::App& app, MatmulFlags& f);
void add_flags(CLI::App& app, GenerateFlags& f);

// Checks across flags; throws UsageError.
void validate(const TrainFlags& f);
void validate(const AttentionFlags& f);

// Parses argv into the flags registered on `app` (by `add`), then runs `body`. --help prints
// the usage and returns 0; a bad flag or value, a failed check or any exception from the
// body prints one line "<program>: error: ..." on stderr and returns non-zero.
int run_program(const std::string& program, const std::string& description, int argc, char** argv,
                const std::function<void(CLI::App&)>& add, const std::function<void()>& body);
// The same for a program whose flags are one of the structs above: run(f) after parsing.
template <class Flags, class Run>
int run_program(const std::string& program, const std::string& description, int argc, char** argv, Flags& f, Run run) {
  return run_program(
      program, description, argc, argv, [&f](CLI::App& app) { add_flags(app, f); }, [&] { run(f); });
}

// --- inputs that must be the same on both sides ---

// Key lengths for --mask padding: 3/4 of T for even samples, 1/2 for odd ones (at least 1).
std::vector<std::size_t> padding_lengths(std::size_t B, std::size_t T);
// Document ids [T] for --mask documents: up to 4 documents with random lengths from seed.
std::vector<std::int64_t> document_ids(std::size_t T, std::uint64_t seed);

// --- measuring ---

// Runs fn `warmup` times untimed, then `reps` times; returns each timed run in milliseconds.
std::vector<double> time_reps(std::size_t warmup, std::size_t reps, const std::function<void()>& fn);

struct Summary {
  double min = 0, median = 0, max = 0;
};
Summary summarize(std::vector<double> samples);
// Every sample scaled by s (ms per step -> us per op, seconds -> GFLOPS ...).
std::vector<double> scaled(const std::vector<double>& samples, double s);

// FNV-1a over bytes, from h (start at kFnvStart): equal results give equal hashes (to compare
// builds, thread counts and ISAs bit for bit).
constexpr std::uint64_t kFnvStart = 1469598103934665603ull;
void fnv(std::uint64_t& h, const void* data, std::size_t n);

double peak_rss_mib();     // getrusage ru_maxrss: the high-water mark of this process
double current_rss_mib();  // /proc/self/statm: resident now

// --- output ---

void print_line(const std::string& text);
// "<what>: min X, median Y, max Z <unit> (<n> reps)"
void print_summary(const std::string& what, const std::vector<double>& samples, const std::string& unit);
void print_peak_rss();
// The final line: "RESULT <name> <value> <unit>".
void print_result(const std::string& name, double value, const std::string& unit);

std::string fmt(double v, int digits = 3);  // fixed-point with `digits` decimals

// The lines after the first of every program's header: "OpenBLAS core: <openblas_get_corename()>
// (<openblas_get_config()>)", then the lines of each function registered with
// add_header_lines (the xgrad programs: the GEMM kernels xgrad chose, bench/xgrad_header.cpp).
void print_library_lines();
void add_header_lines(const std::function<std::vector<std::string>()>& lines);

// The first line: "<program> (<library>): <the sizes and settings of f>", then
// print_library_lines().
void print_header(const std::string& program, const std::string& library, const TrainFlags& f);
void print_header(const std::string& program, const std::string& library, const AttentionFlags& f);
void print_header(const std::string& program, const std::string& library, const OpOverheadFlags& f);
void print_header(const std::string& program, const std::string& library, const MatmulFlags& f);
void print_header(const std::string& program, const std::string& library, const GenerateFlags& f);

// The closing lines of each program, from its samples (milliseconds per rep), ending with
// the RESULT line.
void report_train_step(const std::vector<double>& ms, std::size_t steps_run, double last_loss);
// rss_inputs_mib: the RSS right after the inputs were allocated.
void report_attention(const std::vector<double>& ms, double rss_inputs_mib);
void report_op_overhead(const std::vector<double>& ms, std::size_t k, double grad);
// ms: the library's matmul; raw_ms: raw cblas_sgemm with OpenBLAS's own `threads` threads.
void report_matmul(const std::string& library, std::size_t n, int threads, const std::vector<double>& ms,
                   const std::vector<double>& raw_ms);

}  // namespace bench
