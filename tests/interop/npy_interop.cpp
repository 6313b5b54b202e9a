// npy_interop: the xgrad half of the .npy/.npz interop test (tests/interop/npy_numpy.py).
//
// Usage:
//   npy_interop check DIR   reads every file DIR/manifest.json lists (written by NumPy) with
//                           io::npy and compares: arrays bit for bit with the values in the
//                           manifest (exact text: NaN, +-inf, -0.0, subnormals), or the
//                           FormatError text for files xgrad must refuse.
//   npy_interop write DIR   writes .npy files and cpp.npz from fixed formulas for NumPy to read
//                           back (npy_numpy.py verify computes the same formulas itself).
//   npy_interop mha DIR     loads DIR/kdim.npz and DIR/packed.npz (torch_mha_npz.py: an
//                           nn.MultiheadAttention's state_dict, inputs and torch's output),
//                           imports the state into nn::CrossAttention with
//                           torch_layout::import_mha as docs/from-pytorch.md shows, and
//                           compares the output with torch's (1e-12, float64).
// Exit status 0 if every check passed, 1 otherwise, 2 for a usage error.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <xgrad/xgrad.hpp>

namespace {

using namespace xg;
namespace npy = xg::io::npy;

int failures = 0;

void report(bool ok, const std::string& line) {
  std::printf("  %s  %s\n", ok ? "ok  " : "FAIL", line.c_str());
  if (!ok) ++failures;
}

// Bitwise comparison of one loaded element with its exact text; NaN matches any NaN.
bool same_float(double got, const std::string& text, bool f32) {
  const double want = std::strtod(text.c_str(), nullptr);
  if (std::isnan(want)) return std::isnan(got);
  if (f32 && static_cast<double>(static_cast<float>(want)) != want) return false;  // text must be a float32
  return std::memcmp(&got, &want, sizeof(double)) == 0;  // -0.0 differs from 0.0
}

std::string compare(const npy::Value& v, const nlohmann::ordered_json& want) {
  const std::string dt = want["dtype"];
  Shape shape;
  for (const auto& d : want["shape"]) shape.push_back(d.get<std::size_t>());
  if (v.shape() != shape) return "shape " + shape_str(v.shape()) + ", expected " + shape_str(shape);
  const auto& data = want["data"];
  if (dt == "int64") {
    if (!v.is_index()) return std::string("loaded as ") + dtype_name(v.array.dtype()) + ", expected int64";
    for (std::size_t i = 0; i < v.index.size(); ++i)
      if (v.index.data[i] != std::strtoll(data[i].get<std::string>().c_str(), nullptr, 10))
        return "element " + std::to_string(i) + " is " + std::to_string(v.index.data[i]) + ", expected " +
               data[i].get<std::string>();
    return "";
  }
  if (v.is_index() || dt != dtype_name(v.array.dtype()))
    return std::string("loaded as ") + (v.is_index() ? "int64" : dtype_name(v.array.dtype())) + ", expected " + dt;
  for (std::size_t i = 0; i < v.array.size(); ++i) {
    if (!same_float(v.array.flat(i), data[i].get<std::string>(), dt == "float32")) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", v.array.flat(i));
      return "element " + std::to_string(i) + " is " + buf + ", expected " + data[i].get<std::string>();
    }
  }
  return "";
}

int check(const std::string& dir) {
  std::ifstream in(dir + "/manifest.json");
  if (!in) {
    std::fprintf(stderr, "npy_interop: cannot open %s/manifest.json\n", dir.c_str());
    return 1;
  }
  const nlohmann::ordered_json manifest = nlohmann::ordered_json::parse(in);
  std::size_t read = 0, refused = 0;
  for (const auto& m : manifest) {
    const std::string name = m["file"], path = dir + "/" + name;
    const bool is_npz = name.size() > 4 && (name.compare(name.size() - 4, 4, ".npz") == 0 || name.find(".as_npz") != std::string::npos);
    try {
      std::vector<std::pair<std::string, npy::Value>> got;
      if (is_npz)
        got = npy::load_npz(path).entries;
      else
        got.emplace_back("", npy::read(path));
      if (m["expect"] == "error") {
        report(false, name + ": read without error, expected a FormatError containing '" + m["error"].get<std::string>() + "'");
        continue;
      }
      const auto& arrays = m["arrays"];
      std::string problem;
      if (got.size() != arrays.size()) problem = std::to_string(got.size()) + " arrays, expected " + std::to_string(arrays.size());
      std::size_t k = 0;
      for (auto it = arrays.begin(); problem.empty() && it != arrays.end(); ++it, ++k) {
        if (got[k].first != it.key()) {
          problem = "array " + std::to_string(k) + " is named '" + got[k].first + "', expected '" + it.key() + "'";
          break;
        }
        const std::string diff = compare(got[k].second, it.value());
        if (!diff.empty()) problem = (is_npz ? "'" + it.key() + "': " : "") + diff;
      }
      report(problem.empty(), name + (problem.empty() ? ": " + std::to_string(got.size()) + " array(s) equal bit for bit" : ": " + problem));
      ++read;
    } catch (const FormatError& e) {
      const std::string what = e.what();
      if (m["expect"] == "error") {
        const std::string want = m["error"];
        const bool ok = what.find(want) != std::string::npos && what.find(path) != std::string::npos;
        report(ok, name + ": " + what + (ok ? "" : "  [expected the path and '" + want + "']"));
        ++refused;
      } else {
        report(false, name + ": " + what);
      }
    } catch (const std::exception& e) {
      report(false, name + ": unexpected exception (not a FormatError): " + e.what());
    }
  }
  std::printf("check: %zu files read, %zu refused, %d failure(s)\n", read, refused, failures);
  return failures ? 1 : 0;
}

// ((i * 7919) % 1000 - 500) / 64: exact in float32, the same formula as npy_numpy.py.
Array ramp(const Shape& s, DType dt) {
  std::vector<double> v(numel(s));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = (static_cast<double>((i * 7919) % 1000) - 500.0) / 64.0;
  return Array::from_vector(s, v, dt);
}

int write(const std::string& dir) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  const Array f64_special =
      Array::from_vector({6}, {nan, inf, -inf, -0.0, 5e-324, std::numeric_limits<double>::max()}, DType::float64);
  const Array f32_special = Array::from_vector(
      {6}, {nan, inf, -inf, -0.0, std::ldexp(1.0, -149), static_cast<double>(std::numeric_limits<float>::max())},
      DType::float32);
  const IndexArray ids({2, 3}, {0, -1, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min(),
                                (std::int64_t(1) << 53) + 1, 42});
  npy::save(dir + "/cpp_f32_2x3.npy", ramp({2, 3}, DType::float32));
  npy::save(dir + "/cpp_f64_4.npy", ramp({4}, DType::float64));
  npy::save(dir + "/cpp_f64_scalar.npy", ramp({1}, DType::float64).reshaped({}));
  npy::save(dir + "/cpp_f32_empty.npy", Array::zeros({0, 5}, DType::float32));
  npy::save(dir + "/cpp_f64_special.npy", f64_special);
  npy::save(dir + "/cpp_f32_special.npy", f32_special);
  npy::save(dir + "/cpp_i64.npy", ids);
  npy::save(dir + "/cpp_f32_3d.npy", ramp({3, 4, 5}, DType::float32));
  npy::Npz z;
  z.add("w", ramp({3, 4}, DType::float32))
      .add("b", ramp({4}, DType::float64))
      .add("ids", ids)
      .add("special", f64_special)
      .add("empty", IndexArray(Shape{0}, {}))
      .add("naïve/μ", ramp({2}, DType::float64));
  npy::save_npz(dir + "/cpp.npz", z);
  std::printf("write: 8 .npy files and cpp.npz (6 arrays) in %s\n", dir.c_str());
  return 0;
}

// docs/from-pytorch.md, "Other torch models": the same steps.
int mha(const std::string& dir) {
  for (const char* name : {"kdim.npz", "packed.npz"}) {
    const npy::Npz z = npy::load_npz(dir + "/" + name);
    const bool packed = z.contains("in_proj_weight");
    nn::CrossAttentionConfig cfg;
    cfg.d_q = z.array("out_proj.weight").shape()[0];
    cfg.d_m = z.array("X_m").shape()[2];
    cfg.H_q = static_cast<std::size_t>(z.index("num_heads").data.at(0));
    cfg.dtype = DType::float64;
    Generator gen(0);
    nn::CrossAttention cross(cfg, gen);
    nn::torch_layout::TorchMHA w;
    if (packed) {
      w.in_proj_weight = z.array("in_proj_weight");
    } else {
      w.q_proj_weight = z.array("q_proj_weight");
      w.k_proj_weight = z.array("k_proj_weight");
      w.v_proj_weight = z.array("v_proj_weight");
    }
    w.in_proj_bias = z.array("in_proj_bias");
    w.out_proj_weight = z.array("out_proj.weight");
    w.out_proj_bias = z.array("out_proj.bias");
    nn::torch_layout::import_mha(cross, w);
    nn::AttentionCall call;  // int64 lengths from NumPy are the Visibility constructors' own type
    call.visibility = nn::Visibility::key_lengths(z.index("src_lengths").data,
                                                  static_cast<nn::Position>(z.array("X_m").shape()[1]));
    NoGradGuard no_grad;
    const Tensor Y = cross.forward(Tensor(z.array("X_q")), Tensor(z.array("X_m")), call).Y;
    const double e = max_abs_diff(Y.value(), z.array("Y"));
    char err[32];
    std::snprintf(err, sizeof err, "%.2e", e);
    report(e <= 1e-12, std::string(name) + (packed ? " (packed in_proj_weight)" : " (kdim != embed_dim)") +
                           ": xgrad CrossAttention with the imported nn.MultiheadAttention state, max|xgrad - torch| = " +
                           err);
  }
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "check" && mode != "write" && mode != "mha") {
    std::fprintf(stderr, "usage: %s check|write|mha DIR\n", argv[0]);
    return 2;
  }
  try {
    return mode == "check" ? check(argv[2]) : mode == "write" ? write(argv[2]) : mha(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "npy_interop: %s\n", e.what());
    return 1;
  }
}
