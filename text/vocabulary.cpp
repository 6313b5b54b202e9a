// The vocabulary of a model: tokens as strings, saved in checkpoints as JSON.
#include <xgrad/text/vocabulary.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/json.hpp>

namespace xg::text {

std::int64_t Vocabulary::id(const std::string& t) const {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == t) return static_cast<std::int64_t>(i);
  throw ValueError(op_message("vocabulary", "unknown token '" + t + "'"));
}

std::string Vocabulary::decode(const std::vector<std::int64_t>& ids) const {
  std::string s;
  for (std::int64_t i : ids) {
    if (i < 0 || static_cast<std::size_t>(i) >= tokens.size())
      throw ValueError(op_message("vocabulary", "id " + std::to_string(i) + " outside the vocabulary of " +
                                                    std::to_string(tokens.size())));
    s += tokens[static_cast<std::size_t>(i)];
  }
  return s;
}

// A token that is valid UTF-8 is a JSON string; any other token (a byte of a multi-byte
// character, for charlm on any text) is an array of its byte values: lossless either way.
std::string Vocabulary::to_json() const {
  std::string out = "[";
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    if (i) out += ",";
    if (json::valid_utf8(t)) {
      out += json::quote(t);
      continue;
    }
    out += "[";
    for (std::size_t k = 0; k < t.size(); ++k)
      out += (k ? "," : "") + std::to_string(static_cast<unsigned char>(t[k]));
    out += "]";
  }
  return out + "]";
}

Vocabulary Vocabulary::from_json(const std::string& text) {
  const std::string what = "not a JSON array of tokens (strings or arrays of byte values 0..255)";
  Vocabulary v;
  json::Value a;
  try {
    a = json::parse(text);
  } catch (const FormatError& e) {
    throw FormatError(op_message("vocabulary", what + ": " + e.what()));
  }
  if (!a.is_array()) throw FormatError(op_message("vocabulary", what));
  for (const json::Value& t : a.items()) {
    if (t.is_string()) {
      v.tokens.push_back(t.str());
      continue;
    }
    if (!t.is_array() || t.items().empty()) throw FormatError(op_message("vocabulary", what + ": entry " + t.dump()));
    std::string bytes;
    for (const json::Value& b : t.items()) {
      std::uint64_t x = 0;
      if (!b.as_uint(x) || x > 255) throw FormatError(op_message("vocabulary", what + ": entry " + t.dump()));
      bytes.push_back(static_cast<char>(x));
    }
    v.tokens.push_back(bytes);
  }
  return v;
}

std::string placeholder_token(std::size_t id) { return "<" + std::to_string(id) + ">"; }

}  // namespace xg::text
