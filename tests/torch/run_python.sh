#!/usr/bin/env bash
# Runs a torch-only Python check with the torch interpreter (tests/support/torch_env.sh):
# exit 77 (skipped) without torch, or a failure when XGRAD_REQUIRE_TORCH=1.
# Usage: run_python.sh SCRIPT [ARGS...]
set -uo pipefail
source "$(dirname "$0")/../support/torch_env.sh"
torch_run "$@"
