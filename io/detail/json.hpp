// A small JSON reader and writer for the engine's own file formats (the safetensors header),
// so the engine library needs no JSON package. Internal: not installed, not part of the API.
// The reader is strict (RFC 8259): one value, no trailing commas, no comments, no duplicate
// object keys, strings in valid UTF-8, nesting at most 64 deep. Numbers keep their text, so
// integers up to 2^64 - 1 read back exactly.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace xg::json {

class Value {
 public:
  enum class Kind { null, boolean, number, string, array, object };

  Value() = default;
  static Value make_bool(bool b);
  static Value make_number_text(std::string text);  // a valid JSON number's text
  static Value make_uint(std::uint64_t v);
  static Value make_string(std::string s);
  static Value make_array(std::vector<Value> items = {});
  static Value make_object(std::vector<std::pair<std::string, Value>> members = {});
  // A string from any bytes: each byte that is not part of valid UTF-8 becomes U+FFFD (a log,
  // a sample or a folder name may hold any bytes; JSON text may not).
  static Value make_text(const std::string& bytes);

  Kind kind() const { return kind_; }
  bool is_object() const { return kind_ == Kind::object; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_number() const { return kind_ == Kind::number; }

  // A number that is a non-negative integer written without fraction or exponent and fits
  // in 64 bits; false otherwise (out is then unchanged).
  bool as_uint(std::uint64_t& out) const;
  const std::string& str() const { return text_; }  // string contents, or a number's text
  const std::vector<Value>& items() const { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }
  // The member named key, or nullptr.
  const Value* find(const std::string& key) const;

  void push(Value v) { items_.push_back(std::move(v)); }
  void set(std::string key, Value v) { members_.emplace_back(std::move(key), std::move(v)); }

  // JSON text: compact (indent 0), or with every array item and object member on a line of
  // its own, `indent` spaces deeper per level ("key": value; empty ones stay [] and {}).
  std::string dump(int indent = 0) const;

 private:
  Kind kind_ = Kind::null;
  bool bool_ = false;
  std::string text_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

// The limits of every JSON text xgrad reads (this reader's and, through check_limits, the
// nlohmann reader's; docs/reliability.md): at most kMaxDepth arrays and objects one inside
// the other, at most kMaxBytes bytes of text.
constexpr int kMaxDepth = 64;
constexpr std::size_t kMaxBytes = std::size_t(100) << 20;

// Throws xg::FormatError("JSON ...") when text is longer than kMaxBytes or nests arrays and
// objects deeper than kMaxDepth (counted outside strings, in one pass without recursion): run
// before handing text to a parser that recurses (nlohmann's reader and writer do).
void check_limits(const std::string& text);

// Parses text; throws xg::FormatError("... at byte N: what is wrong") on any error, including
// text beyond the limits above.
Value parse(const std::string& text);

// s as a JSON string literal with quotes; throws xg::FormatError when s is not valid UTF-8.
std::string quote(const std::string& s);

// True when s is valid UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool valid_utf8(const std::string& s);

}  // namespace xg::json
