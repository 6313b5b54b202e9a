#!/usr/bin/env bash
# README command 1: install what is missing, build, run the main job with its defaults:
# `xgrad train` (sort task, >= 99% held-out exact match; writes out/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if (($# == 0)); then set -- train; fi
./build/bin/xgrad "$@"
