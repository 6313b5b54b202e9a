#!/usr/bin/env bash
# Runs `xgrad train` with its defaults (the README's main job) and checks what it promises:
# the RESULT line with held-out exact match >= 0.99 on stdout, the live progress on stderr
# only (so `xgrad train > log` keeps a clean record), and the output files; then that the
# checkpoint generates, inspects, and draws an attention map.
set -euo pipefail
xgrad=$1
out=$2
rm -rf "$out" "$out.progress"
log=$("$xgrad" train --out "$out" 2>"$out.progress")
echo "$log"
result=$(echo "$log" | awk '/^RESULT heldout_exact_match/ {print $3}')
[[ -n $result ]] || { echo "FAILED: no RESULT line"; exit 1; }
awk -v r="$result" 'BEGIN { exit !(r >= 0.99) }' || { echo "FAILED: held-out exact match $result < 0.99"; exit 1; }
if echo "$log" | grep -q "ETA"; then echo "FAILED: progress lines on stdout"; exit 1; fi
grep -q "^step 1000/1000 | loss" "$out.progress" || { echo "FAILED: no progress on stderr"; exit 1; }
echo "$result" > "$out/heldout_result"  # tests/distributed compares the 2-rank run with it
for f in model.safetensors train_state.safetensors log.csv loss.png loss.gp; do
  [[ -s $out/$f ]] || { echo "FAILED: $out/$f missing"; exit 1; }
done
"$xgrad" inspect "$out/model.safetensors" | grep -q "KV cache" || { echo "FAILED: inspect"; exit 1; }
cached=$("$xgrad" generate --checkpoint "$out/model.safetensors" --prompt "95173062|" --max-new 8 \
  --attention-map "$out/attention.png" --layer 1 --head 0)
plain=$("$xgrad" generate --checkpoint "$out/model.safetensors" --prompt "95173062|" --max-new 8 --no-kv-cache)
echo "$cached"
[[ $(echo "$cached" | head -1) == "$plain" ]] || { echo "FAILED: KV cache and recompute disagree"; exit 1; }
[[ $(echo "$cached" | head -1) == "95173062|01235679" ]] || { echo "FAILED: wrong sort"; exit 1; }
[[ -s $out/attention.png && -s $out/attention.gp ]] || { echo "FAILED: no attention map"; exit 1; }
echo "main job OK: held-out exact match $result"
