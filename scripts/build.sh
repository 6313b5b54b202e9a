#!/usr/bin/env bash
# Configures build/ (Release) and builds the given targets, or everything (library, programs,
# tests, examples, benchmarks) when none are given.
# Usage: scripts/build.sh [TARGET...]      e.g. scripts/build.sh xgrad_cli
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
# A compiler cache speeds rebuilds when one is installed (never needed).
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}"
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
