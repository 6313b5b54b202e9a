#include "tests/support/helpers.hpp"

#include <cstring>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <vector>
#include <limits>
#include <sstream>
#include <fstream>

#include <unistd.h>

namespace xgt {

namespace {

// The folders temp_dir made, removed when the test program exits (XGRAD_KEEP_TEST_DIRS set:
// kept, to look at after a failure). Only by the process that made them: a forked child that
// exits leaves them to its parent.
struct TempDirs {
  std::vector<std::filesystem::path> paths;
  pid_t owner = ::getpid();
  ~TempDirs() {
    if (::getpid() != owner || std::getenv("XGRAD_KEEP_TEST_DIRS")) return;
    for (const auto& p : paths) {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  }
};

TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::filesystem::path temp_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path p = fs::temp_directory_path() / ("xgrad_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  TempDirs& dirs = temp_dirs();
  if (std::find(dirs.paths.begin(), dirs.paths.end(), p) == dirs.paths.end()) dirs.paths.push_back(p);
  return p;
}

IndexArray random_tokens(Generator& g, std::size_t B, std::size_t T, std::size_t V) {
  std::vector<std::int64_t> ids(B * T);
  for (auto& t : ids) t = static_cast<std::int64_t>(g.below(V));
  return IndexArray({B, T}, ids);
}

void randomise_parameters(nn::Module& m, Generator& g, double lo, double hi) {
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    t.set_value(random_uniform(t.shape(), g, t.dtype(), lo, hi));
  }
}

Array rnd(const Shape& s, Generator& g, double lo, double hi) {
  return random_uniform(s, g, DType::float64, lo, hi);
}

Array rnd_away_from_zero(const Shape& s, Generator& g, double margin) {
  Array a = Array::empty(s, DType::float64);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double m = margin + (1.0 - margin) * g.uniform();
    a.set_flat(i, g.uniform() < 0.5 ? -m : m);
  }
  return a;
}

Shape rnd_shape(std::size_t rank, Generator& g, std::size_t max_size) {
  Shape s(rank);
  for (auto& d : s) d = 1 + static_cast<std::size_t>(g.below(max_size));
  return s;
}

GradcheckReport require_gradcheck(const GradcheckFn& f, const std::vector<Array>& inputs,
                                  const std::vector<std::string>& names,
                                  const GradcheckOptions& opts) {
  const GradcheckReport r = gradcheck(f, inputs, opts, names);
  INFO(r.summary());
  REQUIRE(r.passed);
  REQUIRE(r.comparisons > 0);
  return r;
}

void require_close(const Array& a, const Array& b, double tol) {
  INFO("a = " << a.str() << "\nb = " << b.str());
  REQUIRE(a.shape() == b.shape());
  REQUIRE(max_abs_diff(a, b) <= tol);
}

void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
  REQUIRE(f.good());
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) FAIL("cannot open " << p.string() << " for reading");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

double max_scaled_diff(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::fabs(a.flat(i) - b.flat(i)) / std::max(1.0, std::fabs(b.flat(i))));
  return m;
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

double max_abs(const Array& a) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a.flat(i)));
  return m;
}

namespace {
template <class T> std::size_t differing(const Array& a, const Array& b) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(pa + i, pb + i, sizeof(T)) != 0;
  return n;
}
// a and b of one shape and dtype
std::size_t differing(const Array& a, const Array& b) {
  return a.dtype() == DType::float64 ? differing<double>(a, b) : differing<float>(a, b);
}
}  // namespace

std::size_t differing_bits(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  return differing(a, b);
}

bool same_bits(const Array& a, const Array& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && differing(a, b) == 0;
}

double rounding_bound(std::size_t length, DType dtype, double scale, double ulps) {
  const double eps = dtype == DType::float32 ? double(std::numeric_limits<float>::epsilon())
                                             : std::numeric_limits<double>::epsilon();
  return ulps * double(std::max<std::size_t>(length, 1)) * eps * std::max(scale, 1e-300);
}

nn::TransformerConfig tiny_model(nn::Architecture arch, std::size_t layers) {
  nn::TransformerConfig c;
  c.V_vocab = 11;
  c.context = 8;
  c.d_model = 8;
  c.H_q = 2;
  c.layers = layers;
  c.d_ff = 12;
  c.dtype = DType::float64;
  if (arch == nn::Architecture::llama) {
    c.arch = arch;
    c.pos = nn::PositionScheme::rope;
    c.multiple_of = 4;
  }
  return c;
}

}  // namespace xgt
