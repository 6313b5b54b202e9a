#!/usr/bin/env bash
# Runs the PyTorch cross-check: dump xgrad's results to a temporary JSON file, then compare
# them in torch with Debian's interpreter. Exit code 77 = skipped (ctest SKIP_RETURN_CODE).
# Usage: run_crosscheck.sh path/to/dump_attention path/to/crosscheck.py [automatic|fused|composed]
# Interpreter and skip policy: tests/support/torch_env.sh.
set -uo pipefail

if (($# != 2 && $# != 3)); then
  echo "usage: $0 DUMP_ATTENTION CROSSCHECK_PY [automatic|fused|composed]" >&2
  exit 2
fi
dump=$1
script=$2
impl=${3:-automatic}
source "$(dirname "$0")/../support/torch_env.sh"

tmp=$(mktemp "${TMPDIR:-/tmp}/xgrad_torch_XXXXXX.json") || exit 1
trap 'rm -f "$tmp"' EXIT

"$dump" "$tmp" "$impl" || { echo "FAILED: $dump exited with status $?"; exit 1; }
torch_run "$script" "$tmp"
