// The suite's own rule for test names: Catch2 splits a test spec on ',' (one name becomes two
// filters that match nothing) and ctest splits lists on ';', so no test name may hold either.
// Checked over every registered case, those written with TEST_CASE and those registered at run
// time (the builtin gradient checks, tests/checks/test_builtin_checks.cpp).
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <vector>

TEST_CASE("test names: no Catch test name holds a comma or a semicolon", "[suite][test_names]") {
  std::size_t offending = 0;
  std::string names;
  for (const Catch::TestCase& tc : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) {
    if (tc.name.find_first_of(",;") == std::string::npos) continue;
    ++offending;
    names += "\n  \"" + tc.name + "\" (" + tc.lineInfo.file + ":" + std::to_string(tc.lineInfo.line) + ")";
  }
  INFO(offending << " test name(s) hold a ',' or a ';' (Catch2 and ctest split names on them):" << names);
  CHECK(offending == 0);
}
