// How error messages show values: shown_value cuts and escapes (one helper for every message
// that quotes input), number_text prints the shortest text that reads back.
#include <cstdlib>
#include <limits>
#include <string>

#include "tests/support/helpers.hpp"
#include <xgrad/core/error.hpp>

using namespace xg;

TEST_CASE("shown_value: a long value is cut to the limit with its size and control bytes are escaped", "[core][error]") {
  CHECK(shown_value("d_model") == "d_model");
  const std::string big(1000000, 'x');
  const std::string shown = shown_value(big);
  CHECK(shown == std::string(kShownBytes, 'x') + "... (1000000 bytes)");
  CHECK(shown_value(std::string(kShownBytes, 'y')) == std::string(kShownBytes, 'y'));  // exactly the limit: whole
  CHECK(shown_value(std::string("d\0model", 7)) == "d\\x00model");  // a NUL does not end the message
  CHECK(shown_value("a\nb\xff") == "a\\x0ab\\xff");
  CHECK(shown_value("abcdef", 3) == "abc... (6 bytes)");
}

TEST_CASE("number_text: the shortest text that reads back to the same double", "[core][error]") {
  CHECK(number_text(0.1) == "0.1");
  CHECK(number_text(1.0000001) == "1.0000001");
  CHECK(number_text(1e-5) == "1e-05");
  CHECK(number_text(0.1 + 0.2) == "0.30000000000000004");  // needs all 17 digits
  CHECK(number_text(3) == "3");
  CHECK(number_text(500) == "500");  // not 5e+02
  CHECK(number_text(10000) == "10000");
  CHECK(number_text(1e15) == "1e+15");
  CHECK(number_text(123456789.123) == "123456789.123");
  CHECK(number_text(std::numeric_limits<double>::infinity()) == "inf");
  for (double v : {0.1, 0.3, 1.0 / 3, 2.5e-300, 123456789.123, 0.0030000000000000001, 5e-3})
    CHECK(std::strtod(number_text(v).c_str(), nullptr) == v);
}
