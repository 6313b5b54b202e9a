#!/usr/bin/env bash
# Runs the float64 tests once more under a second OpenBLAS kernel, to show early where a test
# depends on how one BLAS kernel rounds (docs/reliability.md, "Bits and tolerances"). The suite's
# C++ cases (float64 by default; the MPI cases are left to the main run) and the gradient-check
# suite run with OPENBLAS_CORETYPE=Sandybridge, a kernel every AVX machine has, set for this
# step only. Needs the Release build (scripts/build.sh).
# Usage: scripts/test_blas_kernel.sh [CORETYPE]
set -euo pipefail
cd "$(dirname "$0")/../build"
core=${1:-Sandybridge}
echo "blas kernel: OPENBLAS_CORETYPE=$core"
OPENBLAS_CORETYPE=$core ./bin/xgrad --version --verbose 2>/dev/null | grep -i openblas || true
OPENBLAS_CORETYPE=$core ./bin/xgrad_tests "~[distributed]"
OPENBLAS_CORETYPE=$core ./bin/xgrad gradcheck
