// The Python literal subset of a .npy header (internal, io/npy.cpp): dict, tuple, list, str,
// int, bool and None, parsed with a depth limit and errors that quote the header text.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/bytes.hpp>

namespace xg::io::detail {

// The subset of Python literals a .npy header uses: dict, tuple, list, str, int, bool, None.
struct Lit {
  enum class Kind { dict, tuple, list, str, integer, boolean, none } kind = Kind::none;
  std::string text;       // str contents, or an integer's digits (with sign)
  bool flag = false;      // boolean
  std::vector<Lit> items;                          // tuple, list
  std::vector<std::pair<std::string, Lit>> members;  // dict (keys must be str)
};

class LitParser {
 public:
  LitParser(const std::string& s, const std::string& where) : s_(s), where_(where) {}

  Lit document() {
    Lit v = value(0);
    skip_space();
    if (i_ != s_.size())
      fail("unexpected text after the header dict: '" + printable(s_.substr(i_)) + "'");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(where_ + "malformed header: " + what + " (header text: '" + printable(s_) + "')");
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool word(const char* w) {
    const std::size_t n = std::strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    if (i_ + n < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_ + n])) || s_[i_ + n] == '_')) return false;
    i_ += n;
    return true;
  }

  Lit value(int depth) {
    if (depth > 16) fail("nesting deeper than 16");
    skip_space();
    if (i_ >= s_.size()) fail("the text ends where a value should start");
    Lit v;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind = Lit::Kind::dict;
      while (!eat('}')) {
        const Lit key = value(depth + 1);
        if (key.kind != Lit::Kind::str) fail("a dict key is not a string");
        if (!eat(':')) fail("expected ':' after the key '" + key.text + "'");
        for (const auto& m : v.members)
          if (m.first == key.text) fail("the key '" + key.text + "' appears twice");
        v.members.emplace_back(key.text, value(depth + 1));
        if (!eat(',')) {
          if (!eat('}')) fail("expected ',' or '}' in the dict");
          break;
        }
      }
      return v;
    }
    if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++i_;
      v.kind = c == '(' ? Lit::Kind::tuple : Lit::Kind::list;
      bool comma = false;
      while (!eat(close)) {
        v.items.push_back(value(depth + 1));
        comma = eat(',');
        if (!comma) {
          if (!eat(close)) fail(std::string("expected ',' or '") + close + "'");
          break;
        }
      }
      // (x) is not a tuple in Python: a one-element tuple needs its comma.
      if (v.kind == Lit::Kind::tuple && v.items.size() == 1 && !comma) return v.items[0];
      return v;
    }
    if (c == '\'' || c == '"') {
      ++i_;
      v.kind = Lit::Kind::str;
      while (i_ < s_.size() && s_[i_] != c) {
        if (s_[i_] == '\\' || s_[i_] == '\n') fail("escapes and line breaks in strings are not supported");
        v.text.push_back(s_[i_++]);
      }
      if (i_ >= s_.size()) fail("unterminated string");
      ++i_;
      return v;
    }
    if (c == '-' || c == '+' || (c >= '0' && c <= '9')) {
      v.kind = Lit::Kind::integer;
      if (c == '-' || c == '+') v.text.push_back(s_[i_++]);
      const std::size_t start = i_;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') v.text.push_back(s_[i_++]);
      if (i_ == start) fail("a sign without digits");
      if (i_ < s_.size() && (std::isalpha(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.'))
        fail("'" + printable(s_.substr(start, i_ - start + 1)) + "' is not an integer");
      return v;
    }
    if (word("True") || word("False")) {
      v.kind = Lit::Kind::boolean;
      v.flag = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u';  // "True" ends in "ue", "False" in "se"
      return v;
    }
    if (word("None")) return v;
    fail("unexpected text '" + printable(s_.substr(i_, 12)) + "'");
  }

  const std::string& s_;
  std::string where_;
  std::size_t i_ = 0;
};

}  // namespace xg::io::detail
