#!/usr/bin/env bash
# README command 1: install what is missing, build, run the main job with its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/bin/xgrad "$@"
