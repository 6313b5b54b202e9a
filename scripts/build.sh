#!/usr/bin/env bash
# Configures and builds everything (library, programs, tests) into build/, Release.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
