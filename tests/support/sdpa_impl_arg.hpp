// The command line of the tests/torch dump programs: OUT.json and an optional attention
// implementation (automatic, the default, fused or composed), which run_crosscheck.sh passes.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>

#include <xgrad/nn/sdpa.hpp>

namespace xgt {

// Reads argv[2] into `impl`. On a wrong argument count or an unknown implementation it prints
// one line naming `program` to stderr and returns false (the caller exits with status 2).
inline bool parse_dump_args(int argc, char** argv, const char* program, xg::nn::SdpaImpl& impl) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s OUT.json [automatic|fused|composed]\n", program);
    return false;
  }
  const std::string name = argc == 3 ? argv[2] : "automatic";
  if (name == "fused")
    impl = xg::nn::SdpaImpl::fused;
  else if (name == "composed")
    impl = xg::nn::SdpaImpl::composed;
  else if (name == "automatic")
    impl = xg::nn::SdpaImpl::automatic;
  else {
    std::fprintf(stderr, "%s: implementation must be automatic, fused or composed, got '%s'\n", program,
                 name.c_str());
    return false;
  }
  return true;
}

// Throws std::runtime_error naming `what` unless the attention path that ran (SdpaResult::path,
// AttentionOutput::path) is the one the command line asked for (any path for automatic): a layer
// that dropped its config's impl makes the dump fail instead of checking the other path twice.
inline void require_path(xg::nn::SdpaImpl requested, xg::nn::SdpaImpl ran, const std::string& what) {
  if (requested == xg::nn::SdpaImpl::automatic || ran == requested) return;
  const auto name = [](xg::nn::SdpaImpl i) { return i == xg::nn::SdpaImpl::fused ? "fused" : "composed"; };
  throw std::runtime_error(what + ": asked for the " + name(requested) + " attention path, the " + name(ran) +
                           " path ran");
}

}  // namespace xgt
