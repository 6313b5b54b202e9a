#!/usr/bin/env bash
# Runs the PyTorch cross-check: dump xgrad's results to a temporary JSON file, then compare
# them in torch with Debian's interpreter. Exit code 77 = skipped (ctest SKIP_RETURN_CODE).
# Usage: run_crosscheck.sh path/to/dump_attention path/to/crosscheck.py
# Environment:
#   XGRAD_TORCH_PYTHON  interpreter (default /usr/bin/python3, where Debian's python3-torch
#                       lives; the first python3 on PATH may be another one without torch)
#   XGRAD_REQUIRE_TORCH=1  a missing torch is a failure, not a skip (for CI, which installs it)
set -uo pipefail

if (($# != 2)); then
  echo "usage: $0 DUMP_ATTENTION CROSSCHECK_PY" >&2
  exit 2
fi
dump=$1
script=$2
python=${XGRAD_TORCH_PYTHON:-/usr/bin/python3}
require=${XGRAD_REQUIRE_TORCH:-0}

skip() {
  echo "SKIPPED: $1"
  if [[ $require == 1 ]]; then
    echo "FAILED: XGRAD_REQUIRE_TORCH=1 but the cross-check cannot run"
    exit 1
  fi
  exit 77
}

[[ -x $python ]] || skip "$python not found (apt-get install python3 python3-torch)"

tmp=$(mktemp "${TMPDIR:-/tmp}/xgrad_torch_XXXXXX.json") || exit 1
trap 'rm -f "$tmp"' EXIT

"$dump" "$tmp" || { echo "FAILED: $dump exited with status $?"; exit 1; }
"$python" "$script" "$tmp"
rc=$?
if ((rc == 77)); then
  [[ $require == 1 ]] && { echo "FAILED: XGRAD_REQUIRE_TORCH=1 but torch is missing"; exit 1; }
  exit 77
fi
exit "$rc"
