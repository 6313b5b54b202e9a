// The limits of every JSON reader (docs/reliability.md): io's own reader and check_limits, which
// guards the nlohmann reader, refuse deeper nesting and longer text with a FormatError instead
// of recursing until the stack runs out.
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/json.hpp>

using namespace xg;

namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<std::size_t>(depth), open) + std::string(static_cast<std::size_t>(depth), close);
}

}  // namespace

TEST_CASE("json limits: nesting up to kMaxDepth reads and one level more is a FormatError", "[io][json]") {
  CHECK_NOTHROW(json::parse(nested(json::kMaxDepth)));
  CHECK_NOTHROW(json::check_limits(nested(json::kMaxDepth)));
  CHECK_THROWS_WITH(json::parse(nested(json::kMaxDepth + 1)), Catch::Contains("nesting deeper than 64"));
  CHECK_THROWS_WITH(json::check_limits(nested(json::kMaxDepth + 1)), Catch::Contains("nesting deeper than 64"));
  // A million levels: refused at once, no recursion.
  CHECK_THROWS_AS(json::check_limits(nested(1000000)), FormatError);
  CHECK_THROWS_AS(json::parse(nested(1000000)), FormatError);
  // Brackets inside strings are text, not nesting.
  const std::string in_string = "[\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"]";
  CHECK_NOTHROW(json::check_limits(in_string));
  CHECK_NOTHROW(json::parse(in_string));
  // Objects count as arrays do.
  std::string objects;
  for (int i = 0; i <= json::kMaxDepth; ++i) objects += "{\"a\":";
  objects += "1" + std::string(static_cast<std::size_t>(json::kMaxDepth + 1), '}');
  CHECK_THROWS_AS(json::check_limits(objects), FormatError);
  CHECK_THROWS_AS(json::parse(objects), FormatError);
}

TEST_CASE("json limits: text longer than kMaxBytes is refused before parsing", "[io][json]") {
  const std::string big = "\"" + std::string(json::kMaxBytes, 'a') + "\"";
  CHECK_THROWS_WITH(json::check_limits(big), Catch::Contains("exceeds the limit of 104857600 bytes"));
  CHECK_THROWS_WITH(json::parse(big), Catch::Contains("exceeds the limit"));
}
