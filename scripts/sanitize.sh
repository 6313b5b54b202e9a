#!/usr/bin/env bash
# Builds everything with clang-14, AddressSanitizer + UndefinedBehaviorSanitizer (leak detection
# on) in build-san/ (scripts/sanitize_config.sh), optionally runs the libFuzzer targets from the
# same build (--fuzz SECONDS: scripts/fuzz.sh, SECONDS each), then runs the test suite there.
# The full default training run is left out: it is the same code as the short training tests
# and takes minutes under ASan (so does its 2-rank twin, distributed_heldout_default, which
# would pull it back in as a fixture); so are the kill, signal and memory tests (timing- and
# RSS-based: ASan's shadow memory and quarantine would swamp the memory bound), and the stress
# test that repeats every distributed refusal 10 times (a flakiness test of process teardown:
# distributed_usage runs each refusal once here), and distributed_kill (4 killed 2-rank jobs, each
# bound to end within 30 s: a timing test like the kill tests, 72 s of ASan time on 2 cores; the
# checkpoint and resume paths it ends in run here in distributed_resume). The robustness
# catalogue runs here against the ASan build. The downstream consumer test (an install and
# three consumer builds) is a packaging test, not a memory one: it runs in the Release suite only.
# The SentencePiece cross-check (thousands of lines through the xgrad program) compares
# encodings with Python's, not memory: the Release suite runs it, and so its llama2.c twin, the
# tokenizer export cross-check (6 minutes under ASan; the writer's unit tests, bytes, refusals
# and bad models, run here, and the llama2c tokenizer loader is fuzzed) and the PyTorch
# checkpoint cross-check (the same loaders run here through the catalogue and the unit tests);
# the tokenizer's own unit tests (random byte strings, every invalid UTF-8 form) run here.
# Usage: scripts/sanitize.sh [--fuzz SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=0
if [[ "${1:-}" == "--fuzz" ]]; then fuzz_seconds=${2:?--fuzz needs SECONDS}; fi
source scripts/sanitize_config.sh
xgrad_configure_san
cmake --build build-san -j "$(nproc)"
if ((fuzz_seconds > 0)); then
  XGRAD_FUZZ_BUILT=1 bash scripts/fuzz.sh "$fuzz_seconds"
fi
cd build-san
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$(nproc)" -E 'main_job_train_default|distributed_heldout_default|distributed_stress_refusals|distributed_kill|robustness_(kill|signals|memory)|downstream_consumer|sentencepiece_interop|llama2c_tokenizer_interop|tokenizer_export_interop|torch_checkpoint_interop'
