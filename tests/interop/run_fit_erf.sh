#!/usr/bin/env bash
# The coefficients of xgrad's float32 erf (core/vmath.cpp, kErfC) are the ones tools/fit_erf.py
# fits: the fit is run again and each interval's polynomial compared with the source's (within
# 0.001 ulp of erf: the fit's digits depend on the CPU's LAPACK kernels, its polynomials do not),
# and the source's table evaluated through the kernel's float32 arithmetic (within 1.08 ulp),
# every 4099th float32 of [0, 4.5] (tools/fit_erf.py's docstring says why).
# Exit code 77 = skipped (no NumPy); XGRAD_REQUIRE_TORCH=1 makes that a failure (CI).
# Usage: run_fit_erf.sh path/to/tools/fit_erf.py path/to/core/vmath.cpp
set -uo pipefail

if (($# != 2)); then
  echo "usage: $0 FIT_ERF_PY VMATH_CPP" >&2
  exit 2
fi
source "$(dirname "$0")/../support/torch_env.sh"

"$torch_python" -c "import numpy" 2>/dev/null || torch_skip "numpy is not importable by $torch_python"
"$torch_python" "$1" --stride 4099 --check "$2"
