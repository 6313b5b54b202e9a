#!/usr/bin/env bash
# Installs the Debian 12 packages xgrad needs, only those missing. Needs root (or sudo).
# Usage: scripts/setup.sh [--test]
# The build needs pkgconf to find libsentencepiece-dev (SentencePiece tokenizers, optional in
# CMake: XGRAD_WITH_SENTENCEPIECE; the downstream consumer test, tests/downstream, uses it too).
# libjs-dygraphs is the plotting library xgrad report inlines into its pages (docs/cli.md).
#   --test also installs python3-torch, the reference for tests/torch (the PyTorch cross-check),
#   python3-numpy (tests/interop: .npy/.npz written and read by NumPy), python3-sentencepiece
#   (tests/interop: the tokenizers against Python's SentencePiece), clang with libFuzzer
#   (scripts/fuzz.sh, docs/reliability.md) and doxygen (the API reference, which the test suite
#   builds and checks: docs_api_reference) and chromium (headless: tests/cli/check_report.py
#   loads xgrad report's pages in it).
set -euo pipefail

packages=(cmake g++ make xtensor-dev xtl-dev libxsimd-dev libopenblas-dev catch2
          libcli11-dev nlohmann-json3-dev gnuplot-nox libopenmpi-dev openmpi-bin libsentencepiece-dev
          pkgconf libjs-dygraphs libdnnl-dev)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(python3-torch python3-numpy python3-sentencepiece clang-14 libclang-rt-14-dev doxygen chromium)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "setup: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
