#!/usr/bin/env bash
# xgrad from a user's side (docs/install.md): install the build into a temporary prefix, then
# build and run tests/downstream/consumer.cpp three ways, and check what was installed.
#   1. find_package(xgrad VERSION REQUIRED COMPONENTS checks) from the prefix, no other hints
#   1b. the same with every MPI hidden: the engine and the checks must not need one; asking for
#      train then fails naming MPI (a static build with MPI)
#   2. pkg-config --cflags --libs xgrad, a plain compiler command
#   3. FetchContent from the source tree, with only the engine's packages visible (CLI11 and
#      nlohmann_json hidden), shared libraries; that build is installed again and consumed
#      with find_package, so the shared, engine-only package is checked too.
# Usage: run.sh SOURCE_DIR BUILD_DIR WORK_DIR VERSION
set -euo pipefail
src=$1 build=$2 work=$3 version=$4
jobs=$(nproc)
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
step() { echo; echo "== $*"; }
fail() { echo "downstream: $*" >&2; exit 1; }

step "install into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log"
for f in include/xgrad/xgrad.hpp include/xgrad/xtensor.hpp include/xgrad/version.hpp include/xgrad/core/tensor.hpp \
         include/xgrad/nn/attention.hpp include/xgrad/checks/suite.hpp include/xgrad/train/trainer.hpp \
         lib/cmake/xgrad/xgradConfig.cmake lib/cmake/xgrad/xgradConfigVersion.cmake lib/pkgconfig/xgrad.pc \
         lib/libxgrad.a bin/xgrad share/xgrad/tools/xgrad_torch.py; do
  [[ -e "$prefix/$f" ]] || fail "the install has no $f"
done
# Only namespaced headers, none of the internal ones, and xtensor only in the optional
# xgrad/xtensor.hpp (a consumer that does not include it never needs xtensor).
[[ -z "$(ls "$prefix/include" | grep -v '^xgrad$')" ]] || fail "un-namespaced entries in include/: $(ls "$prefix/include")"
# Internal is a folder: nothing under a subfolder of a layer (detail/, train/tasks/) is installed.
internal=$(cd "$prefix/include/xgrad" && find . -mindepth 3 -name '*.hpp' | sort)
[[ -z "$internal" ]] || fail "internal headers were installed: $internal"
# The headers renamed in 0.3 still exist under their old names for one release (deprecated).
for old in nn/convert.hpp nn/attention_reference.hpp; do
  [[ -e "$prefix/include/xgrad/$old" ]] || fail "the deprecated header $old is missing"
done
if grep -rn --exclude=xtensor.hpp '#include <xtensor' "$prefix/include"; then fail "a public header other than xgrad/xtensor.hpp includes xtensor"; fi
grep -q '#include <xtensor' "$prefix/include/xgrad/xtensor.hpp" || fail "xgrad/xtensor.hpp does not include xtensor"
"$prefix/bin/xgrad" --version | grep -qx "xgrad $version" || fail "xgrad --version does not say 'xgrad $version'"

step "1. find_package"
cmake -S "$src/tests/downstream" -B "$work/package" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
      -DCONSUMER_MODE=package -DCONSUMER_EXPECT_VERSION="$version" >"$work/package.log"
cmake --build "$work/package" -j "$jobs" >>"$work/package.log" || { tail -30 "$work/package.log"; fail "find_package build failed"; }
"$work/package/consumer"
[[ -x "$work/package/consumer_xtensor" ]] || fail "the consumer of <xgrad/xtensor.hpp> was not built (xtensor not found?)"
"$work/package/consumer_xtensor"
# A version the package does not satisfy is refused.
if cmake -S "$src/tests/downstream" -B "$work/too-new" -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_MODE=package \
         -DCONSUMER_EXPECT_VERSION=99.0 >"$work/too-new.log" 2>&1; then
  fail "find_package(xgrad 99.0) succeeded"
fi
grep -q 'compatible with requested version "99.0"' <(tr -s ' \n' ' ' <"$work/too-new.log") || fail "find_package(xgrad 99.0) failed for another reason"

step "1b. find_package without MPI: the engine and the checks need none"
# xgrad::train of a static build with MPI links MPI; a consumer of the engine alone must not
# need one (CMAKE_DISABLE_FIND_PACKAGE_MPI hides every MPI from find_package). The installed
# headers are the ones step 1 compiled one by one, so they are not compiled again here.
cmake -S "$src/tests/downstream" -B "$work/no-mpi" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
      -DCONSUMER_MODE=package -DCONSUMER_EXPECT_VERSION="$version" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON \
      -DCONSUMER_CHECK_HEADERS=OFF >"$work/no-mpi.log" 2>&1 || { tail -30 "$work/no-mpi.log"; fail "find_package(xgrad) without MPI failed"; }
cmake --build "$work/no-mpi" -j "$jobs" >>"$work/no-mpi.log" || { tail -30 "$work/no-mpi.log"; fail "the build without MPI failed"; }
"$work/no-mpi/consumer"
if grep -q '^XGRAD_WITH_MPI:BOOL=ON' "$build/CMakeCache.txt" && grep -q '^BUILD_SHARED_LIBS:BOOL=ON' "$build/CMakeCache.txt"; then
  :  # a shared xgrad::train carries no link dependency on MPI: nothing more to refuse
elif grep -q '^XGRAD_WITH_MPI:BOOL=ON' "$build/CMakeCache.txt"; then
  # Asking for train without an MPI is refused, naming what is missing.
  if cmake -S "$src/tests/downstream" -B "$work/no-mpi-train" -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_MODE=package \
           -DCONSUMER_NEED_TRAIN=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON >"$work/no-mpi-train.log" 2>&1; then
    fail "find_package(xgrad COMPONENTS train) succeeded without MPI"
  fi
  grep -q 'needs an MPI for C++' <(tr -s ' \n' ' ' <"$work/no-mpi-train.log") \
    || { tail -20 "$work/no-mpi-train.log"; fail "find_package(xgrad COMPONENTS train) without MPI failed for another reason"; }
  # With MPI, train is found as before.
  cmake -S "$src/tests/downstream" -B "$work/train" -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_MODE=package \
        -DCONSUMER_NEED_TRAIN=ON >"$work/train.log" 2>&1 || { tail -20 "$work/train.log"; fail "find_package(xgrad COMPONENTS train) failed"; }
fi

step "2. pkg-config"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[[ "$(pkg-config --modversion xgrad)" == "$version" ]] || fail "pkg-config --modversion xgrad is not $version"
flags=$(pkg-config --cflags --libs xgrad)
echo "pkg-config: $flags"
c++ -std=c++17 -O1 -DCONSUMER_WITH_CHECKS -DEXPECTED_VERSION="\"$version\"" "$src/tests/downstream/consumer.cpp" \
    -o "$work/consumer-pc" $flags
"$work/consumer-pc"

step "3. FetchContent, engine only"
# 3a. xgrad's defaults as a subproject, with only the engine's packages visible and no build
#     type: tests, examples, CLI, train, benchmarks and install rules off; checks off without CLI11;
#     the parent's (empty) build type left alone. Configure only.
hide=(-DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON)
launcher=${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER}
cmake -S "$src/tests/downstream" -B "$work/sub-defaults" -DCONSUMER_MODE=subdirectory -DXGRAD_SOURCE_DIR="$src" \
      -DCONSUMER_CHECK_DEFAULTS=ON -DCONSUMER_PARENT_BUILD_TYPE= "${hide[@]}" >"$work/sub-defaults.log" \
  || { tail -20 "$work/sub-defaults.log"; fail "the subproject's defaults are wrong"; }
grep -q '^XGRAD_BUILD_CHECKS:BOOL=OFF' "$work/sub-defaults/CMakeCache.txt" || fail "checks were not turned off without CLI11"
grep -q '^XGRAD_BUILD_TRAIN:BOOL=OFF' "$work/sub-defaults/CMakeCache.txt" || fail "train was built by default in a subproject"
# 3b. The same, built as shared libraries and run; its install rules switched on, so the
#     shared engine-only package is installed and consumed with find_package as well.
#     No build type (so no optimisation): this step checks that a shared build links and runs,
#     and the engine compiles faster at -O0 than at -O2 (this is the suite's slowest test).
cmake -S "$src/tests/downstream" -B "$work/sub" -DCMAKE_BUILD_TYPE= -DCONSUMER_MODE=subdirectory \
      -DXGRAD_SOURCE_DIR="$src" -DBUILD_SHARED_LIBS=ON -DXGRAD_NATIVE=OFF -DXGRAD_INSTALL=ON "${hide[@]}" \
      $launcher >"$work/sub.log"
cmake --build "$work/sub" -j "$jobs" >>"$work/sub.log" || { tail -30 "$work/sub.log"; fail "subproject build failed"; }
"$work/sub/consumer"
ls "$work/sub/_deps/xgrad-build"/libxgrad.so* >/dev/null || fail "BUILD_SHARED_LIBS=ON built no libxgrad.so"
cmake --install "$work/sub" --prefix "$work/prefix-shared" >/dev/null
[[ ! -e "$work/prefix-shared/include/xgrad/checks" ]] || fail "an engine-only install has checks/ headers"
ls "$work/prefix-shared/lib"/libxgrad.so* >/dev/null || fail "no libxgrad.so installed"

step "4. find_package of the shared engine-only install"
cmake -S "$src/tests/downstream" -B "$work/package-shared" -DCMAKE_PREFIX_PATH="$work/prefix-shared" \
      -DCMAKE_BUILD_TYPE=Release -DCONSUMER_MODE=package -DCONSUMER_NEED_CHECKS=OFF \
      -DCONSUMER_EXPECT_VERSION="$version" >"$work/package-shared.log"
cmake --build "$work/package-shared" -j "$jobs" >>"$work/package-shared.log" \
  || { tail -30 "$work/package-shared.log"; fail "find_package build (shared) failed"; }
"$work/package-shared/consumer"
# A component the engine-only package lacks is refused by name.
if cmake -S "$src/tests/downstream" -B "$work/no-checks" -DCMAKE_PREFIX_PATH="$work/prefix-shared" \
         -DCONSUMER_MODE=package >"$work/no-checks.log" 2>&1; then
  fail "find_package(xgrad COMPONENTS checks) succeeded on an install without checks"
fi
echo "downstream: all ways passed"
