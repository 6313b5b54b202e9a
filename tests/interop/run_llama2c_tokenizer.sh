#!/usr/bin/env bash
# xgrad's llama2.c tokenizer against run.c's rule and Python's sentencepiece
# (llama2c_tokenizer_check.py). Exit code 77 = skipped (no python3-sentencepiece);
# XGRAD_REQUIRE_TORCH=1 makes that a failure (CI, which installs every cross-check's package).
# Usage: run_llama2c_tokenizer.sh path/to/xgrad path/to/llama2c_tokenizer_check.py WORKDIR
# (also runs tokenizer_export_check.py, the same way)
set -uo pipefail

if (($# != 3)); then
  echo "usage: $0 XGRAD LLAMA2C_TOKENIZER_CHECK_PY WORKDIR" >&2
  exit 2
fi
source "$(dirname "$0")/../support/torch_env.sh"
"$torch_python" "$2" "$1" "$3"
rc=$?
((rc == 77)) && torch_skip "the llama2.c tokenizer cross-check cannot run (see above)"
exit "$rc"
