// The vocabulary of the built-in tasks: tokens as strings, saved in checkpoints as JSON.
#include <xgrad/train/tasks.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <xgrad/core/error.hpp>
#include <nlohmann/json.hpp>
#include <xgrad/io/detail/json.hpp>

namespace xg::train {

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
  nlohmann::json a = nlohmann::json::array();
  for (const std::string& t : tokens) {
    try {
      (void)nlohmann::json(t).dump();
      a.push_back(t);
    } catch (const nlohmann::json::exception&) {
      nlohmann::json bytes = nlohmann::json::array();
      for (unsigned char c : t) bytes.push_back(static_cast<int>(c));
      a.push_back(bytes);
    }
  }
  return a.dump();
}

Vocabulary Vocabulary::from_json(const std::string& text) {
  const std::string what = "not a JSON array of tokens (strings or arrays of byte values 0..255)";
  Vocabulary v;
  nlohmann::json a;
  try {
    xg::json::check_limits(text);  // nlohmann recurses: bounded depth and size first
    a = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(op_message("vocabulary", what + ": " + e.what()));
  } catch (const FormatError& e) {
    throw FormatError(op_message("vocabulary", what + ": " + e.what()));
  }
  if (!a.is_array()) throw FormatError(op_message("vocabulary", what));
  for (const auto& t : a) {
    if (t.is_string()) {
      v.tokens.push_back(t.get<std::string>());
      continue;
    }
    if (!t.is_array() || t.empty()) throw FormatError(op_message("vocabulary", what + ": entry " + t.dump()));
    std::string bytes;
    for (const auto& b : t) {
      if (!b.is_number_unsigned() || b.get<std::uint64_t>() > 255)
        throw FormatError(op_message("vocabulary", what + ": entry " + t.dump()));
      bytes.push_back(static_cast<char>(b.get<std::uint64_t>()));
    }
    v.tokens.push_back(bytes);
  }
  return v;
}

}  // namespace xg::train
