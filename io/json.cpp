#include <xgrad/io/detail/json.hpp>

#include <cstdio>
#include <unordered_set>

#include <xgrad/core/error.hpp>

namespace xg::json {

namespace {

// Length of the UTF-8 sequence starting at s[i] (0 when it is not valid there).
std::size_t utf8_length(const std::string& s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  std::size_t n;
  std::uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  const std::uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Parser {
 public:
  explicit Parser(const std::string& t) : t_(t) {}

  Value document() {
    Value v = value(0);
    skip_space();
    if (i_ != t_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  const std::string& t_;
  std::size_t i_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError("JSON at byte " + std::to_string(i_) + ": " + what);
  }
  void skip_space() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    skip_space();
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }

  Value value(int depth) {
    skip_space();
    if (i_ >= t_.size()) fail("unexpected end of text");
    const char c = t_[i_];
    if ((c == '{' || c == '[') && depth >= kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return Value::make_string(string());
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    if (t_.compare(i_, 4, "true") == 0) {
      i_ += 4;
      return Value::make_bool(true);
    }
    if (t_.compare(i_, 5, "false") == 0) {
      i_ += 5;
      return Value::make_bool(false);
    }
    if (t_.compare(i_, 4, "null") == 0) {
      i_ += 4;
      return Value();
    }
    fail("unexpected character");
  }

  Value object(int depth) {
    ++i_;  // '{'
    Value v = Value::make_object();
    if (eat('}')) return v;
    std::unordered_set<std::string> keys;  // duplicate check in O(1) per key: no quadratic header
    do {
      skip_space();
      if (i_ >= t_.size() || t_[i_] != '"') fail("expected a string key");
      std::string key = string();
      if (!keys.insert(key).second) fail("duplicate key \"" + key + "\"");
      expect(':');
      v.set(std::move(key), value(depth + 1));
    } while (eat(','));
    expect('}');
    return v;
  }

  Value array(int depth) {
    ++i_;  // '['
    Value v = Value::make_array();
    if (eat(']')) return v;
    do {
      v.push(value(depth + 1));
    } while (eat(','));
    expect(']');
    return v;
  }

  std::uint32_t hex4() {
    if (i_ + 4 > t_.size()) fail("truncated \\u escape");
    std::uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = t_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= h - '0';
      else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
      else fail("bad hex digit in \\u escape");
    }
    return cp;
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    while (true) {
      if (i_ >= t_.size()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(t_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) fail("control character in a string");
      if (c == '\\') {
        if (++i_ >= t_.size()) fail("unterminated escape");
        const char e = t_[i_++];
        switch (e) {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            std::uint32_t cp = hex4();
            if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
              if (i_ + 2 > t_.size() || t_[i_] != '\\' || t_[i_ + 1] != 'u') fail("lone high surrogate in \\u escape");
              i_ += 2;
              const std::uint32_t lo = hex4();
              if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate in \\u escape");
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            append_utf8(out, cp);
            break;
          }
          default: fail(std::string("unknown escape \\") + e);
        }
        continue;
      }
      const std::size_t n = utf8_length(t_, i_);
      if (n == 0) fail("invalid UTF-8 in a string");
      out.append(t_, i_, n);
      i_ += n;
    }
  }

  Value number() {
    const std::size_t start = i_;
    const auto digit = [&] { return i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9'; };
    if (t_[i_] == '-') ++i_;
    if (!digit()) fail("bad number");
    if (t_[i_] == '0') {
      ++i_;
    } else {
      while (digit()) ++i_;
    }
    if (i_ < t_.size() && t_[i_] == '.') {
      ++i_;
      if (!digit()) fail("bad number: no digit after '.'");
      while (digit()) ++i_;
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      ++i_;
      if (i_ < t_.size() && (t_[i_] == '+' || t_[i_] == '-')) ++i_;
      if (!digit()) fail("bad number: no digit in the exponent");
      while (digit()) ++i_;
    }
    return Value::make_number_text(t_.substr(start, i_ - start));
  }
};

// indent 0: compact; otherwise every item and member on a line of its own, `indent` spaces
// deeper per level (`depth` levels in already).
void dump_to(const Value& v, std::string& out, int indent, int depth) {
  const auto line = [&](int level) {
    if (indent == 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::null: out += "null"; break;
    case Value::Kind::boolean: out += v.str(); break;
    case Value::Kind::number: out += v.str(); break;
    case Value::Kind::string: out += quote(v.str()); break;
    case Value::Kind::array: {
      out += '[';
      bool first = true;
      for (const Value& item : v.items()) {
        if (!first) out += ',';
        first = false;
        line(depth + 1);
        dump_to(item, out, indent, depth + 1);
      }
      if (!first) line(depth);
      out += ']';
      break;
    }
    case Value::Kind::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.members()) {
        if (!first) out += ',';
        first = false;
        line(depth + 1);
        out += quote(key);
        out += indent == 0 ? ":" : ": ";
        dump_to(item, out, indent, depth + 1);
      }
      if (!first) line(depth);
      out += '}';
      break;
    }
  }
}

}  // namespace

Value Value::make_bool(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.bool_ = b;
  v.text_ = b ? "true" : "false";
  return v;
}

Value Value::make_number_text(std::string text) {
  Value v;
  v.kind_ = Kind::number;
  v.text_ = std::move(text);
  return v;
}

Value Value::make_uint(std::uint64_t x) { return make_number_text(std::to_string(x)); }

Value Value::make_string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.text_ = std::move(s);
  return v;
}

Value Value::make_array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::array;
  v.items_ = std::move(items);
  return v;
}

Value Value::make_object(std::vector<std::pair<std::string, Value>> members) {
  Value v;
  v.kind_ = Kind::object;
  v.members_ = std::move(members);
  return v;
}

bool Value::as_uint(std::uint64_t& out) const {
  if (kind_ != Kind::number || text_.empty()) return false;
  std::uint64_t x = 0;
  for (const char c : text_) {
    if (c < '0' || c > '9') return false;  // sign, fraction or exponent
    const std::uint64_t d = static_cast<std::uint64_t>(c - '0');
    if (x > (UINT64_MAX - d) / 10) return false;
    x = x * 10 + d;
  }
  out = x;
  return true;
}

const Value* Value::find(const std::string& key) const {
  for (const auto& m : members_)
    if (m.first == key) return &m.second;
  return nullptr;
}

Value Value::make_text(const std::string& s) {
  if (valid_utf8(s)) return make_string(s);
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_length(s, i);
    out += n > 0 ? s.substr(i, n) : std::string("\xEF\xBF\xBD");
    i += n > 0 ? n : 1;
  }
  return make_string(out);
}

std::string Value::dump(int indent) const {
  std::string out;
  dump_to(*this, out, indent < 0 ? 0 : indent, 0);
  return out;
}

void check_limits(const std::string& text) {
  if (text.size() > kMaxBytes)
    throw FormatError("JSON of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                      std::to_string(kMaxBytes) + " bytes");
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        throw FormatError("JSON at byte " + std::to_string(i) + ": nesting deeper than " + std::to_string(kMaxDepth));
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
}

Value parse(const std::string& text) {
  if (text.size() > kMaxBytes)
    throw FormatError("JSON of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                      std::to_string(kMaxBytes) + " bytes");
  return Parser(text).document();
}

bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string quote(const std::string& s) {
  if (!valid_utf8(s)) throw FormatError("JSON: string is not valid UTF-8");
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace xg::json
