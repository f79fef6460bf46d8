#!/usr/bin/env bash
# Build (RelWithDebInfo) and run the whole test suite under ctest.
# Extra arguments go to ctest, e.g. `./scripts/test.sh -R config`.
# Installs nothing: run ./scripts/setup-deps.sh first. Exit code is ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j"$(nproc)"
set +e
ctest --test-dir build --output-on-failure -j2 "$@"
rc=$?
set -e
exit "$rc"
