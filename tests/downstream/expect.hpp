// The downstream consumers' one-line checks: "ok   what" or "FAIL what", counted in failures.
#pragma once

#include <iostream>
#include <string>

namespace consumer {

inline int failures = 0;

inline void expect(bool ok, const std::string& what) {
  std::cout << (ok ? "ok   " : "FAIL ") << what << "\n";
  if (!ok) ++failures;
}

}  // namespace consumer
