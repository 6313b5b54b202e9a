#!/usr/bin/env bash
# docs/from-pytorch.md's "other torch models" path: torch_mha_npz.py saves nn.MultiheadAttention
# states with np.savez, npy_interop mha imports them into nn::CrossAttention and compares the
# output with torch's. Exit 77 = skipped (no torch). Usage: run_mha_npz.sh NPY_INTEROP SCRIPT
set -uo pipefail
if (($# != 2)); then
  echo "usage: $0 NPY_INTEROP TORCH_MHA_NPZ_PY" >&2
  exit 2
fi
source "$(dirname "$0")/../support/torch_env.sh"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/xgrad_mha_npz_XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
"$torch_python" "$2" "$tmp"
rc=$?
((rc == 77)) && torch_skip "torch or numpy is not importable by $torch_python"
((rc == 0)) || { echo "FAILED: torch_mha_npz.py exited with status $rc"; exit 1; }
"$1" mha "$tmp"
