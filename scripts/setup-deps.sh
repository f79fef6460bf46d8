#!/usr/bin/env bash
# Install the build and test dependencies on Debian 12 (bookworm) / Ubuntu.
# Idempotent: does nothing (not even `apt-get update`) when all are present.
# Called by scripts/run.sh (--build: what the library and CLI need),
# scripts/test.sh, scripts/test-install.sh and .ci/run (everything).
set -euo pipefail

BUILD_PACKAGES=(build-essential cmake zlib1g-dev)
PACKAGES=(
  build-essential # gcc 12 (+ libasan/libubsan/libtsan runtimes), make
  cmake           # >= 3.16 (bookworm: 3.25)
  libcmocka-dev   # unit-test framework
  zlib1g-dev      # gzip-compressed traces
  clang           # libFuzzer targets
  libclang-rt-dev # clang's sanitizer/libFuzzer runtimes (only "Recommended" by clang)
  valgrind
  python3
  python3-venv        # scripts/test-install.sh: a fresh venv for `pip install .`
  python3-setuptools  # pip install . offline (--no-build-isolation)
  python3-wheel
  python3-pip
  pkg-config          # scripts/test-install.sh: the example built with pkg-config
  tmux            # drives `nofrag top` in tests/test_top.sh (send-keys / capture-pane)
  chromium        # renders the --html report in tests/test_report.c (headless, under 1 s)
)

if [ "${1:-}" = "--build" ]; then PACKAGES=("${BUILD_PACKAGES[@]}"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all packages present"
  exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

echo "setup-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  -o Dpkg::Use-Pty=0 "${missing[@]}" >/dev/null
echo "setup-deps: done"
