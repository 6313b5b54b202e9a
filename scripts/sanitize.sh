#!/usr/bin/env bash
# Builds everything with AddressSanitizer + UndefinedBehaviorSanitizer (leak detection on) in
# build-asan/ and runs the test suite there. The full default training run is left out: it is
# the same code as the short training tests and takes minutes under ASan (so does its 2-rank
# twin, distributed_heldout_default, which would pull it back in as a fixture); so are the kill,
# signal and memory tests (timing- and RSS-based: ASan's shadow memory and quarantine would
# swamp the memory bound). The robustness catalogue runs here against the ASan build. The
# downstream consumer test (an install and three consumer builds) is a packaging test, not a
# memory one: it runs in the Release suite only.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake --build build-asan -j "$(nproc)"
cd build-asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$(nproc)" -E 'main_job_train_default|distributed_heldout_default|robustness_(kill|signals|memory)|downstream_consumer'
