// Flag checks shared by the example programs (CLI11 validators): CLI11 alone would wrap "-1"
// to 2^64 - 1, read "" as 0 and let NaN pass a range.
#pragma once

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

namespace examples {

// The whole text must be digits, within range of an unsigned 64-bit integer.
inline std::string digits_only(std::string& s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    return "must be a non-negative integer, got '" + s + "'";
  errno = 0;
  (void)std::strtoull(s.c_str(), nullptr, 10);
  return errno == ERANGE ? "'" + s + "' is out of range" : std::string();
}

// The whole text must be a finite number.
inline std::string a_number(std::string& s) {
  char* end = nullptr;
  double v = 0;
  if (!s.empty() && !std::isspace(static_cast<unsigned char>(s[0]))) v = std::strtod(s.c_str(), &end);
  return end && *end == '\0' && std::isfinite(v) ? std::string() : "must be a finite number, got '" + s + "'";
}

}  // namespace examples
