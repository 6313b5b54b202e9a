#include <xgrad/core/error.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace xg {

std::string op_message(const std::string& op, const std::string& message) {
  return "[" + op + "] " + message;
}

std::string shown_value(const std::string& value, std::size_t max) {
  static const char* const hex = "0123456789abcdef";
  std::string out;
  const std::size_t n = value.size() < max ? value.size() : max;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (value.size() > max) out += "... (" + std::to_string(value.size()) + " bytes)";
  return out;
}

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  int precision = 1;
  for (; precision <= 17; ++precision) {  // 17 significant digits always read back
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // %g writes 500 with one digit as 5e+02: numbers from 1 up to 10^15 are written out instead.
  if (std::strchr(buf, 'e') != nullptr && std::fabs(v) >= 1 && std::fabs(v) < 1e15) {
    const int exponent = static_cast<int>(std::floor(std::log10(std::fabs(v))));
    char fixed[40];
    std::snprintf(fixed, sizeof fixed, "%.*f", precision - 1 - exponent > 0 ? precision - 1 - exponent : 0, v);
    if (std::strtod(fixed, nullptr) == v) return fixed;
  }
  return buf;
}

}  // namespace xg
