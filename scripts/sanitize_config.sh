# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: configures build-san/, the one clang-14
# build with AddressSanitizer + UndefinedBehaviorSanitizer that serves both the sanitizer test
# suite and the libFuzzer targets (so nothing is compiled twice for them).
#   - Everything is instrumented with ASan, UBSan (no recovery) and libFuzzer's edge coverage
#     (inline 8-bit counters and the PC table: cheap enough for the test suite, and what
#     libFuzzer needs to see new paths in the library's loaders).
#   - The fuzz harnesses themselves get -fsanitize=fuzzer (tests/fuzz/CMakeLists.txt), and the
#     loaders they reach get comparison tracing too (XGRAD_BUILD_FUZZ in CMakeLists.txt), so
#     libFuzzer can match magic bytes and header fields without slowing the rest of the suite.
#   - UBSan includes float-cast-overflow (clang's -fsanitize=undefined has it, GCC's does not);
#     scripts/ubsan_ignorelist.txt leaves out only the conversions inside libstdc++'s copy loops
#     that xsimd's exp makes on -inf.
#   - -O1 with line tables only: stack traces name file and line; the build is faster than -O2 -g.
#   - No benchmarks (nothing runs them under a sanitizer).
# It is also CI's proof that the whole project (library, CLI, tests, examples) compiles with clang.
xgrad_configure_san() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
    -DXGRAD_BUILD_BENCH=OFF -DXGRAD_BUILD_FUZZ=ON "${launcher[@]}" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -fsanitize-coverage=inline-8bit-counters,pc-table -fsanitize-ignorelist=$(pwd)/scripts/ubsan_ignorelist.txt" \
    >/dev/null
}
