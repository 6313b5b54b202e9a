#!/usr/bin/env bash
# .npy/.npz interop with NumPy (io/npy.hpp): NumPy writes files (npy_numpy.py write), xgrad
# reads them and refuses the unsupported ones with the right FormatError (npy_interop check);
# xgrad writes files (npy_interop write) and NumPy reads them back (npy_numpy.py verify).
# Exit code 77 = skipped (no NumPy); XGRAD_REQUIRE_TORCH=1 makes that a failure (CI).
# Usage: run_npy.sh path/to/npy_interop path/to/npy_numpy.py
set -uo pipefail

if (($# != 2)); then
  echo "usage: $0 NPY_INTEROP NPY_NUMPY_PY" >&2
  exit 2
fi
prog=$1
script=$2
source "$(dirname "$0")/../support/torch_env.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/xgrad_npy_XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

"$torch_python" "$script" write "$tmp/numpy"
rc=$?
((rc == 77)) && torch_skip "numpy is not importable by $torch_python"
((rc == 0)) || { echo "FAILED: npy_numpy.py write exited with status $rc"; exit 1; }
"$prog" check "$tmp/numpy" || { echo "FAILED: npy_interop check"; exit 1; }
mkdir -p "$tmp/xgrad" && "$prog" write "$tmp/xgrad" || { echo "FAILED: npy_interop write"; exit 1; }
"$torch_python" "$script" verify "$tmp/xgrad" || { echo "FAILED: npy_numpy.py verify"; exit 1; }
echo "npy interop: all checks passed"
