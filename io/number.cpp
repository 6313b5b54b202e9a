#include <xgrad/io/number.hpp>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <xgrad/core/error.hpp>

namespace xg::io {

namespace {

bool digits_only(const std::string& t, std::size_t from) {
  if (t.size() <= from) return false;
  for (std::size_t i = from; i < t.size(); ++i)
    if (t[i] < '0' || t[i] > '9') return false;
  return true;
}

}  // namespace

std::int64_t parse_int(const std::string& text, const std::string& where) {
  if (!digits_only(text, text.size() > 0 && text[0] == '-' ? 1 : 0))
    throw FormatError(where + ": '" + shown_value(text) + "' is not an integer");
  errno = 0;
  const long long v = std::strtoll(text.c_str(), nullptr, 10);
  if (errno == ERANGE) throw FormatError(where + ": '" + shown_value(text) + "' is out of range");
  return v;
}

std::uint64_t parse_uint(const std::string& text, const std::string& where) {
  if (!digits_only(text, 0)) throw FormatError(where + ": '" + shown_value(text) + "' is not a non-negative integer");
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) throw FormatError(where + ": '" + shown_value(text) + "' is out of range");
  return v;
}

double parse_double(const std::string& text, const std::string& where) {
  char* end = nullptr;
  const double v = text.empty() || std::isspace(static_cast<unsigned char>(text[0])) ? NAN : std::strtod(text.c_str(), &end);
  if (!end || *end != '\0' || !std::isfinite(v)) throw FormatError(where + ": '" + shown_value(text) + "' is not a finite number");
  return v;
}

std::string exact_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string shortest_text(double v) {
  char buf[40];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*g", p, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace xg::io
