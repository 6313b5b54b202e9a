# Sourced by the PyTorch test runners (tests/torch, tests/interop): which interpreter to use
# and what a missing torch means. Exit code 77 = skipped (ctest SKIP_RETURN_CODE).
# Environment:
#   XGRAD_TORCH_PYTHON  interpreter (default /usr/bin/python3, where Debian's python3-torch
#                       lives; the first python3 on PATH may be another one without torch)
#   XGRAD_REQUIRE_TORCH=1  a missing torch is a failure, not a skip (for CI, which installs it)
torch_python=${XGRAD_TORCH_PYTHON:-/usr/bin/python3}
torch_required=${XGRAD_REQUIRE_TORCH:-0}

# Skip (77), or fail when torch is required.
torch_skip() {
  echo "SKIPPED: $1"
  if [[ $torch_required == 1 ]]; then
    echo "FAILED: XGRAD_REQUIRE_TORCH=1 but the test cannot run"
    exit 1
  fi
  exit 77
}

[[ -x $torch_python ]] || torch_skip "$torch_python not found (apt-get install python3 python3-torch)"

# Runs a Python script with the torch interpreter and exits with its status (77 from the
# script means torch is not importable: a skip, or a failure when torch is required).
torch_run() {
  "$torch_python" "$@"
  local rc=$?
  ((rc == 77)) && torch_skip "torch is not importable by $torch_python"
  exit "$rc"
}
