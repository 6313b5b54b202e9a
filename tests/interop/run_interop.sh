#!/usr/bin/env bash
# Checkpoint interop with PyTorch through tools/xgrad_torch.py: train small checkpoints
# (decoder-only and encoder-decoder) with the xgrad program, dump xgrad's logits for fixed
# token batches, load each checkpoint in torch with the tool and compare the logits
# (torch_checkpoints.py compare); then the way back: the tool saves every checkpoint again,
# unchanged and after one training step in torch, xgrad computes the logits of those files
# (dump_logits, xgrad inspect, xgrad generate) and they must match (torch_checkpoints.py
# roundtrip). Exit code 77 = skipped (ctest SKIP_RETURN_CODE).
# Usage: run_interop.sh path/to/xgrad path/to/dump_logits path/to/torch_checkpoints.py
# Interpreter and skip policy: tests/support/torch_env.sh.
set -uo pipefail

if (($# != 3)); then
  echo "usage: $0 XGRAD DUMP_LOGITS TORCH_CHECKPOINTS_PY" >&2
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
for i in $(seq 1 200); do  # 18 KB: --task charlm (the text task) splits it into documents
  echo "The quick brown fox $i jumps over the lazy dog; pack my box with five dozen liquor jugs."
done >"$tmp/text.txt"

# name | xgrad train options. Each covers a different attention layout:
#   gqa: H_q 4, H_kv 2 (query heads 0,1 read kv head 0; 2,3 read kv head 1)
#   mha: H_q = H_kv = 2 (--kv-heads 0), one layer, d_ff not 4 d_model
#   mqa: H_q 4, H_kv 1, three layers, character LM (larger vocabulary, context 24)
#   rev-gqa: encoder-decoder (reverse task), H_q 4, H_kv 2, two encoder and two decoder layers
#   rev-mqa: encoder-decoder, H_q 2, H_kv 1, one layer each, d_ff not 4 d_model
#   nobias: decoder-only without biases (--no-bias: no b_QKV, b_O, fc biases or betas)
configs=(
  "gqa|--task sort --steps 40 --d-model 32 --heads 4 --kv-heads 2 --layers 2"
  "mha|--task sort --steps 40 --d-model 24 --heads 2 --kv-heads 0 --layers 1 --d-ff 40 --n-digits 5"
  "mqa|--task charlm --text $tmp/text.txt --context 24 --steps 30 --d-model 32 --heads 4 --kv-heads 1 --layers 3"
  "rev-gqa|--task reverse --steps 40 --d-model 32 --heads 4 --kv-heads 2 --layers 2"
  "rev-mqa|--task reverse --steps 40 --d-model 16 --heads 2 --kv-heads 1 --layers 1 --d-ff 24"
  "nobias|--task sort --steps 40 --d-model 32 --heads 4 --kv-heads 2 --layers 2 --no-bias"
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

rt="$tmp/roundtrip"
mkdir -p "$rt" || exit 1
"$torch_python" "$script" compare --out "$rt" ${extra[@]+"${extra[@]}"} "${pairs[@]}"
rc=$?
((rc == 77)) && torch_skip "torch is not importable by $torch_python"
((rc == 0)) || { echo "FAILED: torch_checkpoints.py compare"; exit 1; }

# The way back: xgrad reads what save_checkpoint wrote (DIR/NAME/model.safetensors ->
# DIR/NAME.xgrad.json); `xgrad inspect` loads the tuned and the built-in-torch ones.
for f in "$rt"/*/model.safetensors; do
  d=$(dirname "$f")
  "$dump" "$f" "$d.xgrad.json" >/dev/null || { echo "FAILED: dump_logits on $f"; exit 1; }
  if [[ $d == *-tuned ]]; then
    "$xgrad" inspect "$f" >"$d.inspect" 2>&1 || { cat "$d.inspect"; echo "FAILED: xgrad inspect $f"; exit 1; }
  fi
done
# xgrad generate gives the same text from a checkpoint and from its torch round trip (the
# float32 checkpoint of config k is pair 2k, so its round trip is case<2k>-rt).
k=0
for entry in "${configs[@]}"; do
  name=${entry%%|*}
  case $name in
    gqa | nobias) prompt="95173062|" ;;
    mqa) prompt="The qu" ;;
    rev-gqa) prompt=31415 ;;
    *) prompt="" ;;
  esac
  if [[ -n $prompt ]]; then
    # The text (stdout) is compared; stderr (the tok/s line, or a failure) is shown on failure.
    a=$("$xgrad" generate --checkpoint "$tmp/$name/model.safetensors" --prompt "$prompt" --max-new 6 2>"$tmp/gen.err") ||
      { echo "$a"; cat "$tmp/gen.err"; echo "FAILED: xgrad generate on $name"; exit 1; }
    b=$("$xgrad" generate --checkpoint "$rt/case$((2 * k))-rt/model.safetensors" --prompt "$prompt" --max-new 6 2>"$tmp/gen.err") ||
      { echo "$b"; cat "$tmp/gen.err"; echo "FAILED: xgrad generate on the round trip of $name"; exit 1; }
    [[ $a == "$b" ]] || { echo "FAILED: $name generates '$a', its torch round trip '$b'"; exit 1; }
    echo "ok    xgrad generate: $name and its torch round trip both give '$a'"
  fi
  k=$((k + 1))
done
torch_run "$script" roundtrip "$rt"
