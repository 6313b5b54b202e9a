// One home per gradient check: every check that `xgrad gradcheck` runs (checks/, registered by
// checks::register_builtin_checks) is also a Catch2 test case here, made by this adapter rather
// than written again. Each case is named "builtin check: <check name>", tagged [builtin] and
// with the check's group ("[ops]", "[attention]", "[layers]", ...), and runs its check in
// float64 and in float32 with the suite's seed and tolerances (docs/gradcheck.md), so
// `xgrad_tests "[ops]"` runs the op gradient checks and ctest lists each one by name.
//
// The cases are registered at run time, before the session starts (tests/support/catch_main.cpp
// calls register_builtin_check_cases), from the same registry the command uses.
#include <algorithm>
#include <cctype>
#include <exception>
#include <limits>
#include <string>

#include <xgrad/checks/builtin.hpp>
#include <xgrad/checks/suite.hpp>

#include "tests/support/helpers.hpp"

using namespace xg;

namespace {

const GradcheckSuite& builtin_suite() {
  static const GradcheckSuite suite = [] {
    GradcheckSuite s;
    checks::register_builtin_checks(s);
    return s;
  }();
  return suite;
}

// The check's verdict in one precision, as `xgrad gradcheck` computes it (run_suite's body:
// a fresh tape and a context seeded from the run's seed and the check's name).
CheckResult run_one(const Check& c, DType dtype) {
  Tape tape;
  CheckContext ctx(dtype, RunOptions{}.seed, false, c.name);
  return c.run(ctx);
}

struct BuiltinCheckCase : Catch::ITestInvoker {
  explicit BuiltinCheckCase(std::size_t i) : index(i) {}
  std::size_t index;
  void invoke() const override {
    const Check& c = builtin_suite().checks().at(index);
    for (DType dtype : {DType::float64, DType::float32}) {
      INFO(c.name << " (" << c.kind << ": " << c.config << ") in " << dtype_name(dtype));
      CheckResult r;
      REQUIRE_NOTHROW(r = run_one(c, dtype));
      INFO("max abs error " << r.max_abs_error << ", worst " << r.worst << ", mode " << r.mode << "\n" << r.message);
      CHECK(r.passed);
      CHECK(r.comparisons > 0);
    }
  }
};

// "[ops]" from "ops/softmax"; characters Catch2 or ctest treat specially become '-'.
std::string group_tag(const std::string& name) {
  std::string g = name.substr(0, name.find('/'));
  for (char& ch : g)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_') ch = '-';
  return "[" + g + "]";
}

}  // namespace

namespace xgt {

void register_builtin_check_cases() {
  const auto& checks = builtin_suite().checks();
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const std::string name = "builtin check: " + checks[i].name;
    const std::string tags = "[checks][builtin]" + group_tag(checks[i].name);
    Catch::AutoReg(new BuiltinCheckCase(i), Catch::SourceLineInfo(__FILE__, static_cast<std::size_t>(__LINE__)),
                   Catch::StringRef(), Catch::NameAndTags{Catch::StringRef(name), Catch::StringRef(tags)});
  }
}

}  // namespace xgt

// The adapter itself: one case per registered check, each name unique and free of the
// characters Catch2 and ctest split names on, and the set as large as the command's.
TEST_CASE("builtin check cases: one per registered check with usable names", "[checks][builtin-adapter]") {
  const auto& checks = builtin_suite().checks();
  CHECK(checks.size() >= 40);
  std::vector<std::string> names;
  for (const Catch::TestCase& tc : Catch::getAllTestCasesSorted(*Catch::getCurrentContext().getConfig()))
    if (tc.name.rfind("builtin check: ", 0) == 0) names.push_back(tc.name.substr(15));
  std::vector<std::string> want;
  for (const Check& c : checks) want.push_back(c.name);
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  CHECK(names == want);
  for (const std::string& n : want) CHECK(n.find_first_of(",;") == std::string::npos);
}
