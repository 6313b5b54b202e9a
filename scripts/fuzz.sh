#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer + UBSan) in build-fuzz/ and runs
# each for SECONDS (default 60) from the seed corpus in tests/fuzz/corpus/. New inputs go to
# build-fuzz/corpus/ (not the repository); a crash leaves its input in build-fuzz/ and fails.
# The build is also CI's proof that the library compiles with clang.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]    (targets: safetensors checkpoint npy)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(safetensors checkpoint npy)
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
  -DXGRAD_BUILD_TESTS=OFF -DXGRAD_BUILD_FUZZ=ON "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
  >/dev/null
# The library, the check suite and the CLI too, so every library source compiles with clang.
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/#/fuzz_}" xgrad_checks xgrad_cli
run_target() {  # the fuzzer's output goes to build-fuzz/fuzz_TARGET.log
  local t=$1
  cd build-fuzz
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
    "./bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 "corpus/$t" "../tests/fuzz/corpus/$t" >"fuzz_$t.log" 2>&1
}
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  echo "fuzz: $t for $seconds s"
  status=0
  (run_target "$t") || status=$?
  if ((status != 0)); then
    tail -60 "build-fuzz/fuzz_$t.log"
    echo "fuzz: $t FAILED with exit $status; log build-fuzz/fuzz_$t.log, crashing input build-fuzz/crash-*"
    exit 1
  fi
  grep -E "^stat::(number_of_executed_units|new_units_added|peak_rss_mb)|Done [0-9]+ runs" "build-fuzz/fuzz_$t.log" || true
done
echo "fuzz: all targets ran without a finding"
