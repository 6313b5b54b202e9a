#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer + UBSan) in build-san/, the build
# scripts/sanitize.sh runs the test suite in (scripts/sanitize_config.sh), and runs each for
# SECONDS (default 60), as many at once as there are cores, from the seed corpus in tests/fuzz/corpus/. New inputs go to
# build-san/corpus/ (not the repository); a crash leaves its input in build-san/ and fails.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]    (targets: safetensors checkpoint npy token_file train_config tokenizer_bin llama2c calibration_cache run_folder)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(safetensors checkpoint npy token_file train_config tokenizer_bin llama2c calibration_cache run_folder)
if [[ -z "${XGRAD_FUZZ_BUILT:-}" ]]; then  # scripts/sanitize.sh has built them already
  source scripts/sanitize_config.sh
  xgrad_configure_san
  cmake --build build-san -j "$(nproc)" --target "${targets[@]/#/fuzz_}"
fi
run_target() {  # runs in a subshell that becomes the fuzzer; its output goes to build-san/fuzz_TARGET.log
  local t=$1
  cd build-san
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 exec \
    "./bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 "corpus/$t" "../tests/fuzz/corpus/$t" >"fuzz_$t.log" 2>&1
}
# The targets run nproc at a time (each fuzzer is one process on one core), each for SECONDS.
jobs=$(nproc)
pids=() names=()
finish() {  # waits for the oldest running target; reports it and stops on a finding
  local pid=${pids[0]} t=${names[0]} status=0
  pids=("${pids[@]:1}") names=("${names[@]:1}")
  wait "$pid" || status=$?
  if ((status != 0)); then
    tail -60 "build-san/fuzz_$t.log"
    echo "fuzz: $t FAILED with exit $status; log build-san/fuzz_$t.log, crashing input build-san/crash-*"
    kill "${pids[@]}" 2>/dev/null || true
    wait || true
    exit 1
  fi
  echo "fuzz: $t done"
  grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)|Done [0-9]+ runs" "build-san/fuzz_$t.log" || true
}
for t in "${targets[@]}"; do
  mkdir -p "build-san/corpus/$t"
  ((${#pids[@]} < jobs)) || finish
  echo "fuzz: $t for $seconds s"
  (run_target "$t") &
  pids+=($!) names+=("$t")
done
while ((${#pids[@]})); do finish; done
echo "fuzz: all targets ran without a finding"
