#!/usr/bin/env bash
# xgrad's SentencePiece tokenizers against Python's sentencepiece (sentencepiece_check.py).
# Exit code 77 = skipped (no python3-sentencepiece, or xgrad built without SentencePiece);
# XGRAD_REQUIRE_TORCH=1 makes that a failure (CI, which installs every cross-check's package).
# Usage: run_sentencepiece.sh path/to/xgrad path/to/sentencepiece_check.py WORKDIR
set -uo pipefail

if (($# != 3)); then
  echo "usage: $0 XGRAD SENTENCEPIECE_CHECK_PY WORKDIR" >&2
  exit 2
fi
source "$(dirname "$0")/../support/torch_env.sh"
"$torch_python" "$2" "$1" "$3"
rc=$?
((rc == 77)) && torch_skip "the SentencePiece cross-check cannot run (see above)"
exit "$rc"
