#!/usr/bin/env bash
# README command 1: install what is missing, build the xgrad program alone (not the tests,
# examples or benchmarks: scripts/test.sh builds those), run the main job with its defaults:
# `xgrad train` (sort task, >= 99% held-out exact match; writes out/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh xgrad_cli
if (($# == 0)); then set -- train; fi
./build/bin/xgrad "$@"
