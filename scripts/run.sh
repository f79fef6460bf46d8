#!/usr/bin/env bash
# Main job: replay the GPT-2 allocation trace and find the smallest pool
# capacity it fits in. Builds the CLI quietly first (log shown on failure).
# Extra arguments go to `nofrag replay`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup-deps.sh --build
mkdir -p build
log=build/run-build.log
{
  # Configure only once; afterwards `cmake --build` re-runs configuration by
  # itself when needed, and we do not override options chosen by the user.
  if [ ! -f build/CMakeCache.txt ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  cmake --build build -j"$(nproc)" --target nofrag_cli
} >"$log" 2>&1 || { cat "$log" >&2; echo "run.sh: build failed (log: $log)" >&2; exit 1; }

exec ./build/nofrag replay data/gpt2.trace.gz --min-capacity "$@"
