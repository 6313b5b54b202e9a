// JSON text for the programs that hand xgrad's arrays to Python (tests/torch, tests/interop):
// doubles with 17 significant digits (round-trip exact), arrays as {"shape": [...], "data": [...]}.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <xgrad/core/array.hpp>

namespace xgt::json_text {

inline std::string jnum(double v) {
  if (!std::isfinite(v)) throw std::runtime_error("json_text: non-finite value");
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A JSON string; quotes, backslashes and control characters escaped.
inline std::string jstr(const std::string& s) {
  std::string r = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      r += buf;
    } else {
      r += c;
    }
  }
  return r + "\"";
}

inline std::string jsizes(const std::vector<std::size_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// A JSON list of integers (positions, lengths).
inline std::string jints64(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

inline std::string jarray(const xg::Array& a) {
  const std::vector<double> d = a.to_vector();
  std::string s = "{\"shape\":" + jsizes(a.shape()) + ",\"data\":[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? "," : "") + jnum(d[i]);
  return s + "]}";
}

inline std::string jints(const xg::IndexArray& t) {
  std::string s = "{\"shape\":" + jsizes(t.shape) + ",\"data\":[";
  for (std::size_t i = 0; i < t.data.size(); ++i) s += (i ? "," : "") + std::to_string(t.data[i]);
  return s + "]}";
}

inline std::string jbools(const xg::BoolArray& m) {
  std::string s = "{\"shape\":" + jsizes(m.shape) + ",\"data\":[";
  for (std::size_t i = 0; i < m.data.size(); ++i) s += std::string(i ? "," : "") + (m.data[i] ? "1" : "0");
  return s + "]}";
}

}  // namespace xgt::json_text
