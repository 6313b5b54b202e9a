#!/usr/bin/env bash
# safetensors F16/BF16 from torch: torch_checkpoints.py half writes every float16 and bfloat16
# bit pattern with tools/xgrad_torch.py's writer, next to torch's float32 conversion, and
# half_check loads the file with nn::safetensors and compares bit for bit.
# Exit code 77 = skipped (no torch). Usage: run_half.sh path/to/half_check path/to/torch_checkpoints.py
set -uo pipefail
if (($# != 2)); then
  echo "usage: $0 HALF_CHECK TORCH_CHECKPOINTS_PY" >&2
  exit 2
fi
check=$1
script=$2
source "$(dirname "$0")/../support/torch_env.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xgrad_half_XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
"$torch_python" "$script" half "$tmp/half.safetensors"
rc=$?
((rc == 77)) && torch_skip "torch is not importable by $torch_python"
((rc == 0)) || { echo "FAILED: torch_checkpoints.py half exited with status $rc"; exit 1; }
"$check" "$tmp/half.safetensors"
