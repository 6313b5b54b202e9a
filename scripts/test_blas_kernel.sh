#!/usr/bin/env bash
# Runs the float64 tests once more under a second OpenBLAS kernel, to show early where a test
# depends on how one BLAS kernel rounds (docs/reliability.md, "Bits and tolerances"). The suite's
# C++ cases (float64 by default; the MPI cases are left to the main run) and the gradient-check
# suite run with OPENBLAS_CORETYPE=Sandybridge, a kernel every AVX machine has, and with float64
# products forced onto OpenBLAS (XGRAD_FLOAT64_GEMM=openblas: where OpenBLAS's own core is
# generic, the main run uses xgrad's float64 kernel), both set for this step only. Needs the
# Release build (scripts/build.sh).
# Usage: scripts/test_blas_kernel.sh [CORETYPE]
set -euo pipefail
cd "$(dirname "$0")/../build"
core=${1:-Sandybridge}
echo "blas kernel: OPENBLAS_CORETYPE=$core"
export OPENBLAS_CORETYPE=$core XGRAD_FLOAT64_GEMM=openblas
./bin/xgrad --version --verbose
./bin/xgrad_tests "~[distributed]"
./bin/xgrad gradcheck
