#!/usr/bin/env bash
# Install missing dependencies (Debian packages, as root or with sudo), build
# (RelWithDebInfo) and run the whole test suite under ctest.
# Extra arguments go to ctest, e.g. `./scripts/test.sh -R config`.
# Exit code is ctest's.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-deps.sh
. scripts/build-dir.sh
fresh_build_dir build # a copied checkout's build/ belongs to the original tree
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNF_TESTS=ON
cmake --build build -j"$(nproc)"
set +e
ctest --test-dir build --output-on-failure --no-tests=error -j2 "$@"
rc=$?
set -e
exit "$rc"
