// The calibration cache (core/detail/calibration.hpp): speed ratios measured once per CPU and
// build, kept in a text file so that every process on this machine makes the same kernel choices.
#include <xgrad/core/detail/calibration.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>

#include <unistd.h>

#include <xgrad/core/error.hpp>
#include <xgrad/core/runtime.hpp>
#include <xgrad/version.hpp>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace xg {

namespace detail {
namespace {

constexpr const char* kHeader = "xgrad calibration cache 1";
constexpr const char* kFileName = "calibration-v1.txt";
constexpr std::size_t kMaxFileBytes = 1 << 20;
constexpr std::size_t kMaxKey = 512, kMaxName = 64;
constexpr double kMaxValue = 1e6;

[[noreturn]] void bad_file(const std::string& path, std::size_t line, const std::string& what) {
  throw FormatError("calibration cache " + path + (line ? ", line " + std::to_string(line) : std::string()) + ": " +
                    what + " (delete the file and xgrad measures again)");
}

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxName) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

bool valid_key(const std::string& key) {
  if (key.empty() || key.size() > kMaxKey) return false;
  for (char c : key)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
  return true;
}

bool valid_value(double v) { return std::isfinite(v) && v > 0.0 && v <= kMaxValue; }

// A value as the file writes it: digits, '.', an exponent; nothing else (no spaces, no "inf").
bool parse_value(const std::string& text, double& out) {
  if (text.empty() || text.size() > 32) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

// A line split at its tabs into exactly three fields (the cache file's lines and
// calibrations_text()'s); false for a line with another number of tabs.
bool three_fields(const std::string& l, std::string& a, std::string& b, std::string& c) {
  const std::size_t t1 = l.find('\t'), t2 = t1 == std::string::npos ? t1 : l.find('\t', t1 + 1);
  if (t2 == std::string::npos || l.find('\t', t2 + 1) != std::string::npos) return false;
  a = l.substr(0, t1), b = l.substr(t1 + 1, t2 - t1 - 1), c = l.substr(t2 + 1);
  return true;
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  const auto first = s.find_first_not_of(' '), last = s.find_last_not_of(' ');
  if (first == std::string::npos) return "";
  s = s.substr(first, last - first + 1);
  std::string out;  // runs of spaces as one (brand strings are padded)
  for (char c : s)
    if (!(c == ' ' && !out.empty() && out.back() == ' ')) out += c;
  return out;
}

std::string cpu_identity() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  char vendor[13] = {};
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    std::memcpy(vendor, &b, 4);
    std::memcpy(vendor + 4, &d, 4);
    std::memcpy(vendor + 8, &c, 4);
  }
  std::string brand;
  if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
    char text[49] = {};
    for (unsigned leaf = 0; leaf < 3; ++leaf) {
      unsigned r[4] = {};
      __get_cpuid(0x80000002u + leaf, &r[0], &r[1], &r[2], &r[3]);
      std::memcpy(text + 16 * leaf, r, 16);
    }
    brand = text;
  }
  unsigned family = 0, model = 0, stepping = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    const unsigned base_family = (a >> 8) & 0xf, ext_family = (a >> 20) & 0xff;
    const unsigned base_model = (a >> 4) & 0xf, ext_model = (a >> 16) & 0xf;
    family = base_family == 0xf ? base_family + ext_family : base_family;
    model = base_family == 0x6 || base_family == 0xf ? (ext_model << 4) + base_model : base_model;
    stepping = a & 0xf;
  }
  return one_line(std::string(vendor) + " " + brand + " family " + std::to_string(family) + " model " +
                  std::to_string(model) + " stepping " + std::to_string(stepping));
#else
  return "a CPU without cpuid";
#endif
}

std::string build_identity() {
  std::string s = std::string("xgrad ") + XGRAD_VERSION_STRING;
#if defined(__clang__)
  s += " clang " + std::to_string(__clang_major__) + "." + std::to_string(__clang_minor__);
#elif defined(__GNUC__)
  s += " gcc " + std::to_string(__GNUC__) + "." + std::to_string(__GNUC_MINOR__);
#endif
#if defined(__OPTIMIZE__)
  s += " optimised";
#else
  s += " unoptimised";
#endif
  // Instrumented code times differently: a sanitizer build keeps ratios of its own.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  s += " sanitizers";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
  s += " sanitizers";
#endif
#endif
  return s;
}

using Entries = std::map<std::pair<std::string, std::string>, double>;

void write_file(const std::string& path, const Entries& entries) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return;
  std::string text = std::string(kHeader) +
                     "\n# Speed ratios xgrad measured to choose its kernels, per CPU and build (docs/performance.md,\n"
                     "# \"Calibration cache\"). Delete this file and xgrad measures again.\n";
  for (const auto& [k, v] : entries) text += k.first + "\t" + k.second + "\t" + number_text(v) + "\n";
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

std::string calibration_cache_path() {
  const char* dir = std::getenv("XGRAD_CACHE_DIR");
  if (dir && *dir) {
    if (std::strcmp(dir, "off") == 0) return "";
    return std::string(dir) + "/" + kFileName;
  }
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/xgrad/" + kFileName;  // (a relative one is ignored, as the spec says)
  const char* home = std::getenv("HOME");
  if (home && *home) return std::string(home) + "/.cache/xgrad/" + kFileName;
  return "";
}

std::string calibration_key() {
  static const std::string key = cpu_identity() + " | " + build_identity();
  return key;
}

Entries read_calibration_file(const std::string& path) {
  Entries entries;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return entries;  // nothing cached yet
    bad_file(path, 0, "cannot be read");
  }
  std::string text;
  {
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  if (text.size() > kMaxFileBytes)
    bad_file(path, 0, "is " + std::to_string(text.size()) + " bytes, more than a cache of this kind ever holds (" +
                          std::to_string(kMaxFileBytes) + ")");
  if (!text.empty() && text.back() != '\n') bad_file(path, 0, "does not end with a newline (cut short)");
  std::size_t pos = 0, line = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const std::string l = text.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (line == 1) {
      if (l != kHeader)
        bad_file(path, 1, "starts with '" + shown_value(l, 40) + "', not '" + kHeader + "'");
      continue;
    }
    if (l.empty() || l[0] == '#') continue;
    std::string key, name, value;
    if (!three_fields(l, key, name, value))
      bad_file(path, line, "'" + shown_value(l, 60) + "' is not KEY<tab>NAME<tab>VALUE");
    if (!valid_key(key)) bad_file(path, line, "the key '" + shown_value(key, 60) + "' is empty, too long or has control characters");
    if (!valid_name(name)) bad_file(path, line, "the name '" + shown_value(name, 60) + "' is not [a-z0-9_], 1 to 64 characters");
    double v = 0.0;
    if (!parse_value(value, v) || !valid_value(v))
      bad_file(path, line, "the value '" + shown_value(value, 40) + "' of " + name +
                               " is not a positive number up to 1e6");
    if (!entries.emplace(std::make_pair(key, name), v).second)
      bad_file(path, line, name + " appears twice for the same key");
  }
  if (line == 0) bad_file(path, 0, "is empty");
  return entries;
}

Calibration calibrated_in(const std::string& path, const std::string& key, const std::string& name,
                          const std::function<double()>& measure) {
  if (!valid_name(name)) throw InternalError("calibration name '" + shown_value(name) + "' is not [a-z0-9_]");
  if (path.empty()) return {measure(), false};
  // A file this user may not read (another user's cache, a home shared read-only) is left alone:
  // the process measures for itself, as without a cache.
  if (::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), R_OK) != 0) return {measure(), false};
  Entries entries = read_calibration_file(path);
  const auto id = std::make_pair(key, name);
  if (const auto it = entries.find(id); it != entries.end()) return {it->second, true};
  const double v = measure();
  if (!valid_value(v) || !valid_key(key)) return {v, false};
  // Another process may have written the file since: its entry wins (one value per machine).
  entries = read_calibration_file(path);
  if (const auto it = entries.find(id); it != entries.end()) return {it->second, true};
  entries.emplace(id, v);
  write_file(path, entries);
  return {v, false};
}

namespace {
std::mutex g_known_mutex;
std::map<std::string, Calibration> g_known;  // this process's values: every later call agrees
}  // namespace

Calibration calibrated(const std::string& name, const std::function<double()>& measure) {
  {
    const std::lock_guard<std::mutex> lock(g_known_mutex);
    if (const auto it = g_known.find(name); it != g_known.end()) return it->second;
  }
  const Calibration c = calibrated_in(calibration_cache_path(), calibration_key(), name, measure);
  const std::lock_guard<std::mutex> lock(g_known_mutex);
  return g_known.emplace(name, c).first->second;
}

std::string calibrations_text() {
  const std::lock_guard<std::mutex> lock(g_known_mutex);
  std::string text;
  for (const auto& [name, c] : g_known)
    text += name + "\t" + number_text(c.value) + "\t" + (c.cached ? "1" : "0") + "\n";
  return text;
}

void adopt_calibrations(const std::string& text) {
  std::map<std::string, Calibration> theirs;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = text.find('\n', pos);
    const std::string l = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    std::string name, value, cached;
    double v = 0.0;
    // Any double, nan and inf included: a failed measurement is rank 0's choice too.
    const auto any_double = [&v](const std::string& t) {
      char* e = nullptr;
      v = std::strtod(t.c_str(), &e);
      return !t.empty() && e == t.c_str() + t.size();
    };
    if (!three_fields(l, name, value, cached) || !valid_name(name) || !any_double(value) ||
        !(cached == "0" || cached == "1"))
      throw InternalError("adopt_calibrations: '" + shown_value(l, 60) + "' is not NAME<tab>VALUE<tab>0|1");
    theirs[name] = {v, cached == "1"};
  }
  const std::lock_guard<std::mutex> lock(g_known_mutex);
  for (const auto& [name, c] : theirs) g_known.emplace(name, c);
}

}  // namespace detail

std::string calibration_cache_path() { return detail::calibration_cache_path(); }

}  // namespace xg
