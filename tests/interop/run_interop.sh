#!/usr/bin/env bash
# Checkpoint interop with PyTorch: train small decoder-only checkpoints with the xgrad
# program, dump xgrad's logits for fixed token batches, then read each checkpoint in Python
# with a plain safetensors reader, load it into an equivalent PyTorch model and compare the
# logits (reader_torch.py). Exit code 77 = skipped (ctest SKIP_RETURN_CODE).
# Usage: run_interop.sh path/to/xgrad path/to/dump_logits path/to/reader_torch.py
# Interpreter and skip policy: tests/support/torch_env.sh.
set -uo pipefail

if (($# != 3)); then
  echo "usage: $0 XGRAD DUMP_LOGITS READER_TORCH_PY" >&2
  exit 2
fi
xgrad=$1
dump=$2
script=$3
source "$(dirname "$0")/../support/torch_env.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/xgrad_interop_XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
export OPENBLAS_NUM_THREADS=1

# A small text for the charlm configuration (no dependence on files outside the test).
for i in $(seq 1 40); do
  echo "The quick brown fox $i jumps over the lazy dog; pack my box with five dozen liquor jugs."
done >"$tmp/text.txt"

# name | xgrad train options. Each covers a different attention layout:
#   gqa: H_q 4, H_kv 2 (query heads 0,1 read kv head 0; 2,3 read kv head 1)
#   mha: H_q = H_kv = 2 (--kv-heads 0), one layer, d_ff not 4 d_model
#   mqa: H_q 4, H_kv 1, three layers, character LM (larger vocabulary, context 24)
configs=(
  "gqa|--task sort --steps 40 --d-model 32 --heads 4 --kv-heads 2 --layers 2"
  "mha|--task sort --steps 40 --d-model 24 --heads 2 --kv-heads 0 --layers 1 --d-ff 40 --digits 5"
  "mqa|--task charlm --text $tmp/text.txt --context 24 --steps 30 --d-model 32 --heads 4 --kv-heads 1 --layers 3"
)
# A short warmup, so that 30-40 steps move the weights well away from their initial values
# (biases, layer-norm gains, embeddings): a checkpoint close to its initialisation would let
# some import mistakes hide below the tolerance.
common=(--warmup 5 --no-plot --no-progress --threads 1)

pairs=()
for entry in "${configs[@]}"; do
  name=${entry%%|*}
  opts=${entry#*|}
  out="$tmp/$name"
  # shellcheck disable=SC2086  # opts is a word list on purpose
  if ! "$xgrad" train $opts "${common[@]}" --out "$out" >"$tmp/$name.log" 2>&1; then
    cat "$tmp/$name.log"
    echo "FAILED: xgrad train ($name: $opts) exited with an error"
    exit 1
  fi
  echo "trained $name: $opts"
  [[ -f $out/model.safetensors ]] || { echo "FAILED: $out/model.safetensors was not written"; exit 1; }
  # xgrad's logits for the float32 checkpoint, and a float64 copy of it (see dump_logits.cpp)
  # whose logits are dumped in a second run, which also reads the copy back with load_model.
  mkdir -p "$tmp/$name-f64" || exit 1
  "$dump" --float64-copy "$tmp/$name-f64/model.safetensors" "$out/model.safetensors" "$tmp/$name.json" ||
    { echo "FAILED: $dump exited with status $?"; exit 1; }
  "$dump" "$tmp/$name-f64/model.safetensors" "$tmp/$name-f64.json" ||
    { echo "FAILED: $dump exited with status $?"; exit 1; }
  pairs+=("$out/model.safetensors" "$tmp/$name.json" "$tmp/$name-f64/model.safetensors" "$tmp/$name-f64.json")
done

# Every other safetensors file the runs wrote (optimizer state) must also read cleanly.
extra=()
for f in "$tmp"/*/train_state.safetensors; do
  [[ -f $f ]] && extra+=(--also-read "$f")
done

torch_run "$script" ${extra[@]+"${extra[@]}"} "${pairs[@]}"
